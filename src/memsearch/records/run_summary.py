"""An eval run's ``summary.json`` (``eval.runner.run_eval``) and a matrix group's line of
``matrix.json``, as typed records read by attribute (docs/design.md §3, §6).

``RunSummary.from_json`` reads summaries of every version: a field an older summary lacks is
``None`` (``caveats``, ``timing``, ``context_truncated``, ...), keys this version does not know are
kept in ``extra``. ``to_json`` writes back what was read: a summary written through the record is
the summary written before it (tested on real runs), and an earlier one keeps its form. The nested
tables nobody reads field by field (``config``, ``budgets``, ``software``, ...) stay JSON mappings:
they are records of their own kinds (``config.run.RunConfig`` dumps, package versions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from memsearch.errors import InputError


@dataclass(frozen=True)
class TaskCounts:
    """How many tasks a run expected, scored and lost."""

    expected: int  # tasks in the data (after ``limit``)
    scored: int  # tasks with a metrics row (ok or failed)
    failed: int  # of those, failed (request errors, a crash): 0 on every answer metric
    failed_ids: tuple[str, ...] = ()  # the first 50 failed task ids
    retried: int | None = None  # tasks whose scored attempt followed failed ones (None: older summaries)
    failed_attempts: int | None = None  # the failed attempts before them (kept in failed_attempts.jsonl)

    def to_json(self) -> dict[str, Any]:
        out = {"expected": self.expected, "scored": self.scored, "failed": self.failed,
               "failed_ids": list(self.failed_ids)}
        return out | {k: v for k, v in (("retried", self.retried), ("failed_attempts", self.failed_attempts))
                      if v is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TaskCounts:
        return cls(int(data["expected"]), int(data["scored"]), int(data["failed"]),
                   tuple(data.get("failed_ids") or ()), data.get("retried"), data.get("failed_attempts"))


@dataclass(frozen=True)
class MemoryBackendIdentity:
    """Which backend wrote a run's memory (matrix groups A/C the baseline, B/D the trained policy)."""

    kind: str  # the backend kind ("rules", "hf", "openai", ...)
    model: str | None = None  # its model ("embedded", a folder, a served name); the flat form's for others
    adapter: str | None = None  # a LoRA adapter folder
    base_url: str | None = None  # a served model's address
    name: str | None = None  # the backend's own name of itself
    served_identity: Mapping[str, Any] | None = None  # the server's /models entry
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version does not know (``weights``)
    # Fields the summary it was read from lacked (written before they were recorded): left out again.
    absent: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in _IDENTITY_FIELDS if name not in self.absent}
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryBackendIdentity:
        return cls(**{k: v for k, v in data.items() if k in _IDENTITY_FIELDS},
                   extra={k: v for k, v in data.items() if k not in _IDENTITY_FIELDS},
                   absent=frozenset(_IDENTITY_FIELDS) - data.keys())

    @property
    def label(self) -> str:
        """Short name: ``rules``, ``hf:<model folder name>``, ``@host:port`` of a served model (two
        servers may serve the same model name), ``/q4`` for the hf kind's 4-bit weights,
        ``+<adapter folder name>`` when an adapter is loaded."""
        from urllib.parse import urlsplit

        if self.kind in ("rules", "oracle"):
            return self.kind
        label = f"{self.kind}:{Path(str(self.model)).name}"
        if self.base_url:
            label += "@" + urlsplit(self.base_url).netloc
        label += f"/{self.extra['weights']}" if self.extra.get("weights") else ""  # recorded only off float32
        return label + (f"+{Path(self.adapter).name}" if self.adapter else "")


_IDENTITY_FIELDS = ("kind", "model", "adapter", "base_url", "name", "served_identity")


@dataclass(frozen=True)
class MatrixGroup:
    """One group's line of ``matrix.json``: what the comparison table reads."""

    agent: Mapping[str, Any]  # the run config's [agent] (memory, controller, ...)
    memory_backend: MemoryBackendIdentity
    metrics: Mapping[str, float | None]  # mean of each registered metric
    complete: bool
    usable_for_comparison: bool
    request_errors: int
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"agent": dict(self.agent), "memory_backend": self.memory_backend.to_json(),
                "metrics": dict(self.metrics), "complete": self.complete,
                "usable_for_comparison": self.usable_for_comparison, "request_errors": self.request_errors,
                "note": self.note}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MatrixGroup:
        return cls(data["agent"], MemoryBackendIdentity.from_json(data["memory_backend"]), data["metrics"],
                   data["complete"], data["usable_for_comparison"], data["request_errors"], data.get("note"))


@dataclass(frozen=True)
class RunSummary:
    """One eval run's result and what it was (module doc; docs/design.md §6 says what each means)."""

    complete: bool  # every task scored and none failed
    usable_for_comparison: bool  # complete, no request error, no completion cut by the server's context
    tasks: TaskCounts
    request_errors: int  # failed requests over every task
    note: str | None = None  # why a run is not a result, or what it did not read ("INCOMPLETE: ...", ...)
    evaluator_version: str | None = None  # the scoring code's version
    truncation: Mapping[str, Any] = field(default_factory=dict)  # chunk-limit cuts and memory truncations
    context_truncated: Mapping[str, Any] | None = None  # calls the server's context cut short, by role
    caveats: tuple[str, ...] | None = None  # what the numbers are not (eval.caveats); None: older summaries
    metrics: Mapping[str, float | None] = field(default_factory=dict)  # mean of each registered metric
    metric_counts: Mapping[str, int] = field(default_factory=dict)  # tasks in each mean
    denominators: Mapping[str, str] = field(default_factory=dict)  # what each mean is over, in words
    memory_ops: Mapping[str, int] = field(default_factory=dict)  # executed memory ops (``ops_<OP>``)
    tokens: Mapping[str, int] = field(default_factory=dict)  # tokens by role, reported and estimated apart
    entailment_evaluated: bool = False
    config: Mapping[str, Any] | None = None  # the resolved run config (``RunConfig`` dump)
    group: str = ""  # the matrix group or run name
    tokenizer: str | None = None
    engine_version: str | None = None  # the trajectory format ("engine-7") (records.trajectory)
    prompt_version: str | None = None
    budgets: Mapping[str, Any] | None = None
    agent: Mapping[str, Any] | None = None
    sampling: Mapping[str, Any] | None = None  # per call role
    backends: Mapping[str, str] | None = None  # per call role, the backend's name
    memory_backend: MemoryBackendIdentity | None = None
    served: Mapping[str, Any] | None = None  # per role answered by a served model, its /models entry
    memsearch_source: Any = None  # the commit (and dirty flag) or installed version that ran
    backend_stats: tuple[Mapping[str, Any], ...] | None = None  # this invocation's requests per backend
    data_build: Mapping[str, Any] | None = None  # how a derived set (RULER-HQA docs{N}) was built
    data: Mapping[str, Any] | None = None  # the data's fingerprint
    software: Mapping[str, Any] | None = None  # package versions
    timing: Mapping[str, Any] | None = None  # this invocation's seconds
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version does not know

    @property
    def memory_truncations(self) -> int | None:
        """Memory items cut to fit the budget over every task (``None``: not recorded)."""
        return self.truncation.get("memory_truncations")

    def with_timing(self, timing: Mapping[str, Any]) -> RunSummary:
        return replace(self, timing=dict(timing))

    def group_entry(self) -> MatrixGroup:
        """This run's line of ``matrix.json``."""
        if self.agent is None or self.memory_backend is None:
            raise ValueError("a summary without agent and memory_backend (written before them) makes no matrix line")
        return MatrixGroup(self.agent, self.memory_backend, self.metrics, self.complete, self.usable_for_comparison,
                           self.request_errors, self.note)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra":
                continue
            if f.name in _WRITTEN_WHEN_SET and value is None:
                continue  # absent from the summary it was read from
            out[f.name] = _jsonable(value)
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunSummary:
        if not isinstance(data, Mapping) or not isinstance(data.get("tasks"), Mapping):
            raise ValueError("not an eval run summary: expected a JSON object with a 'tasks' table")
        known = {f.name for f in fields(cls)} - {"extra"}
        values = {k: v for k, v in data.items() if k in known}
        values["tasks"] = TaskCounts.from_json(data["tasks"])
        if isinstance(data.get("memory_backend"), Mapping):
            values["memory_backend"] = MemoryBackendIdentity.from_json(data["memory_backend"])
        for name in ("caveats", "backend_stats"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        return cls(**values, extra={k: v for k, v in data.items() if k not in known})

    @classmethod
    def read(cls, path: str | Path) -> RunSummary:
        """A ``summary.json``; a missing, damaged or foreign file raises ``InputError`` naming it."""
        import json

        try:
            return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise InputError(f"{path}: missing; expected a finished eval run's summary.json") from None
        except (KeyError, TypeError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            raise InputError(f"{path}: not an eval run summary ({exc})") from None


# Fields every summary since they existed holds: one read as None was absent, and is left out again.
_WRITTEN_WHEN_SET = frozenset({"context_truncated", "caveats", "served", "memsearch_source", "backend_stats",
                               "data_build", "timing"})


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value
