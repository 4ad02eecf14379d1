"""Real components for testing and benchmarking pipelines without a model (servers, not mocks).

A public, supported part of the package, shipped in the wheel on purpose: a researcher who adds a
backend, a controller or a fault-handling path tests it against a real local HTTP server, the
way memsearch's own tests and ``bench/eval_throughput.py`` do.

- ``agent_server``: an OpenAI-compatible HTTP server on 127.0.0.1 that answers memsearch's
  prompts with valid actions after a fixed delay, with seeded, reproducible faults
  (``AgentServer``; ``python -m memsearch.testing.agent_server --port 8011``).
- ``scripted_server``: a stand-in for verl's LLM server client that answers with real token ids
  (``ScriptedServer``), for tests of the verl agent loop.

The headless-Chromium driver for the report's page is not here: it checks memsearch's own HTML
report, only the repository's tests and benchmark use it, so it lives in ``tests/support``.
"""
