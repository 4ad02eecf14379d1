"""Does a completion satisfy the JSON schema it was asked under? How the OpenAI backend tells a
server that constrained its output from one that ignored the constraint (a 200 with free text).

The check is semantic, not textual: the text is parsed as JSON (white space and key order are
the server's business) and the value checked against the keywords memsearch's schemas use
(``backends.hf.constraint``'s subset): ``type``, ``properties``, ``required``,
``additionalProperties``, ``items``, ``minItems``, ``maxItems``, ``minLength``, ``maxLength``,
``enum``, ``const``, ``anyOf`` and ``oneOf`` (as ``anyOf``, like the local automaton). Other
keywords are not checked, so the check can only miss a violation, never invent one.

    schema_problem('{"ops": []}', schema)   # -> "$.ops: 0 items, fewer than minItems 1"

An answer cut at the token limit is judged by ``cut_problem``: a constraining server's cut answer
is the start of some answer the schema allows; an ignoring server's free text soon is not.
"""

from __future__ import annotations

import json
from typing import Any

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}


def _same(a: Any, b: Any) -> bool:
    # JSON equality: true is not 1, key order does not count.
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def value_problem(value: Any, schema: dict[str, Any], where: str = "$") -> str | None:
    """Why ``value`` (parsed JSON) does not satisfy ``schema``, else ``None``."""
    if not isinstance(schema, dict):
        return None
    for key in ("anyOf", "oneOf"):
        if key in schema:
            problems = [value_problem(value, variant, where) for variant in schema[key]]
            if all(problems):
                return f"{where}: matches none of the {len(problems)} {key} variants ({problems[0]})"
    if "const" in schema and not _same(value, schema["const"]):
        return f"{where}: {value!r} is not the constant {schema['const']!r}"
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        return f"{where}: {value!r} is none of {schema['enum']!r}"
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_TYPES.get(kind, lambda v: True)(value) for kind in kinds):
            return f"{where}: a {type(value).__name__}, expected {' or '.join(kinds)}"
    if isinstance(value, dict):
        return _object_problem(value, schema, where)
    if isinstance(value, list):
        return _array_problem(value, schema, where)
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            return f"{where}: {len(value)} characters, fewer than minLength {schema['minLength']}"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{where}: {len(value)} characters, more than maxLength {schema['maxLength']}"
    return None


def _object_problem(value: dict[str, Any], schema: dict[str, Any], where: str) -> str | None:
    properties = schema.get("properties", {})
    missing = [key for key in schema.get("required", []) if key not in value]
    if missing:
        return f"{where}: required key(s) {missing} missing"
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            problem = value_problem(item, properties[key], f"{where}.{key}")
        elif extra is False:
            problem = f"{where}: key {key!r} is not allowed"
        else:
            problem = value_problem(item, extra, f"{where}.{key}") if isinstance(extra, dict) else None
        if problem:
            return problem
    return None


def _array_problem(value: list[Any], schema: dict[str, Any], where: str) -> str | None:
    if len(value) < schema.get("minItems", 0):
        return f"{where}: {len(value)} items, fewer than minItems {schema['minItems']}"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        return f"{where}: {len(value)} items, more than maxItems {schema['maxItems']}"
    items = schema.get("items")
    for i, item in enumerate(value):
        if isinstance(items, dict) and (problem := value_problem(item, items, f"{where}[{i}]")):
            return problem
    return None


def schema_problem(text: str, schema: dict[str, Any]) -> str | None:
    """Why completion ``text`` is not a JSON value satisfying ``schema``, else ``None``."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"not JSON ({exc.msg} at character {exc.pos})"
    return value_problem(value, schema)


def _without_layout(text: str) -> str:
    """``text`` with the white space outside JSON strings removed: where a server's grammar puts
    layout (any amount, vLLM's default) says nothing about the value."""
    out: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
            out.append(ch)
        elif ch not in " \t\n\r":
            out.append(ch)
    return "".join(out)


def cut_problem(text: str, schema: dict[str, Any]) -> str | None:
    """Why ``text``, an answer cut at the token limit, cannot be the start of any JSON value
    ``schema`` allows, else ``None`` (it may be: a constraining server ran out of tokens). The
    check walks the schema's character automaton (``backends.hf.constraint``, the one the local
    decoder masks with) over the text without its layout; schemas using keywords that automaton
    does not know are not judged (``None``)."""
    from memsearch.backends.hf.constraint import Automaton
    from memsearch.text.constraint import Constraint

    try:
        automaton = Automaton(Constraint(id="cut-answer-check", json_schema=schema))
    except ValueError:
        return None
    compact = _without_layout(text)
    state = automaton.start()
    for i, ch in enumerate(compact):
        state = automaton.step(state, ch)
        if not state:
            return f"cut answer leaves the schema at character {i} ({compact[max(0, i - 20):i + 1]!r})"
    return None
