"""The typed records that cross memsearch's layers, each written and read through its own
``to_json`` / ``from_json`` (docs/design.md §3):

- ``records.trajectory``: ``Trajectory`` (one episode) and ``records.events`` (its events);
- ``records.causes``: why an action was invalid, as codes;
- ``records.observation``: ``Observation``, what a policy backend gets beside its prompt;
- ``records.train_step``: ``TrainStep``, one line of a GRPO training log;
- ``records.run_summary``: ``RunSummary``, an eval run's ``summary.json``, and ``MatrixGroup``, a
  group's line of ``matrix.json``.
- ``records.metrics_row``: ``MetricsRow``, one line of an eval run's ``metrics.jsonl``;
- ``records.lines``: ``read_lines``, a JSON-lines file of one record type, a bad line named.
"""
