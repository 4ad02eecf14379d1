"""``max_compact_length``: the longest compact JSON text a schema allows, checked against values
built to be that long (the bound is reached, not only respected)."""

from __future__ import annotations

import json
import math

import pytest

from memsearch.text.constraint import max_compact_length


def compact(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


OBJ = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 5},
        "tags": {"type": "array", "items": {"enum": ["a", "bcd"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
        "none": {"type": "null"},
        "pick": {"anyOf": [{"const": {"x": [1, 2]}}, {"type": "string", "maxLength": 2}]},
    },
    "required": ["name"],
    "additionalProperties": False,
}


def test_the_longest_value_is_measured_exactly():
    longest = {"name": "abcde", "tags": ["bcd"] * 3, "ok": False, "none": None, "pick": {"x": [1, 2]}}
    assert max_compact_length(OBJ) == len(compact(longest))
    assert max_compact_length({"type": "array", "items": {"type": "string"}, "maxItems": 0}) == len("[]")
    assert max_compact_length({"type": "object", "properties": {}, "additionalProperties": False}) == len("{}")
    assert max_compact_length({"enum": ["éé", "a"]}) == len('"éé"') == 4  # characters, not bytes


@pytest.mark.parametrize("schema", [
    {"type": "string"},
    {"type": "array", "items": {"const": 1}},
    {"type": "object", "properties": {"a": {"const": 1}}},  # other keys allowed
    {"anyOf": [{"const": 1}, {"type": "string", "minLength": 1}]},
    {"type": "array", "items": {"type": "string"}, "maxItems": 2},
])
def test_anything_unbounded_is_infinite(schema):
    assert max_compact_length(schema) == math.inf


def test_unsupported_types_are_refused():
    with pytest.raises(ValueError, match="unsupported schema type 'number'"):
        max_compact_length({"type": "number"})
