"""``Constraint``: the form a policy call's output must take, named by an id.

A value type, not an enforcer: the memory layer builds the memory action format's constraints
(``memory.action_format``), backends enforce them (``backends.hf.constraint`` masks tokens, a
server is sent the schema), and training replays a rollout's masks from the id its row stores.
It sits at the bottom of the package (docs/design.md §11) because all of those layers use it;
``memsearch.backends.base`` re-exports it as part of the policy protocol.

``max_compact_length`` measures a schema: the longest value it allows, written as compact JSON,
which is how a builder proves that every allowed output fits a token budget.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Constraint:
    """An output constraint: a JSON schema, or one of a fixed set of strings.

    ``id`` names the constraint in training rows so the same mask can be replayed.
    """

    id: str
    json_schema: dict[str, Any] | None = None
    choices: tuple[str, ...] | None = None


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def max_compact_length(schema: dict[str, Any]) -> float:
    """The most characters a value ``schema`` allows can take written as compact JSON (no white
    space), or ``math.inf`` when nothing bounds it (a string without ``maxLength``, an array
    without ``maxItems``, an object open to other keys).

    Covers the keywords memsearch's schemas use (``backends.hf.constraint``'s subset): ``const``,
    ``enum``, ``anyOf`` / ``oneOf`` (the longest variant), objects (every property present, the
    longest case), arrays, strings, booleans and null; ``ValueError`` on any other ``type``.
    A string counts ``maxLength`` characters plus its quotes: like ``maxLength`` it counts an
    escape sequence (``\\n``, ``\\u00e9``) as the one character it stands for, although it takes
    2 to 6 characters of text."""
    if "const" in schema or "enum" in schema:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        return max(len(_compact(v)) for v in values)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return max(max_compact_length(variant) for variant in schema[key])
    kind = schema.get("type")
    if kind == "object":
        if schema.get("additionalProperties", True) is not False:
            return math.inf
        props = schema.get("properties", {})
        # {"a":x,"b":y}: braces, then each key, a colon and its value, commas between
        return 2 + sum(len(_compact(name)) + 1 + max_compact_length(p) for name, p in props.items()) + max(
            len(props) - 1, 0)
    if kind == "array":
        most = schema.get("maxItems")
        if most is None:
            return math.inf
        if most == 0:  # always "[]" (and 0 x inf would be nan)
            return 2
        return 2 + most * max_compact_length(schema["items"]) + most - 1
    if kind == "string":
        return 2 + schema["maxLength"] if "maxLength" in schema else math.inf
    if kind in ("boolean", "null"):
        return len("false") if kind == "boolean" else len("null")
    raise ValueError(f"max_compact_length: unsupported schema type {kind!r} in {_compact(schema)[:80]}")


__all__ = ["Constraint", "max_compact_length"]
