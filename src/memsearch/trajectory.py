"""The trajectory contract: what an episode records and what every reader of it may rely on
(docs/design.md §3, "Trajectories").

A trajectory is one JSON object per task (a line of ``trajectories.jsonl``, or the value
``engine.episode.run_episode`` returns). Its ``events`` list holds, in order, one dict per thing
that happened, told apart by ``type`` (an ``EventKind``):

- ``policy_call``: one call of a policy role (``role`` in ``CALL_ROLES``): messages, text, token
  ids, log-probs, usage, ``finish_reason``, ``context_truncated`` (the server's context cut the
  completion: "length" below the requested ``max_tokens``; counted per task in
  ``counts.context_truncated_calls``), and the engine's judgement of the action: ``valid`` (``True``,
  ``False``, or ``None`` when the request failed and there was no action to judge),
  ``invalid_reason`` (prose for a person; never parsed) and ``invalid_cause`` (an
  ``InvalidCause`` code, ``None`` when valid: what code reads);
- ``memory``: what the memory did with the call's output (``valid``, ``reason``, ``cause``,
  ``executed``, ``before``, ``after``, ...);
- ``search``: one search (query, the ids shown, an ``error`` when the service failed);
- ``chunk``: one chunk of a long context read (stream mode).

Invalid causes. A rejected memory batch can break several rules at once; its cause is the first
of them in ``InvalidCause``'s order (the enum is written in precedence order, so a batch that
overflows the budget *and* cites an unshown source is an overflow, as the GRPO loss mask needs).
``CAUSES`` is the one table of how each cause is counted: the op histogram's bucket
(``train.decisions``) and the held-out summary's group (``pipelines.memory_policy.heldout``).

Versions. ``ENGINE_VERSION`` names the record format (also in every eval run's
``summary.json``); each trajectory carries it as ``engine_version`` from engine-6 on.
Trajectories written by earlier engines carry no cause codes: ``upgrade`` derives them from the
reason wording of those engines (the only code that reads a reason); ``read_trajectories``
applies it to every line it reads and ``events_of`` / ``policy_calls`` to what they are given,
so readers see one format (a saved rollout of an older run replays as it trained).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, get_args

from memsearch.io import iter_jsonl

# engine-2: trajectories record answer_format (what the reader was asked for; eval.score reads it).
# engine-3: a call whose request failed is not judged (valid None) and not an invalid action.
# engine-4: a search the retrieval service failed to answer is a request error (search event "error").
# engine-5: memory_sources holds the ids of faithful items only (memory.faithfulness), memory_cited all
# cited ids; an item cites at most agent.memory_max_sources ids (schema mode: memory-ops-v2-sources<n>).
# engine-6: causes as codes (policy_call "invalid_cause", memory "cause"); trajectories carry engine_version.
# engine-7: policy_call "context_truncated", counts "context_truncated_calls" (absent before: read as False / 0).
ENGINE_VERSION = "engine-7"

# The role of one policy call. What a trainer trains is ``train.rows.TrainedRole`` (one trained
# role may cover several call roles).
Role = Literal["memory", "controller", "reader"]
CALL_ROLES: tuple[Role, ...] = get_args(Role)


class EventKind(StrEnum):
    """The ``type`` of a trajectory event (module doc). A ``StrEnum``: it equals its JSON string."""

    POLICY_CALL = "policy_call"
    MEMORY = "memory"
    SEARCH = "search"
    CHUNK = "chunk"


class InvalidCause(StrEnum):
    """Why an action was invalid (or, ``REQUEST_FAILED``, why there was none), in precedence order."""

    PARSE = "parse"  # not readable as an action (memory ops, a controller decision, an answer)
    OVER_BUDGET = "over_budget"  # the memory after the batch would overflow its token budget
    UNSHOWN_SOURCE = "unshown_source"  # cites an evidence id the agent was never shown
    NOT_EVIDENCE_ID = "not_evidence_id"  # a source that is not 'doc_id:sentence_index'
    TOO_MANY_SOURCES = "too_many_sources"  # an item citing more than agent.memory_max_sources ids
    NO_SOURCE = "no_source"  # a fact citing nothing
    EMPTY_BATCH = "empty_batch"  # a batch with no op (a NOOP says "change nothing")
    EMPTY_TEXT = "empty_text"  # an item's text, or a rewritten memory, is empty
    UNKNOWN_ID = "unknown_id"  # UPDATE / DELETE of an item that does not exist
    NOOP_NOT_ALONE = "noop_not_alone"  # NOOP in a batch of several ops
    OTHER = "other"  # a reason an engine before engine-6 wrote that ``upgrade`` does not recognise
    REQUEST_FAILED = "request_failed"  # the request failed: no action (valid None), never counted as invalid


_ORDER = {cause: i for i, cause in enumerate(InvalidCause)}


def first_cause(causes: Iterable[InvalidCause]) -> InvalidCause | None:
    """The cause of an action that broke several rules: the first in ``InvalidCause``'s order."""
    return min(causes, key=_ORDER.__getitem__, default=None)


@dataclass(frozen=True)
class CauseGroups:
    """How one cause is counted where invalid calls are summarised."""

    histogram: Literal["invalid_parse", "invalid_budget", "invalid_rule"]  # train.decisions.op_histogram
    heldout: Literal["over_budget", "unshown_source", "other"]  # heldout memory_calls (plus "truncated")


_RULE = CauseGroups("invalid_rule", "other")
CAUSES: dict[InvalidCause, CauseGroups] = {
    InvalidCause.PARSE: CauseGroups("invalid_parse", "other"),
    InvalidCause.OVER_BUDGET: CauseGroups("invalid_budget", "over_budget"),
    InvalidCause.UNSHOWN_SOURCE: CauseGroups("invalid_rule", "unshown_source"),
    **{cause: _RULE for cause in InvalidCause if cause not in
       (InvalidCause.PARSE, InvalidCause.OVER_BUDGET, InvalidCause.UNSHOWN_SOURCE)},
}


def call_cause(event: dict[str, Any]) -> InvalidCause | None:
    """The ``InvalidCause`` of a judged policy call (``None`` when it was valid or not judged)."""
    cause = event.get("invalid_cause")
    return None if cause is None else InvalidCause(cause)


def events_of(trajectory: dict[str, Any], kind: EventKind) -> list[dict[str, Any]]:
    """The trajectory's events of one kind, in order, in the current record format (``upgrade``)."""
    return [e for e in upgrade(trajectory).get("events", []) if e.get("type") == kind]


def policy_calls(trajectory: dict[str, Any], roles: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The trajectory's policy calls, in order; of ``roles`` only when given."""
    wanted = None if roles is None else set(roles)
    return [e for e in events_of(trajectory, EventKind.POLICY_CALL) if wanted is None or e.get("role") in wanted]


# The wording of engines before engine-6, the first matching marker by precedence; only
# ``upgrade`` reads it. A controller's or reader's invalid action was always unreadable text.
_LEGACY_MARKERS: dict[InvalidCause, str] = {
    InvalidCause.PARSE: "parse error",
    InvalidCause.OVER_BUDGET: "over the budget",
    InvalidCause.UNSHOWN_SOURCE: "was not shown",
    InvalidCause.NOT_EVIDENCE_ID: "is not an evidence id",
    InvalidCause.TOO_MANY_SOURCES: "distinct sources, over the cap",
    InvalidCause.NO_SOURCE: "must cite at least one source",
    InvalidCause.EMPTY_BATCH: "empty batch",
    InvalidCause.EMPTY_TEXT: "empty",
    InvalidCause.UNKNOWN_ID: "does not exist",
    InvalidCause.NOOP_NOT_ALONE: "NOOP must stand alone",
    InvalidCause.REQUEST_FAILED: "request failed",
}


def legacy_cause(reason: str | None, role: str | None = "memory") -> InvalidCause:
    """The cause an engine before engine-6 meant by ``reason`` (its wording, module doc)."""
    text = reason or ""
    if text.startswith("request failed"):
        return InvalidCause.REQUEST_FAILED
    if role in ("controller", "reader"):
        return InvalidCause.PARSE
    if text.startswith("parse error"):
        return InvalidCause.PARSE
    found = [cause for cause, marker in _LEGACY_MARKERS.items() if cause is not InvalidCause.PARSE and marker in text]
    return first_cause(found) or InvalidCause.OTHER


def upgrade(trajectory: dict[str, Any]) -> dict[str, Any]:
    """The trajectory in the current record format (module doc): a record of engine-6 or later
    is returned as it is; an older one gets its cause codes from its reasons, in place."""
    events = trajectory.get("events")
    if trajectory.get("engine_version") is not None or not isinstance(events, list):
        return trajectory  # current, or malformed: left for the reader's own validation to name
    for event in events:
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == EventKind.POLICY_CALL and "invalid_cause" not in event:
            # Judged invalid, or a failed request (valid None with its reason): a cause; else none.
            failed = event.get("valid") is False or (event.get("valid") is None and event.get("invalid_reason"))
            event["invalid_cause"] = legacy_cause(event.get("invalid_reason"), event.get("role")) if failed else None
        elif kind == EventKind.MEMORY and "cause" not in event:
            event["cause"] = None if event.get("valid") else legacy_cause(event.get("reason"))
    return trajectory


def read_trajectories(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, trajectory)`` for every line of a ``trajectories.jsonl``, upgraded to the
    current record format (``io.iter_jsonl`` says how a bad line is reported)."""
    for lineno, trajectory in iter_jsonl(path):
        yield lineno, upgrade(trajectory) if isinstance(trajectory, dict) else trajectory
