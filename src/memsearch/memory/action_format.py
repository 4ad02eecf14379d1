"""The memory action format as constraints: what a schema-mode memory call may output, by id.

A schema-mode memory call (docs/design.md §5, §7) is sampled under a ``Constraint``; its id is all
a training row stores, so the update rebuilds the constraint from the id (``constraint_by_id``)
and replays the masks the decoder applied. Ids and schemas are therefore part of the records: a
schema may never change under an existing id (tests/memory/test_action_format.py pins them).

Ids
    ``memory-ops-v1``: the text format's whole decision, any number of ops, uncapped sources.
    ``memory-ops-v2-sources<n>``: the same, each item citing at most ``n`` sources
    (``memory_ops_constraint``; ``MEMORY_OPS`` is the default cap ``config.MEMORY_MAX_SOURCES``).
    ``memory-extract-v1:<json>``: one op of the extractive format, built per call from the
    episode's state (``memory.extractive_constraint``).

Enforcing a constraint is a backend's business (``backends.hf.constraint`` compiles one to token
masks; an OpenAI-compatible server is sent the schema); this module only says what is allowed.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from memsearch.config import MEMORY_MAX_SOURCES
from memsearch.memory.extractive_constraint import EXTRACT_PREFIX, extractive_constraint_by_id
from memsearch.text.constraint import Constraint

_ID_TEXT = {"type": "string", "minLength": 1}
_KIND = {"enum": ["fact", "open"]}


def _op(name: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": {"op": {"const": name}, **props},
            "required": ["op", *required], "additionalProperties": False}


def memory_ops_schema(max_sources: int | None) -> dict[str, Any]:
    """Decision-mode output (docs/design.md §5), each item citing at most ``max_sources``
    sources (``maxItems``; ``None``: unbounded, the v1 schema). Every text it accepts parses with
    ``memory.ops.parse_ops``; it is stricter where that helps the memory: keys in this order, ADD
    must cite ``sources`` and give a ``kind``, texts and ids are non-empty, at least one op, and
    ``maxItems`` counts a repeated id twice where the store counts distinct ids. Whether ids
    exist, sources were shown and NOOP stands alone is for the memory store (it depends on the
    episode)."""
    sources: dict[str, Any] = {"type": "array", "items": {"type": "string", "minLength": 1}}
    if max_sources is not None:
        sources["maxItems"] = max_sources
    return {
        "type": "object",
        "properties": {"ops": {"type": "array", "minItems": 1, "items": {"anyOf": [
            _op("ADD", {"text": _ID_TEXT, "sources": sources, "kind": _KIND}, ["text", "sources", "kind"]),
            _op("UPDATE", {"id": _ID_TEXT, "text": _ID_TEXT, "sources": sources, "kind": _KIND}, ["id", "text"]),
            _op("DELETE", {"id": _ID_TEXT}, ["id"]),
            _op("NOOP", {}, []),
        ]}}},
        "required": ["ops"],
        "additionalProperties": False,
    }


# v1 (no cap on sources) stays registered so rows sampled under it still replay their masks.
MEMORY_OPS_V1 = Constraint(id="memory-ops-v1", json_schema=memory_ops_schema(None))
_CAPPED_ID = re.compile(r"memory-ops-v2-sources([1-9][0-9]*)")


@functools.cache
def memory_ops_constraint(max_sources: int) -> Constraint:
    """The memory-ops constraint of ``agent.memory_max_sources = max_sources``; its id
    (``memory-ops-v2-sources{n}``) names the cap, so ``constraint_by_id`` rebuilds it from a row."""
    if max_sources < 1:
        raise ValueError(f"max_sources must be at least 1, got {max_sources}")
    return Constraint(id=f"memory-ops-v2-sources{max_sources}", json_schema=memory_ops_schema(max_sources))


MEMORY_OPS = memory_ops_constraint(MEMORY_MAX_SOURCES)  # the default cap
MEMORY_OPS_SCHEMA: dict[str, Any] = MEMORY_OPS.json_schema

CONSTRAINTS: dict[str, Constraint] = {c.id: c for c in (MEMORY_OPS_V1, MEMORY_OPS)}


def constraint_by_id(constraint_id: str) -> Constraint:
    """The registered constraint called ``constraint_id`` (training rows store only the id);
    ``memory-ops-v2-sources{n}`` for any cap ``n``; an ``EXTRACT_PREFIX`` id rebuilt from its
    payload (``extractive_constraint``; ``ValueError`` if malformed)."""
    if constraint_id in CONSTRAINTS:
        return CONSTRAINTS[constraint_id]
    capped = _CAPPED_ID.fullmatch(constraint_id)
    if capped:
        return memory_ops_constraint(int(capped.group(1)))
    if constraint_id.startswith(EXTRACT_PREFIX):
        return extractive_constraint_by_id(constraint_id)
    raise ValueError(
        f"unknown constraint id {constraint_id!r}; valid ids: {', '.join(sorted(CONSTRAINTS))} "
        f"(memory-ops-v2-sources<n> for any cap n, {EXTRACT_PREFIX}<json> for an extractive call)"
    )


__all__ = [
    "CONSTRAINTS",
    "MEMORY_OPS",
    "MEMORY_OPS_SCHEMA",
    "MEMORY_OPS_V1",
    "constraint_by_id",
    "memory_ops_constraint",
    "memory_ops_schema",
]
