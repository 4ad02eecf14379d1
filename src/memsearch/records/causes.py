"""Why an action was invalid, as codes (docs/design.md §3, "Trajectories").

A rejected memory batch can break several rules at once; its cause is the first of them in
``InvalidCause``'s order (the enum is written in precedence order, so a batch that overflows the
budget *and* cites an unshown source is an overflow, as the GRPO loss mask needs). ``CAUSES`` is
the one table of how each cause is counted in the op histogram (``train.grpo.decisions``).

Trajectories written before engine-6 carry reasons in words, no codes: ``legacy_cause`` maps that
wording to a code (the only code that reads a reason; ``records.trajectory.upgrade`` applies it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


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
    OTHER = "other"  # a reason an engine before engine-6 wrote that ``legacy_cause`` does not recognise
    REQUEST_FAILED = "request_failed"  # the request failed: no action (valid None), never counted as invalid


_ORDER = {cause: i for i, cause in enumerate(InvalidCause)}


def first_cause(causes: Iterable[InvalidCause]) -> InvalidCause | None:
    """The cause of an action that broke several rules: the first in ``InvalidCause``'s order."""
    return min(causes, key=_ORDER.__getitem__, default=None)


@dataclass(frozen=True)
class CauseGroups:
    """How one cause is counted where invalid calls are summarised."""

    histogram: Literal["invalid_parse", "invalid_budget", "invalid_rule"]  # train.grpo.decisions.op_histogram


_RULE = CauseGroups("invalid_rule")
CAUSES: dict[InvalidCause, CauseGroups] = {
    InvalidCause.PARSE: CauseGroups("invalid_parse"),
    InvalidCause.OVER_BUDGET: CauseGroups("invalid_budget"),
    **{cause: _RULE for cause in InvalidCause if cause not in (InvalidCause.PARSE, InvalidCause.OVER_BUDGET)},
}


# The wording of engines before engine-6, the first matching marker by precedence; only
# ``legacy_cause`` reads it. A controller's or reader's invalid action was always unreadable text.
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
