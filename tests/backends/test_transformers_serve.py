"""The openai backend against `transformers serve` (a real OpenAI-compatible server running the
embedded model on loopback): the same eval as the local `hf` backend gives the same kind of
records; the served identity is checked; the server ignores ``response_format`` (detected); a
prompt past the context is a failed task (exit 3), never a silent answer; a server restart is
bridged by the retries.

What this server does that the backend must not trust: a request for another model is a 400
(it is pinned), but ``response_format`` is dropped with a log line and an unconstrained 200, and
a prompt past the model's 8192 positions (9231 tokens tried) is answered 200 with garbage."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from tests.support.processes import generate_and_close
from typer.testing import CliRunner

from memsearch.backends.base import GenerationRequest, SamplingParams
from memsearch.backends.openai import OpenAIBackend
from memsearch.cli.app import EXIT_INCOMPLETE, app
from memsearch.config import load_config
from memsearch.errors import InputError
from memsearch.eval.runner import run_eval
from memsearch.io import iter_jsonl
from memsearch.memory.action_format import memory_ops_constraint

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["limit=2", "budgets.max_searches=1", "budgets.evidence_tokens=96", "budgets.policy_tokens=48",
         "budgets.answer_tokens=16", "budgets.memory_tokens=96", "concurrency=2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """`transformers serve` on the embedded model: ``url`` (the API root), ``folder`` (the served
    model name), ``restart()`` (killed and started again on the same port)."""

    def __init__(self) -> None:
        from memsearch.assets.embedded import model_dir

        self.folder = str(model_dir())
        self.exe = shutil.which("transformers", path=str(Path(sys.executable).parent))
        if self.exe is None:
            pytest.fail("the `transformers` CLI is missing: `uv sync` installs transformers[serving] in the dev group")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.proc = self._start()

    def _start(self) -> subprocess.Popen:
        proc = subprocess.Popen([self.exe, "serve", self.folder, "--host", "127.0.0.1", "--port", str(self.port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2)
                return proc
            except OSError:
                if proc.poll() is not None:
                    pytest.fail("transformers serve exited during start-up")
                time.sleep(0.5)
        proc.kill()
        pytest.fail("transformers serve did not answer /health within 180 s")

    def restart(self) -> None:
        self.stop()
        self.proc = self._start()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def served_model():
    served = Served()
    try:
        yield served
    finally:
        served.stop()


def _calls(run: Path) -> list[dict]:
    return [e for _, t in iter_jsonl(run / "trajectories.jsonl") for e in t["events"] if e["type"] == "policy_call"]


@pytest.mark.slow
def test_openai_backend_on_transformers_serve_matches_hf_records(served_model, hotpot_dev_dir, tmp_path):
    url, folder = served_model.url, served_model.folder
    demo = ROOT / "configs" / "demo.toml"
    api = [f'backends.{r}.{k}="{v}"' for r in ("memory", "controller", "reader")
           for k, v in (("kind", "openai"), ("base_url", url), ("model", folder))]
    served = run_eval(load_config(demo, SMALL + api), hotpot_dev_dir, tmp_path / "served", show_progress=False)
    local = run_eval(load_config(demo, SMALL), hotpot_dev_dir, tmp_path / "local", show_progress=False)
    for summary in (served, local):
        assert summary.complete and summary.request_errors == 0
        assert summary.tokenizer == "hf:embedded:SmolLM2-135M-Instruct"
    assert served.backends["reader"] == "openai" and local.backends["reader"] == "hf"
    served_calls, local_calls = _calls(tmp_path / "served"), _calls(tmp_path / "local")
    # Same episodes, same roles in the same order, same record fields.
    assert [(c["role"], c["step"]) for c in served_calls] == [(c["role"], c["step"]) for c in local_calls]
    assert all(set(a) == set(b) for a, b in zip(served_calls, local_calls))
    # Both report usage from the model side (the server's counts; our exact token counts).
    assert all(c["usage"]["source"] == "reported" for c in served_calls + local_calls)
    # What differs, by design: the local backend returns the raw completion token ids and
    # per-token log-probs; this server returns text only.
    assert all(c["completion_ids"] and c["logprobs"] for c in local_calls)
    assert all(c["completion_ids"] is None for c in served_calls)


def _backend(served: Served, **kw) -> OpenAIBackend:
    return OpenAIBackend(served.url, kw.pop("model", served.folder), timeout_s=kw.pop("timeout_s", 120), **kw)




def _hello(i: int, **kw) -> GenerationRequest:
    return GenerationRequest(role="memory", messages=({"role": "user", "content": f"Say hello number {i}."},),
                             sampling=SamplingParams(max_tokens=48), **kw)


@pytest.mark.slow
def test_the_served_identity_is_checked_and_recorded(served_model):
    backend = _backend(served_model)
    identity = asyncio.run(backend.check_model())
    assert identity["verified"] is True
    assert (identity["entry"]["id"], identity["entry"]["owned_by"]) == (served_model.folder, "local")
    with pytest.raises(InputError, match=f"model 'no-such-model' is not served at {served_model.url}: its /models "
                                         f"lists '{served_model.folder}'"):
        asyncio.run(_backend(served_model, model="no-such-model").check_model())


@pytest.mark.slow
def test_transformers_serve_ignores_response_format_and_is_stopped(served_model):
    """Read as an unknown engine (its /models names the model's organisation), it is sent the
    OpenAI form and answers free text under a 200: each answer is a failed request, and after
    three every request fails unsent, naming the form. Named as what it is, schema mode is
    refused before the first request."""
    backend = _backend(served_model, max_concurrency=1)
    results = generate_and_close(backend, [_hello(i, constraint=memory_ops_constraint(3)) for i in range(4)])
    assert not any(r.ok for r in results)
    assert "breaks its response_format schema constraint" in results[0].error
    assert results[2].error.startswith(f"the server at {served_model.url} (other) ignored the response_format "
                                       "schema constraint: its first 3 constrained answers are not allowed")
    assert results[3].attempts == 0 and "ignored the response_format" in results[3].error  # not sent
    stats = backend.stats()
    assert stats["schema_ignored"] == 3 and stats["sent"]["requests_with"] == {"response_format": 3}
    assert stats["completion_ids"] == "unavailable" and stats["sent"]["requests"] == 3
    named = _backend(served_model, engine="transformers", schema_mode=True)
    with pytest.raises(InputError, match="the transformers server constrains no output"):
        asyncio.run(named.check_model())


@pytest.mark.slow
def test_a_prompt_past_the_context_is_a_failed_task_and_exit_3(served_model, hotpot_dev_dir, tmp_path):
    """With a context of 64 tokens every prompt is past it: the server answers 200 (it checks no
    context), memsearch fails the call without retrying it, the task fails, the CLI exits 3."""
    out = tmp_path / "run"
    sets = [*SMALL[1:], "limit=1"]
    sets += [f"backends.{r}.{k}" for r in ("memory", "controller", "reader")
             for k in (f'base_url="{served_model.url}"', f"model={json.dumps(served_model.folder)}",
                       "context_tokens=64")]
    args = ["eval", "run", "--config", ROOT / "configs" / "api.toml", "--data", hotpot_dev_dir, "--out", out]
    result = CliRunner().invoke(app, [str(a) for a in args] + [a for s in sets for a in ("--set", s)])
    assert result.exit_code == EXIT_INCOMPLETE, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["tasks"]["failed"] == 1 and summary["metrics"]["em"] == 0
    calls = _calls(out)
    assert calls and all("past the server's context" in c["error"] and c["attempts"] == 1 for c in calls)
    (stats,) = summary["backend_stats"]
    assert stats["stats"]["errors"] == {"past_context": len(calls)} and stats["stats"]["retries"] == 0


@pytest.mark.slow
def test_a_server_restart_is_bridged_by_the_retries(served_model):
    """The server is killed and started again (~10-30 s here) while a request waits to retry."""
    thread = threading.Thread(target=served_model.restart)
    served_model.stop()  # down now; restart() stops the dead process again, harmlessly
    thread.start()
    try:
        backend = _backend(served_model, max_retries=40, retry_window_s=170, backoff_base_s=0.5, backoff_max_s=4)
        [result] = generate_and_close(backend, [_hello(0)])
    finally:
        thread.join()
    assert result.ok and result.usage.source == "reported", result.error
    stats = backend.stats()
    assert stats["errors"]["connection"] >= 3 and stats["retries"] == result.attempts - 1
