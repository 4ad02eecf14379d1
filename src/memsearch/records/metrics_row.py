"""One line of an eval run's ``metrics.jsonl``: a task's scores and its episode's counts, as a
typed record (docs/design.md §3, §6). ``eval.score.score_trajectory`` makes it; the summary, the
paired comparisons and the report read it.

The line is flat, as it always was: the registered metrics (``eval.metrics.register_metric``)
sit beside the counts under their own names, the executed memory ops as ``ops_<OP>`` and the
token counts as ``<role>_prompt_tokens`` / ``estimated_<role>_completion_tokens``. The record
keeps these apart (``scores``, ``ops``, ``tokens``); ``column(name)`` reads any of them by the
name the line uses, which is how a metric chosen by name (``--metric f1``) is read.
``from_json`` reads lines of every version (a count an older line lacks takes its default; a
metric it lacks is absent from ``scores``); ``to_json`` writes a line of this version back byte for
byte, and an older one with every key it had, plus the counts it lacked at their defaults.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

OPS_PREFIX = "ops_"
TOKENS_SUFFIX = "_tokens"


@dataclass(frozen=True)
class MetricsRow:
    """One task's line of ``metrics.jsonl`` (module doc)."""

    task_id: str
    status: str  # "ok", or "error": a failed task scores 0 on every answer metric
    prediction: str | None = None  # the reader's parsed answer
    answers: tuple[str, ...] = ()  # the gold answers
    answer_format: str = "free"  # "boxed": em / f1 / sub_em scored the box
    scores: Mapping[str, float | None] = field(default_factory=dict)  # the registered metrics, by name
    invalid_citations: int = 0  # cited ids never shown
    searches: int = 0
    chunks: int = 0  # context chunks read (streaming agents)
    chunks_cut: int = 0  # chunks never read because of max_chunks
    truncated_by_chunk_limit: bool = False
    memory_truncations: int = 0  # memory items cut to fit the budget
    policy_calls: int = 0
    invalid_actions: int = 0
    invalid_action_rate: float | None = None  # over the calls that returned a completion
    request_errors: int = 0
    context_truncated_calls: int = 0  # completions the server's context cut short
    context_truncated_by_role: Mapping[str, int] = field(default_factory=dict)
    attempt: int = 1  # 1 + the task's failed attempts before this one
    latency_s: float | None = None  # None: a task that failed without an episode
    ops: Mapping[str, int] = field(default_factory=dict)  # executed memory ops (written ops_<OP>)
    tokens: Mapping[str, int] = field(default_factory=dict)  # by role, reported and estimated apart
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version does not know

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def column(self, name: str) -> Any:
        """The value the line holds under ``name`` (a metric, a count, ``ops_ADD``, a token
        count); ``None`` when it holds none."""
        if name in self.scores:
            return self.scores[name]
        if name in _FIELDS:
            return getattr(self, name)
        if name.startswith(OPS_PREFIX):
            return self.ops.get(name.removeprefix(OPS_PREFIX))
        return self.tokens.get(name, self.extra.get(name))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task_id": self.task_id, "status": self.status, "prediction": self.prediction,
                               "answers": list(self.answers), "answer_format": self.answer_format, **self.scores}
        out.update({name: dict(value) if isinstance(value := getattr(self, name), Mapping) else value
                    for name in _COUNT_FIELDS})
        out.update({OPS_PREFIX + op: n for op, n in self.ops.items()})
        return {**out, **self.tokens, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MetricsRow:
        if not isinstance(data, Mapping) or not isinstance(data.get("task_id"), str):
            raise ValueError("not a metrics row: expected a JSON object with a string 'task_id'")
        known = {k: v for k, v in data.items() if k in _FIELDS}
        rest = {k: v for k, v in data.items() if k not in _FIELDS}
        ops = {k.removeprefix(OPS_PREFIX): v for k, v in rest.items() if k.startswith(OPS_PREFIX)}
        tokens = {k: v for k, v in rest.items() if k.endswith(TOKENS_SUFFIX) and not k.startswith(OPS_PREFIX)}
        scores = {k: v for k, v in rest.items() if k not in tokens and not k.startswith(OPS_PREFIX) and _score(v)}
        extra = {k: v for k, v in rest.items() if k not in tokens and k not in scores and not k.startswith(OPS_PREFIX)}
        known["answers"] = tuple(known.get("answers") or ())
        known.setdefault("status", "error")  # as eval reads a line without one
        return cls(**known, scores=scores, ops=ops, tokens=tokens, extra=extra)


def _score(value: Any) -> bool:
    """Whether a value of an unnamed key is a metric's: a number or None (not a bool)."""
    return value is None or (isinstance(value, numbers.Real) and not isinstance(value, bool))


_FIELDS = frozenset(f.name for f in fields(MetricsRow)) - {"scores", "ops", "tokens", "extra"}
# The counts a line holds after the metrics, in the order it writes them.
_COUNT_FIELDS = ("invalid_citations", "searches", "chunks", "chunks_cut", "truncated_by_chunk_limit",
                 "memory_truncations", "policy_calls", "invalid_actions", "invalid_action_rate", "request_errors",
                 "context_truncated_calls", "context_truncated_by_role", "attempt", "latency_s")


def read_metrics(path: str | Path) -> list[MetricsRow]:
    """Every line of a ``metrics.jsonl`` (``.gz`` too); a bad line is named (``records.lines``)."""
    from memsearch.records.lines import read_lines

    return read_lines(path, MetricsRow.from_json)
