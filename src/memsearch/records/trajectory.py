"""The trajectory: what an episode records and what every reader of it may rely on
(docs/design.md §3, "Trajectories").

A trajectory is one JSON object per task (a line of ``trajectories.jsonl``); in memory it is a
``Trajectory``, built by the engine (``engine.episode.run_episode``) and read by attribute
everywhere. ``events`` holds, in order, one record per thing that happened (``records.events``):
policy calls, memory updates, searches, chunks. ``to_json`` / ``from_json`` are the one way to and
from a file; ``read_trajectories`` reads a ``trajectories.jsonl``.

Each fact is stored once: the ops a memory call executed are its ``MemoryEvent.executed``;
``Trajectory.memory_ops`` sums them, and ``to_json`` writes the copies files have always held
(``counts.memory_ops``, the memory call's ``action``), so files read as before.

Versions. ``ENGINE_VERSION`` names the record format (also in every eval run's ``summary.json``);
each trajectory carries it as ``engine_version`` from engine-6 on. Older records carry no cause
codes: ``upgrade`` derives them from the reason wording of those engines
(``records.causes.legacy_cause``) before a record is built, so readers see one format.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, get_args

from memsearch.io import iter_jsonl
from memsearch.records.causes import legacy_cause
from memsearch.records.events import (
    ChunkEvent,
    Event,
    EventKind,
    MemoryEvent,
    PolicyCall,
    SearchEvent,
    event_from_json,
)

# engine-2: trajectories record answer_format (what the reader was asked for; eval.score reads it).
# engine-3: a call whose request failed is not judged (valid None) and not an invalid action.
# engine-4: a search the retrieval service failed to answer is a request error (search event "error").
# engine-5: memory_sources holds the ids of faithful items only (memory.faithfulness), memory_cited all
# cited ids; an item cites at most agent.memory_max_sources ids (schema mode: the ops constraint's sources cap).
# engine-6: causes as codes (policy_call "invalid_cause", memory "cause"); trajectories carry engine_version.
# engine-7: policy_call "context_truncated", counts "context_truncated_calls" (absent before: read as False / 0).
ENGINE_VERSION = "engine-7"

# The role of one policy call. What a trainer trains is ``train.rows.TrainedRole`` (one trained
# role may cover several call roles).
Role = Literal["memory", "controller", "reader"]
CALL_ROLES: tuple[Role, ...] = get_args(Role)


@dataclass(frozen=True)
class Counts:
    """What the engine counted in one episode (the executed ops: ``Trajectory.memory_ops``)."""

    searches: int = 0  # searches made
    chunks: int = 0  # chunks read (stream mode)
    chunks_cut: int = 0  # chunks of the context past max_chunks, never read
    evidence_cut_sentences: int = 0  # sentences cut from shown evidence to fit evidence_tokens
    memory_truncations: int = 0  # rewritten memories cut to their budget
    policy_calls: int = 0  # policy calls of every role
    invalid_actions: int = 0  # judged invalid (a failed request is not one)
    request_errors: int = 0  # calls and searches whose request failed
    context_truncated_calls: int = 0  # completions the server's context cut short
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version does not know

    _ORDER = ("searches", "chunks", "chunks_cut", "evidence_cut_sentences", "memory_truncations", "policy_calls",
              "invalid_actions", "request_errors", "context_truncated_calls")

    def to_json(self, memory_ops: Mapping[str, int]) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in self._ORDER}
        return {**out, "memory_ops": dict(memory_ops), **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Counts:
        data = data or {}
        return cls(**{k: v for k, v in data.items() if k in cls._ORDER},
                   extra={k: v for k, v in data.items() if k not in cls._ORDER and k != "memory_ops"})


@dataclass(frozen=True)
class Trajectory:
    """One episode of one task, or a task that failed before it had one (``error`` set, no events)."""

    task_id: str  # the task (labels are joined by it after the episode; the engine never sees them)
    question: str | None = None  # the question asked
    run_label: str = ""  # the matrix group or run name that ran it (written as "group"; no GRPO group)
    engine_version: str | None = None  # the record format (None: before engine-6, or a failed task)
    prediction: str | None = None  # the reader's answer (None: none readable)
    reader_text: str | None = None  # the reader's whole completion
    answer_format: str = "free"  # "boxed": the reader was asked for \boxed{} and scoring reads the box
    citations: tuple[str, ...] = ()  # evidence ids the answer cites
    invalid_citations: tuple[str, ...] = ()  # of those, ids never shown
    shown_evidence: tuple[str, ...] = ()  # every evidence id shown, in order
    memory_final: str = ""  # the final memory as the reader saw it
    memory_sources: tuple[str, ...] = ()  # ids cited by faithful items of the final memory (memory.faithfulness)
    memory_cited: tuple[str, ...] = ()  # every id the final memory cites
    counts: Counts = field(default_factory=Counts)  # the engine's counts
    latency_s: float = 0.0  # wall time of the episode
    status: str = "ok"  # "ok", or "error" when a request failed or the task failed
    events: tuple[Event, ...] = ()  # what happened, in order
    error: str | None = None  # a task that failed without an episode: why
    attempt: int | None = None  # eval: 1 + the task's earlier failed attempts (None: not recorded)
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version does not know

    @classmethod
    def failed(cls, task_id: str, question: str | None, run_label: str, error: str,
               attempt: int | None = None) -> Trajectory:
        """A task that failed without an episode (a crash, an unwritable trajectory): scored 0."""
        return cls(task_id=task_id, question=question, run_label=run_label, status="error", error=error,
                   attempt=attempt)

    # ------------------------------------------------------------------------------- reading
    def policy_calls(self, roles: Iterable[str] | None = None) -> list[PolicyCall]:
        """The policy calls, in order; of ``roles`` only when given."""
        wanted = None if roles is None else set(roles)
        return [e for e in self.events if isinstance(e, PolicyCall) and (wanted is None or e.role in wanted)]

    @property
    def memory_events(self) -> list[MemoryEvent]:
        return [e for e in self.events if isinstance(e, MemoryEvent)]

    @property
    def searches(self) -> list[SearchEvent]:
        return [e for e in self.events if isinstance(e, SearchEvent)]

    @property
    def chunks(self) -> list[ChunkEvent]:
        return [e for e in self.events if isinstance(e, ChunkEvent)]

    @cached_property
    def _memory_by_step(self) -> dict[int, MemoryEvent]:
        return {e.step: e for e in self.memory_events}

    def memory_outcome(self, call: PolicyCall) -> MemoryEvent | None:
        """What the memory did with a memory call's output (its step's ``MemoryEvent``)."""
        return self._memory_by_step.get(call.step) if call.role == "memory" else None

    def executed(self, call: PolicyCall) -> dict[str, int]:
        """The ops a memory call executed, by name (empty for other roles)."""
        outcome = self.memory_outcome(call)
        return dict(outcome.executed) if outcome else {}

    @property
    def memory_ops(self) -> dict[str, int]:
        """The ops executed over the episode, by name (summed over its memory events)."""
        total: dict[str, int] = {}
        for event in self.memory_events:
            for name, n in event.executed.items():
                total[name] = total.get(name, 0) + n
        return total

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def ran(self) -> bool:
        """Whether the task had an episode: ``False`` for one that failed without (``failed``),
        whose line holds no latency, counts or answer."""
        return self.error is None or bool(self.events)

    # ---------------------------------------------------------------------------- JSON
    def to_json(self) -> dict[str, Any]:
        """The trajectory as a ``trajectories.jsonl`` line holds it."""
        attempt = {} if self.attempt is None else {"attempt": self.attempt}
        if self.error is not None and not self.events:
            return {"task_id": self.task_id, "group": self.run_label, "question": self.question,
                    "prediction": self.prediction, "status": self.status, "error": self.error, "counts": {},
                    "events": [], **attempt, **self.extra}
        version = {} if self.engine_version is None else {"engine_version": self.engine_version}
        events = [e.to_json(self.memory_outcome(e)) if isinstance(e, PolicyCall) else e.to_json()
                  for e in self.events]
        return {
            "task_id": self.task_id, **version, "group": self.run_label, "question": self.question,
            "prediction": self.prediction, "reader_text": self.reader_text, "answer_format": self.answer_format,
            "citations": list(self.citations), "invalid_citations": list(self.invalid_citations),
            "shown_evidence": list(self.shown_evidence), "memory_final": self.memory_final,
            "memory_sources": list(self.memory_sources), "memory_cited": list(self.memory_cited),
            "counts": self.counts.to_json(self.memory_ops), "latency_s": self.latency_s, "status": self.status,
            "events": events, **({"error": self.error} if self.error is not None else {}), **attempt, **self.extra,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Trajectory:
        """The record of one trajectory dict, of any engine version (``upgrade``); ``ValueError``
        when it is not a trajectory (no task id, an event of no known type)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("task_id"), str):
            raise ValueError("not a trajectory: expected a JSON object with a string 'task_id'")
        data = upgrade(dict(data))
        data = {("run_label" if k == "group" else k): v for k, v in data.items()}  # the file's name of it
        names = set(cls.__dataclass_fields__) - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        known.setdefault("status", "error")  # a line without a status is no finished episode (as eval reads it)
        for name in ("citations", "invalid_citations", "shown_evidence", "memory_sources", "memory_cited"):
            known[name] = tuple(known.get(name) or ())
        known["counts"] = Counts.from_json(known.get("counts"))
        known["events"] = tuple(event_from_json(e) for e in data.get("events") or ())
        if known.get("memory_final") is None:
            known["memory_final"] = ""
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})


def upgrade(trajectory: dict[str, Any]) -> dict[str, Any]:
    """The trajectory dict in the current record format (module doc): a record of engine-6 or
    later is returned as it is; an older one gets its cause codes from its reasons, its memory
    events their ops from their calls where they lack them, and one before engine-5 its
    ``memory_cited`` (then ``memory_sources`` held every cited id), in place."""
    if trajectory.get("engine_version") is not None:
        return trajectory
    if "memory_cited" not in trajectory and "memory_sources" in trajectory:
        trajectory["memory_cited"] = trajectory["memory_sources"]
    events = trajectory.get("events")
    if not isinstance(events, list):
        return trajectory
    # A memory event without its ops (the record's one copy): its call's action held them.
    call_ops = {e.get("step"): ((e.get("action") or {}).get("memory") or {}).get("executed")
                for e in events if isinstance(e, dict) and e.get("type") == EventKind.POLICY_CALL
                and e.get("role") == "memory"}
    for event in events:
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == EventKind.MEMORY and "executed" not in event and call_ops.get(event.get("step")):
            event["executed"] = call_ops[event.get("step")]
        if kind == EventKind.POLICY_CALL and "invalid_cause" not in event:
            # Judged invalid, or a failed request (valid None with its reason): a cause; else none.
            failed = event.get("valid") is False or (event.get("valid") is None and event.get("invalid_reason"))
            event["invalid_cause"] = legacy_cause(event.get("invalid_reason"), event.get("role")) if failed else None
        elif kind == EventKind.MEMORY and "cause" not in event:
            event["cause"] = None if event.get("valid") else legacy_cause(event.get("reason"))
    return trajectory


def read_trajectories(path: str | Path) -> Iterator[tuple[int, Trajectory]]:
    """``(line number, trajectory)`` for every line of a ``trajectories.jsonl``, of any engine
    version; a line that is not a trajectory raises ``ValueError`` naming the file and line
    (``io.iter_jsonl`` says how a line that is not JSON is reported)."""
    for lineno, data in iter_jsonl(path):
        try:
            yield lineno, Trajectory.from_json(data)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}:{lineno}: {exc}") from None
