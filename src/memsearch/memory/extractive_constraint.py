"""The schema of the extractive memory action format: one op per call, built per call.

In the extractive format an op names evidence, not prose: ADD and UPDATE cite a list of evidence
ids (``"d3:1"``: sentence 1 of document 3) and the environment writes the item's text from the
cited sentences. One call emits exactly one op, and the constraint is built per call from the
episode's state, so that only ops that are valid *and* fit the memory budget can be sampled:

- ``add``: the source lists an ADD may cite (the caller keeps only those whose item would fit);
- ``update``: item id -> the source lists an UPDATE of that item may cite (budget-filtered too);
- ``delete``: the item ids that may be deleted;
- ``open_chars``: 0, no open-item ADD; ``n > 0``, an ADD of an open sub-question whose free
  ``text`` has 1..n characters.

The id (``EXTRACT_PREFIX`` + the compact, key-sorted JSON of the four arguments) says all of it,
so ``memory.action_format.constraint_by_id`` rebuilds the very same constraint from a training row
and the update replays its masks. The schema is a pure function of the id: UPDATE variants come in
the id's (sorted) item order, whatever the order of the mapping given, so two mappings with the
same items give one id and one schema (the order of ``anyOf`` variants never changes the masks).
Source lists and ``delete`` keep their order, as given, in both.

Cost: building a constraint is a few dict literals and one ``json.dumps``; compiling it
(``backends.hf.constraint.compile_constraint``) builds its automaton (microseconds) and computes a
mask per state the decoder or the replay visits (~1 ms each). Compiled per-call constraints are
kept in a least-recently-used cache of ``PER_CALL_CACHE_SIZE`` per tokenizer, so the update,
replaying the masks of the ids its rows name, finds most of them already computed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from memsearch.text.constraint import Constraint

EXTRACT_PREFIX = "memory-extract-v1:"
_PAYLOAD_KEYS = ("add", "delete", "open", "update")


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _source_lists(lists: Any, what: str) -> list[list[str]]:
    if isinstance(lists, str | bytes) or not isinstance(lists, Sequence):
        raise ValueError(f"{what}: expected a list of source lists, got {lists!r}")
    out = []
    for sources in lists:
        if isinstance(sources, str | bytes) or not isinstance(sources, Sequence) or not sources:
            raise ValueError(f"{what}: expected a non-empty list of evidence ids, got {sources!r}")
        if not all(isinstance(s, str) and s for s in sources):
            raise ValueError(f"{what}: evidence ids must be non-empty strings, got {sources!r}")
        out.append(list(sources))
    return out


def _item_id(item: Any, what: str) -> str:
    if not isinstance(item, str) or not item:
        raise ValueError(f"{what}: expected a non-empty item id string, got {item!r}")
    return item


def extractive_ops_schema(
    add: Sequence[Sequence[str]], update: Mapping[str, Sequence[Sequence[str]]], delete: Sequence[str],
    open_chars: int = 0,
) -> dict[str, Any]:
    """The JSON schema of one extractive op allowed in this state (see the module docstring).
    ``update`` items come in sorted id order; items with no source list are left out."""
    variants: list[dict[str, Any]] = []
    if add:
        variants.append(_obj({"op": {"const": "ADD"}, "sources": {"enum": [list(s) for s in add]}}))
    if open_chars:
        variants.append(_obj({"op": {"const": "ADD"}, "kind": {"const": "open"},
                              "text": {"type": "string", "minLength": 1, "maxLength": open_chars}}))
    for item in sorted(update):
        if update[item]:
            variants.append(_obj({"op": {"const": "UPDATE"}, "id": {"const": item},
                                  "sources": {"enum": [list(s) for s in update[item]]}}))
    if delete:
        variants.append(_obj({"op": {"const": "DELETE"}, "id": {"enum": list(delete)}}))
    variants.append(_obj({"op": {"const": "NOOP"}}))
    return {
        "type": "object",
        "properties": {"ops": {"type": "array", "minItems": 1, "maxItems": 1, "items": {"anyOf": variants}}},
        "required": ["ops"],
        "additionalProperties": False,
    }


def extractive_ops_constraint(
    add: Sequence[Sequence[str]], update: Mapping[str, Sequence[Sequence[str]]], delete: Sequence[str],
    open_chars: int = 0,
) -> Constraint:
    """The constraint of one extractive call: exactly one op, an ADD citing one of ``add``, an
    open ADD with a ``text`` of 1..``open_chars`` characters (when ``open_chars > 0``), an UPDATE
    of an item of ``update`` citing one of its lists, a DELETE of one of ``delete``, or NOOP.
    A pure function of its arguments (up to the order of ``update``'s keys); ``ValueError`` on
    arguments of the wrong shape."""
    add_lists = _source_lists(add, "add")
    if not isinstance(update, Mapping):
        raise ValueError(f"update: expected a mapping of item id to source lists, got {update!r}")
    upd = {_item_id(k, "update"): _source_lists(v, f"update[{k!r}]") for k, v in update.items()}
    if isinstance(delete, str | bytes) or not isinstance(delete, Sequence):
        raise ValueError(f"delete: expected a list of item ids, got {delete!r}")
    dels = [_item_id(d, "delete") for d in delete]
    if isinstance(open_chars, bool) or not isinstance(open_chars, int) or open_chars < 0:
        raise ValueError(f"open_chars: expected an integer >= 0, got {open_chars!r}")
    payload = {"add": add_lists, "delete": dels, "open": open_chars, "update": upd}
    cid = EXTRACT_PREFIX + json.dumps(payload, separators=(",", ":"), sort_keys=True)
    return Constraint(id=cid, json_schema=extractive_ops_schema(add_lists, upd, dels, open_chars))


def extractive_constraint_by_id(constraint_id: str) -> Constraint:
    """Rebuild the constraint an ``EXTRACT_PREFIX`` id names. ``ValueError`` (naming what was
    expected) for a payload that is not the JSON ``extractive_ops_constraint`` writes, including
    one that is valid but not in its canonical form (it would name the same masks twice)."""
    if not constraint_id.startswith(EXTRACT_PREFIX):
        raise ValueError(f"constraint id {constraint_id!r} does not start with {EXTRACT_PREFIX!r}")
    expected = (f'{EXTRACT_PREFIX} followed by compact, key-sorted JSON {{"add": [[ids]], "delete": [ids], '
                '"open": n, "update": {item: [[ids]]}}')
    try:
        payload = json.loads(constraint_id[len(EXTRACT_PREFIX):])
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed constraint id {constraint_id!r}: expected {expected} ({exc})") from None
    if not isinstance(payload, dict) or sorted(payload) != list(_PAYLOAD_KEYS):
        raise ValueError(f"malformed constraint id {constraint_id!r}: expected {expected}")
    try:
        constraint = extractive_ops_constraint(payload["add"], payload["update"], payload["delete"], payload["open"])
    except ValueError as exc:
        raise ValueError(f"malformed constraint id {constraint_id!r}: {exc}; expected {expected}") from None
    if constraint.id != constraint_id:
        raise ValueError(
            f"constraint id {constraint_id!r} is not in canonical form; expected {constraint.id!r} "
            "(compact, key-sorted JSON)"
        )
    return constraint


__all__ = [
    "EXTRACT_PREFIX",
    "extractive_constraint_by_id",
    "extractive_ops_constraint",
    "extractive_ops_schema",
]
