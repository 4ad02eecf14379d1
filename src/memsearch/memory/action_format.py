"""The memory action format as constraints: what a schema-mode memory call may output, by id.

A schema-mode memory call (docs/design.md §5, §7) is sampled under a ``Constraint``; its id is all
a training row stores, so the update rebuilds the constraint from the id (``constraint_by_id``)
and replays the masks the decoder applied. Ids and schemas are therefore part of the records: a
schema may never change under an existing id (tests/memory/test_action_format.py pins them).

Ids
    ``memory-ops-v1``: the text format's whole decision, any number of ops, uncapped sources.
    ``memory-ops-v2-sources<n>``: the same, each item citing at most ``n`` sources
    (``memory_ops_constraint``; ``MEMORY_OPS`` is the default cap ``config.MEMORY_MAX_SOURCES``).
    ``memory-ops-v3-ops<k>-src<s>x<e>-id<i>-add<a>-upd<u>``: the text format bounded to fit a
    token budget (``bounded_ops_constraint``, below): NOOP alone or 1..``k`` ADD / UPDATE / DELETE
    ops, at most ``s`` sources of at most ``e`` characters per item, item ids of at most ``i``,
    ADD texts of at most ``a`` and UPDATE texts of at most ``u`` characters. The id names every
    bound, so any such id is rebuilt whatever budget split made it.
    ``memory-extract-v1:<json>``: one op of the extractive format, built per call from the
    episode's state (``memory.extractive_constraint``).

The budget-bounded format (v3)
    v1 and v2 bound neither the number of ops nor any string, so a small model sampled under them
    can repeat ``{"op":"NOOP"}`` items or write on inside a string until the token limit cuts
    the answer. v3 bounds everything: every value it allows, written as compact JSON, has at
    most ``policy_tokens - 1`` characters (``text.constraint.max_compact_length`` of the schema;
    the builder checks it). That is at most ``policy_tokens - 1`` tokens wherever a token spells
    at least one character: every token the hf decoder may sample does (it never allows part of
    a character), and so does every token of ASCII text under byte-level BPE. The token left
    over is the end token, which counts against ``max_tokens`` (hf decoder, vLLM): the answer
    ends instead of being cut at a complete value. Not counted: the white space the hf automaton
    allows between JSON tokens (``MAX_WHITESPACE`` a gap) and escapes (``maxLength`` counts
    ``\\u00e9`` as the one character it stands for; it takes six).

    The split (``ops_bounds``). Each of the ``k`` ops gets ``(policy_tokens - 1 - 10 - (k - 1))
    // k`` characters (the end token, ``{"ops":[]}``, the commas between ops). A variant's text
    gets what its longest case (every optional key present, every source and id at its cap)
    leaves of that, so an ADD's text is longer than an UPDATE's by the UPDATE's id and name.
    Ids have fixed caps from how memsearch writes them: items ``m<n>`` (``ITEM_ID_CHARS``),
    evidence ids ``d<n>:<sentence>`` (``SOURCE_CHARS``). Sources per item: the store's cap
    (``agent.memory_max_sources``), lowered only as far as an UPDATE's text needs to reach
    ``USEFUL_TEXT_CHARS`` with one op (to 1 where none does). Ops per call: the most, up to
    ``MAX_OPS``, that leave every UPDATE text ``USEFUL_TEXT_CHARS``, and at least 1. A budget
    below ``min_bounded_policy_tokens`` (one op, one source, 1-character texts) raises
    ``ValueError``. ``text_ops_constraint``, what the engine uses, keeps v2 wherever one UPDATE
    cannot hold ``USEFUL_TEXT_CHARS`` (below 210 tokens), whose answers the limit cuts as before.

Enforcing a constraint is a backend's business (``backends.hf.constraint`` compiles one to token
masks; an OpenAI-compatible server is sent the schema); this module only says what is allowed.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from memsearch.config import MEMORY_MAX_SOURCES
from memsearch.memory.extractive_constraint import EXTRACT_PREFIX, extractive_constraint_by_id
from memsearch.text.constraint import Constraint, max_compact_length

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


# ------------------------------------------------------------------ v3: bounded by the budget
BOUNDED_PREFIX = "memory-ops-v3-"
# Item ids are m1, m2, ... numbered per episode: 4 characters name 999 ADDs, more than an
# episode's memory calls can make (a few searches, or one call per chunk, times MAX_OPS).
ITEM_ID_CHARS = 4
# Evidence ids are "d<document number>:<sentence index>" (data.records.evidence_id), numbered per
# prepared data folder: 11 characters hold 10 million documents of up to 100 sentences (a full
# HotpotQA train split has under a million paragraphs).
SOURCE_CHARS = 11
# A text shorter than this cannot hold a whole HotpotQA sentence (median 119 characters in the
# shipped dev sample, 41,612 sentences), which the teacher and trained policies write as facts:
# the split gives up sources per item, then ops per call, to keep it, and a budget where one
# UPDATE cannot reach it keeps v2 (``text_ops_constraint``) rather than cutting every fact short.
USEFUL_TEXT_CHARS = 120
# Ops one call may write: a call sees a few passages; past this a larger budget goes to text.
MAX_OPS = 8
_WRAP = len('{"ops":[]}')
_END_TOKENS = 1  # the end token (EOS) counts against max_tokens: the text gets one token less
_BOUNDED_ID = re.compile(r"memory-ops-v3-ops([0-9]+)-src([0-9]+)x([0-9]+)-id([0-9]+)-add([0-9]+)-upd([0-9]+)")
_BOUNDED_FORM = "memory-ops-v3-ops<k>-src<s>x<e>-id<i>-add<a>-upd<u> (integers >= 1, no leading zeros)"


@dataclass(frozen=True)
class OpsBounds:
    """Every bound of a v3 schema: ``ops`` per call, ``sources`` per item of at most
    ``source_chars`` characters, item ids of at most ``id_chars``, ADD texts of at most
    ``add_text`` and UPDATE texts of at most ``update_text`` characters (all >= 1)."""

    ops: int
    sources: int
    source_chars: int
    id_chars: int
    add_text: int
    update_text: int

    def __post_init__(self) -> None:
        bad = {k: v for k, v in vars(self).items() if isinstance(v, bool) or not isinstance(v, int) or v < 1}
        if bad:
            raise ValueError(f"memory-ops bounds must be integers >= 1, got {bad}")

    @property
    def id(self) -> str:
        """The constraint id that names these bounds (module docstring)."""
        return (f"{BOUNDED_PREFIX}ops{self.ops}-src{self.sources}x{self.source_chars}-id{self.id_chars}"
                f"-add{self.add_text}-upd{self.update_text}")


def _string(max_len: int) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_len}


def _edit_ops(b: OpsBounds) -> list[dict[str, Any]]:
    """The ADD, UPDATE and DELETE variants under ``b`` (keys in v2's order)."""
    sources = {"type": "array", "items": _string(b.source_chars), "maxItems": b.sources}
    return [
        _op("ADD", {"text": _string(b.add_text), "sources": sources, "kind": _KIND}, ["text", "sources", "kind"]),
        _op("UPDATE", {"id": _string(b.id_chars), "text": _string(b.update_text), "sources": sources, "kind": _KIND},
            ["id", "text"]),
        _op("DELETE", {"id": _string(b.id_chars)}, ["id"]),
    ]


def bounded_ops_schema(b: OpsBounds) -> dict[str, Any]:
    """The v3 schema of ``b``: ``ops`` is exactly ``[{"op":"NOOP"}]`` (NOOP stands alone, as the
    store requires) or 1..``b.ops`` ADD / UPDATE / DELETE ops, every list and string bounded.
    Like v2 it says nothing of which ids exist or which sources were shown (the store's rules)."""
    return {
        "type": "object",
        "properties": {"ops": {"anyOf": [
            {"type": "array", "minItems": 1, "maxItems": 1, "items": _op("NOOP", {}, [])},
            {"type": "array", "minItems": 1, "maxItems": b.ops, "items": {"anyOf": _edit_ops(b)}},
        ]}},
        "required": ["ops"],
        "additionalProperties": False,
    }


@functools.cache
def _overheads(sources: int) -> tuple[int, int, int]:
    """Longest ADD, UPDATE and DELETE with ``sources`` sources and 0-character texts: what an op
    costs besides its text."""
    lengths = [max_compact_length(v) for v in _edit_ops(OpsBounds(1, sources, SOURCE_CHARS, ITEM_ID_CHARS, 1, 1))]
    return int(lengths[0]) - 1, int(lengths[1]) - 1, int(lengths[2])


@functools.cache
def min_bounded_policy_tokens() -> int:
    """The smallest ``policy_tokens`` with a v3 schema: one op, one source, 1-character texts,
    and the end token."""
    add, update, delete = _overheads(1)
    return _END_TOKENS + _WRAP + max(add, update, delete - 1) + 1


def ops_bounds(policy_tokens: int, max_sources: int) -> OpsBounds:
    """The v3 bounds for a ``policy_tokens`` budget and ``agent.memory_max_sources`` (the split:
    module docstring). ``ValueError`` naming the minimum when the budget holds no op."""
    if max_sources < 1:
        raise ValueError(f"max_sources must be at least 1, got {max_sources}")
    need = min_bounded_policy_tokens()
    if policy_tokens < need:
        raise ValueError(f"policy_tokens = {policy_tokens} cannot hold one bounded memory op: the smallest "
                         "memory-ops-v3 schema (one op, one source, a 1-character text, the end token) needs "
                         f"policy_tokens >= {need}")

    def texts(k: int, s: int) -> tuple[int, int]:  # ADD and UPDATE text room with k ops of s sources
        per_op = (policy_tokens - _END_TOKENS - _WRAP - (k - 1)) // k
        add, update, delete = _overheads(s)
        return (per_op - add, per_op - update) if per_op >= delete else (0, 0)

    sources = next((s for s in range(max_sources, 0, -1) if texts(1, s)[1] >= USEFUL_TEXT_CHARS), 1)
    ops = max(k for k in range(1, MAX_OPS + 1) if k == 1 or texts(k, sources)[1] >= USEFUL_TEXT_CHARS)
    add_text, update_text = texts(ops, sources)
    return OpsBounds(ops, sources, SOURCE_CHARS, ITEM_ID_CHARS, add_text, update_text)


@functools.cache
def bounded_constraint(bounds: OpsBounds) -> Constraint:
    """The v3 constraint of ``bounds``, named ``bounds.id``."""
    return Constraint(id=bounds.id, json_schema=bounded_ops_schema(bounds))


@functools.cache
def bounded_ops_constraint(policy_tokens: int, max_sources: int) -> Constraint:
    """The memory-ops constraint of a call allowed ``policy_tokens`` tokens: every value it allows
    has at most ``policy_tokens - 1`` characters written compactly, room for the end token
    (``ops_bounds``; ``ValueError`` when the budget is too small)."""
    constraint = bounded_constraint(ops_bounds(policy_tokens, max_sources))
    # The module docstring's promise, checked on the schema itself (cheap, once per budget).
    longest = max_compact_length(constraint.json_schema)
    if longest > policy_tokens - _END_TOKENS:
        raise AssertionError(f"{constraint.id}: {longest} characters allowed, no room for the end token "
                             f"in policy_tokens = {policy_tokens}")
    return constraint


@functools.cache  # asked on every memory call of an episode
def text_ops_constraint(policy_tokens: int, max_sources: int) -> Constraint:
    """The text format's constraint in schema mode: the budget-bounded v3 one where one UPDATE's
    text can hold a sentence (``USEFUL_TEXT_CHARS``; policy_tokens 210 and up), else v2's
    ``memory_ops_constraint(max_sources)``, unbounded as before: a bound that cuts every fact
    would change what a recipe's policy can write (the CPU recipe's 96 tokens), and such a decode
    may run to the limit (the extractive format is bounded at every budget from 95)."""
    if policy_tokens < min_bounded_policy_tokens() or ops_bounds(policy_tokens, 1).update_text < USEFUL_TEXT_CHARS:
        return memory_ops_constraint(max_sources)
    return bounded_ops_constraint(policy_tokens, max_sources)


def _bounded_by_id(constraint_id: str) -> Constraint:
    match = _BOUNDED_ID.fullmatch(constraint_id)
    try:
        bounds = OpsBounds(*map(int, match.groups())) if match else None
    except ValueError:  # a bound of 0
        bounds = None
    # One spelling per schema (no leading zeros): rows name the same masks by the same id.
    if bounds is None or bounds.id != constraint_id:
        raise ValueError(f"malformed constraint id {constraint_id!r}: expected {_BOUNDED_FORM}; {_valid_ids()}")
    return bounded_constraint(bounds)


def _valid_ids() -> str:
    return (f"valid ids: {', '.join(sorted(CONSTRAINTS))} (memory-ops-v2-sources<n> for any cap n, "
            f"{_BOUNDED_FORM}, {EXTRACT_PREFIX}<json> for an extractive call)")


def constraint_by_id(constraint_id: str) -> Constraint:
    """The registered constraint called ``constraint_id`` (training rows store only the id);
    ``memory-ops-v2-sources{n}`` for any cap ``n``; a ``memory-ops-v3-...`` id rebuilt from the
    bounds it names; an ``EXTRACT_PREFIX`` id rebuilt from its payload (``extractive_constraint``).
    ``ValueError``, naming what was expected, for an unknown or malformed id."""
    if constraint_id in CONSTRAINTS:
        return CONSTRAINTS[constraint_id]
    capped = _CAPPED_ID.fullmatch(constraint_id)
    if capped:
        return memory_ops_constraint(int(capped.group(1)))
    if constraint_id.startswith(BOUNDED_PREFIX):
        return _bounded_by_id(constraint_id)
    if constraint_id.startswith(EXTRACT_PREFIX):
        return extractive_constraint_by_id(constraint_id)
    raise ValueError(f"unknown constraint id {constraint_id!r}; {_valid_ids()}")


__all__ = [
    "BOUNDED_PREFIX",
    "CONSTRAINTS",
    "ITEM_ID_CHARS",
    "MAX_OPS",
    "MEMORY_OPS",
    "MEMORY_OPS_SCHEMA",
    "MEMORY_OPS_V1",
    "SOURCE_CHARS",
    "USEFUL_TEXT_CHARS",
    "OpsBounds",
    "bounded_constraint",
    "bounded_ops_constraint",
    "bounded_ops_schema",
    "constraint_by_id",
    "memory_ops_constraint",
    "memory_ops_schema",
    "min_bounded_policy_tokens",
    "ops_bounds",
    "text_ops_constraint",
]
