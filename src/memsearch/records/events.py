"""The events of a trajectory, one frozen record per kind (docs/design.md §3, "Trajectories").

Each record is written and read through its own ``to_json`` / ``from_json``; ``EVENT_TYPES`` maps
a JSON ``type`` to its record. Reading is lenient about what older engines left out (a field an
older record lacks takes its documented default) and keeps what it does not know in ``extra``, so
a record read and written again loses nothing. Writing emits the keys in the order the engine has
always written them, so files stay as they were.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar

from memsearch.records.causes import InvalidCause


class EventKind(StrEnum):
    """The ``type`` of a trajectory event. A ``StrEnum``: it equals its JSON string."""

    POLICY_CALL = "policy_call"
    MEMORY = "memory"
    SEARCH = "search"
    CHUNK = "chunk"


def _tuple(value: Sequence[Any] | None) -> tuple[Any, ...] | None:
    return None if value is None else tuple(value)


def _list(value: Sequence[Any] | None) -> list[Any] | None:
    return None if value is None else list(value)


def _cause(value: str | None) -> InvalidCause | None:
    return None if value is None else InvalidCause(value)


def _known(cls: type, data: Mapping[str, Any], skip: tuple[str, ...] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """``data`` split into the fields ``cls`` declares and the rest (``extra``)."""
    names = {f.name for f in fields(cls)} - {"extra"}
    known = {k: v for k, v in data.items() if k in names}
    extra = {k: v for k, v in data.items() if k not in names and k not in skip}
    return known, extra


@dataclass(frozen=True)
class CallUsage:
    """Token usage of one policy call, as the trajectory records it."""

    # "reported" by the service; else memsearch's tokenizer counted them and this is the backend's
    # word: "estimated", or "none" (rules and oracle backends, which report nothing).
    source: str = "estimated"
    prompt_tokens: int | None = None  # tokens of the prompt (None when not known)
    completion_tokens: int | None = None  # tokens of the completion

    def to_json(self) -> dict[str, Any]:
        if self.source == "reported":
            return {"source": self.source, "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.completion_tokens}
        return {"source": self.source, "estimated_prompt_tokens": self.prompt_tokens,
                "estimated_completion_tokens": self.completion_tokens}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> CallUsage:
        data = data or {}
        source = data.get("source", "estimated")
        if source == "reported":
            return cls(source, data.get("prompt_tokens"), data.get("completion_tokens"))
        return cls(source, data.get("estimated_prompt_tokens"), data.get("estimated_completion_tokens"))


@dataclass(frozen=True)
class BranchOutcome:
    """One of the completions drawn at a branched memory call (``engine.branching``) and what
    applying it to a copy of the memory did. The fields from ``reasons`` on are absent (None)
    when the request failed."""

    text: str | None = None  # the completion
    error: str | None = None  # why the request failed (None: it was answered)
    completion_ids: tuple[int, ...] | None = None  # its token ids (None when the backend gives none)
    logprobs: tuple[float, ...] | None = None  # the sampler's log-prob of each completion token
    constraint_id: str | None = None  # the schema constraint it was sampled under
    status: str = "request_error"  # "applied", "rejected", "parse_error" or "request_error"
    reasons: tuple[str, ...] | None = None  # why the copy rejected it (prose)
    cause: InvalidCause | None = None  # the code of the first rule broken
    executed: Mapping[str, int] | None = None  # ops applied to the copy, by name
    over_budget_tokens: int | None = None  # tokens the rejected batch would have gone over the budget
    budget_tokens: int | None = None  # the memory's token budget
    kept: tuple[str, ...] | None = None  # ids cited by faithful items after it (memory.faithfulness)
    cited: tuple[str, ...] | None = None  # every id cited after it
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version does not know

    _ALWAYS: ClassVar[tuple[str, ...]] = ("text", "error", "completion_ids", "logprobs", "constraint_id", "status")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text, "error": self.error, "completion_ids": _list(self.completion_ids),
                               "logprobs": _list(self.logprobs), "constraint_id": self.constraint_id,
                               "status": self.status}
        if self.reasons is not None:
            out.update(reasons=list(self.reasons), cause=self.cause,
                       executed=dict(self.executed or {}), over_budget_tokens=self.over_budget_tokens,
                       budget_tokens=self.budget_tokens, kept=_list(self.kept), cited=_list(self.cited))
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BranchOutcome:
        known, extra = _known(cls, data)
        for name in ("completion_ids", "logprobs", "reasons", "kept", "cited"):
            if name in known:
                known[name] = _tuple(known[name])
        if "cause" in known:
            known["cause"] = _cause(known["cause"])
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class PolicyCall:
    """One call of a policy role and the engine's judgement of its action.

    A memory call's outcome (the ops executed, the cut) is its step's ``MemoryEvent``, not stored
    here; ``Trajectory.to_json`` writes it into ``action`` as files have always held it."""

    role: str  # "memory", "controller" or "reader" (records.trajectory.CALL_ROLES)
    step: int  # the search or chunk index (the reader: 0)
    messages: tuple[Mapping[str, str], ...] = ()  # the chat prompt
    text: str = ""  # the completion
    completion_ids: tuple[int, ...] | None = None  # its token ids, when the backend gives them
    logprobs: tuple[float, ...] | None = None  # the sampler's log-prob of each completion token (asked roles only)
    prompt_ids: tuple[int, ...] | None = None  # the prompt's token ids, when the backend gives them
    finish_reason: str | None = None  # "stop", "length", ... as the backend reported
    # The server's context cut the completion ("length" below the requested max_tokens).
    context_truncated: bool = False
    usage: CallUsage = field(default_factory=CallUsage)  # tokens, reported or estimated
    latency_s: float = 0.0  # wall time of the call
    attempts: int = 1  # requests made (retries included)
    error: str | None = None  # why the request failed after its retries (None: answered)
    constraint_id: str | None = None  # schema mode: the constraint whose masks training replays
    budget_left: int | None = None  # memory calls: the memory's budget left (tokens) when the call was made
    branches: tuple[BranchOutcome, ...] | None = None  # branched memory calls (engine.branching)
    branch_chosen: int | None = None  # the branch the episode continued from
    kept_before: tuple[str, ...] | None = None  # faithful cited ids before the call (branched calls)
    cited_before: tuple[str, ...] | None = None  # every cited id before the call (branched calls)
    # The parsed action: a controller's decision, a reader's answer; a memory call's is its MemoryEvent.
    action: Mapping[str, Any] | None = None
    valid: bool | None = None  # the judgement: None when the request failed (no action to judge)
    invalid_reason: str | None = None  # prose for a person; never parsed
    invalid_cause: InvalidCause | None = None  # what code reads (None when valid)
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version does not know

    kind: ClassVar[EventKind] = EventKind.POLICY_CALL

    def to_json(self, memory: MemoryEvent | None = None) -> dict[str, Any]:
        """The event as the file holds it; ``memory``: this memory call's outcome (its ``action``)."""
        out: dict[str, Any] = {
            "type": self.kind, "role": self.role, "step": self.step, "messages": [dict(m) for m in self.messages],
            "text": self.text, "completion_ids": _list(self.completion_ids), "logprobs": _list(self.logprobs),
            "prompt_ids": _list(self.prompt_ids), "finish_reason": self.finish_reason,
            "context_truncated": self.context_truncated, "usage": self.usage.to_json(), "latency_s": self.latency_s,
            "attempts": self.attempts, "error": self.error, "constraint_id": self.constraint_id,
        }
        if self.budget_left is not None:  # absent from calls made before it was recorded
            out["budget_left"] = self.budget_left
        if self.branches is not None:
            out.update(branches=[b.to_json() for b in self.branches], branch_chosen=self.branch_chosen,
                       kept_before=_list(self.kept_before), cited_before=_list(self.cited_before))
        action = self.action
        if self.role == "memory":
            action = {"memory": {"executed": dict(memory.executed) if memory else {},
                                 "truncated": memory.truncated if memory else False}}
        out.update(action=action, valid=self.valid, invalid_reason=self.invalid_reason,
                   invalid_cause=self.invalid_cause)
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PolicyCall:
        known, extra = _known(cls, data, skip=("type",))
        for name in ("completion_ids", "logprobs", "prompt_ids", "kept_before", "cited_before"):
            if name in known:
                known[name] = _tuple(known[name])
        known["messages"] = tuple(known.get("messages") or ())
        known["usage"] = CallUsage.from_json(known.get("usage"))
        if known.get("branches") is not None:
            known["branches"] = tuple(BranchOutcome.from_json(b) for b in known["branches"])
        if known.get("role") == "memory":
            known["action"] = None  # the step's MemoryEvent holds it
        known["invalid_cause"] = _cause(known.get("invalid_cause"))
        known.setdefault("role", "memory")
        known.setdefault("step", 0)
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class MemoryEvent:
    """What the memory did with one memory call's output (its step's ``PolicyCall``)."""

    step: int  # the memory call's step
    valid: bool = False  # the batch (or rewrite) was applied
    reason: str | None = None  # why not (prose)
    cause: InvalidCause | None = None  # why not (code)
    executed: Mapping[str, int] = field(default_factory=dict)  # ops applied, by name: the one record of them
    before: str | None = None  # the memory rendered before the call (None: the request failed)
    after: str | None = None  # and after
    truncated: bool = False  # a rewritten memory was cut to its budget
    # Decision memory: every id the store cited when the call was made (rendered or not).
    sources_before: tuple[str, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version does not know

    kind: ClassVar[EventKind] = EventKind.MEMORY

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind, "step": self.step, "valid": self.valid, "reason": self.reason,
                               "cause": self.cause, "executed": dict(self.executed)}
        if self.before is not None:
            out.update(before=self.before, after=self.after)
        out["truncated"] = self.truncated
        if self.sources_before is not None:
            out["sources_before"] = list(self.sources_before)
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryEvent:
        known, extra = _known(cls, data, skip=("type",))
        known["cause"] = _cause(known.get("cause"))
        known["executed"] = dict(known.get("executed") or {})
        if known.get("sources_before") is not None:
            known["sources_before"] = tuple(known["sources_before"])
        known.setdefault("step", 0)
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class SearchEvent:
    """One search and what it showed."""

    step: int  # the search index
    query: str = ""  # the query sent
    doc_ids: tuple[str, ...] = ()  # documents shown
    shown: tuple[str, ...] = ()  # evidence ids shown ("doc_id:sentence_index")
    evidence_tokens: int = 0  # tokens of the evidence text
    cut_sentences: int = 0  # sentences cut to fit evidence_tokens
    error: str | None = None  # the retrieval service failed after its retries (nothing shown)
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version does not know

    kind: ClassVar[EventKind] = EventKind.SEARCH

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind, "step": self.step, "query": self.query,
                               "doc_ids": list(self.doc_ids), "shown": list(self.shown),
                               "evidence_tokens": self.evidence_tokens, "cut_sentences": self.cut_sentences}
        if self.error is not None:
            out["error"] = self.error
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SearchEvent:
        known, extra = _known(cls, data, skip=("type",))
        for name in ("doc_ids", "shown"):
            known[name] = tuple(known.get(name) or ())
        known.setdefault("step", 0)
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class ChunkEvent:
    """One chunk of a long context read (stream mode)."""

    step: int  # the chunk index
    tokens: int = 0  # its tokens
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version does not know

    kind: ClassVar[EventKind] = EventKind.CHUNK

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind, "step": self.step, "tokens": self.tokens, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChunkEvent:
        known, extra = _known(cls, data, skip=("type",))
        known.setdefault("step", 0)
        return cls(**known, extra=extra)


Event = PolicyCall | MemoryEvent | SearchEvent | ChunkEvent
EVENT_TYPES: dict[str, type[PolicyCall] | type[MemoryEvent] | type[SearchEvent] | type[ChunkEvent]] = {
    EventKind.POLICY_CALL: PolicyCall, EventKind.MEMORY: MemoryEvent,
    EventKind.SEARCH: SearchEvent, EventKind.CHUNK: ChunkEvent,
}


def event_from_json(data: Mapping[str, Any]) -> Event:
    """The record of one event dict (``ValueError`` naming the type when it is not an event's)."""
    kind = data.get("type") if isinstance(data, Mapping) else None
    if kind not in EVENT_TYPES:
        raise ValueError(f"not a trajectory event: type {kind!r} (expected one of {', '.join(EVENT_TYPES)})")
    return EVENT_TYPES[kind].from_json(data)
