"""Memory operations (decision mode) and tolerant parsing of them from model text.

The memory policy answers with one JSON object::

    {"ops": [{"op": "ADD", "text": "...", "sources": ["d7:2"], "kind": "fact"},
             {"op": "UPDATE", "id": "m3", "text": "...", "sources": ["d7:2", "d2:0"]},
             {"op": "DELETE", "id": "m1"},
             {"op": "NOOP"}]}

``parse_ops`` turns model text into ``Add`` / ``Update`` / ``Delete`` / ``Noop`` values and
never raises. It is *tolerant on wrapping* (code fences, chatter before or after, a bare list
of ops instead of the object, op names in any case, trailing garbage) and *strict on
structure* (exact keys, exact types, known op names): a small model that drifts from the
format gets a clear invalid action with a reason rather than a silently guessed meaning.

Parsing only checks shape and types. Whether ids exist, sources were shown, NOOP stands alone,
text is non-empty and the result fits the budget is for ``Memory.apply`` (``store.py``),
because those rules depend on the memory and the episode.

Op indices in messages count from 0, like the JSON list they point into.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from memsearch.text.safe_text import has_lone_surrogate

Kind = Literal["fact", "open"]
KINDS: tuple[str, ...] = ("fact", "open")
OP_NAMES: tuple[str, ...] = ("ADD", "UPDATE", "DELETE", "NOOP")


def _check_sources(sources: Any) -> tuple[str, ...]:
    if isinstance(sources, str) or not all(isinstance(s, str) for s in sources):
        raise TypeError(f"sources must be a sequence of strings, got {sources!r}")
    return tuple(sources)


def _check_kind(kind: Any) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


@dataclass(frozen=True)
class Add:
    """Add a new item; the memory assigns its id (``m1``, ``m2``, ...)."""

    text: str
    sources: tuple[str, ...] = ()
    kind: Kind = "fact"
    name: ClassVar[str] = "ADD"

    def __post_init__(self) -> None:
        # Constructed in code (rules backend, tests) as well as by the parser: a wrong type
        # here is a programming error, so raise instead of producing a half-valid op.
        object.__setattr__(self, "sources", _check_sources(self.sources))
        _check_kind(self.kind)

    def to_json(self) -> dict[str, Any]:
        """The op as the policy writes it."""
        return {"op": self.name, "text": self.text, "sources": list(self.sources), "kind": self.kind}


@dataclass(frozen=True)
class Update:
    """Replace an item's text; ``sources`` / ``kind`` left as ``None`` keep the old values."""

    id: str
    text: str
    sources: tuple[str, ...] | None = None
    kind: Kind | None = None
    name: ClassVar[str] = "UPDATE"

    def __post_init__(self) -> None:
        if self.sources is not None:
            object.__setattr__(self, "sources", _check_sources(self.sources))
        if self.kind is not None:
            _check_kind(self.kind)

    def to_json(self) -> dict[str, Any]:
        """The op as the policy writes it (omitted optional fields stay omitted)."""
        out: dict[str, Any] = {"op": self.name, "id": self.id, "text": self.text}
        if self.sources is not None:
            out["sources"] = list(self.sources)
        if self.kind is not None:
            out["kind"] = self.kind
        return out


@dataclass(frozen=True)
class Delete:
    """Remove an item. Its id is never given to another item."""

    id: str
    name: ClassVar[str] = "DELETE"

    def to_json(self) -> dict[str, Any]:
        """The op as the policy writes it."""
        return {"op": self.name, "id": self.id}


@dataclass(frozen=True)
class Noop:
    """Change nothing. Valid only as the single op of a batch."""

    name: ClassVar[str] = "NOOP"

    def to_json(self) -> dict[str, Any]:
        """The op as the policy writes it."""
        return {"op": self.name}


Op = Add | Update | Delete | Noop


def ops_to_json(ops: list[Op] | tuple[Op, ...]) -> dict[str, Any]:
    """``{"ops": [...]}`` for a batch: what a policy (or a teacher for SFT) should output."""
    return {"ops": [op.to_json() for op in ops]}


def format_ops(ops: list[Op] | tuple[Op, ...]) -> str:
    """A batch as compact JSON text; ``parse_ops(format_ops(ops)).ops == tuple(ops)``."""
    return json.dumps(ops_to_json(ops), ensure_ascii=False)


@dataclass(frozen=True)
class ParseResult:
    """Outcome of ``parse_ops``: either ``ops`` (non-empty) or ``error``, never both.

    ``span`` is the ``(start, end)`` character range of the JSON value that was used, or of
    the one the error is about; ``None`` when no JSON value was found.
    """

    ops: tuple[Op, ...] | None
    error: str | None = None
    span: tuple[int, int] | None = field(default=None)

    @property
    def ok(self) -> bool:
        """True when the text held a well-formed batch of ops."""
        return self.ops is not None


class MalformedOp(Exception):
    """A structural problem of one op, carrying the reason shown to the policy."""



_JSON_TYPE_NAMES = {str: "string", int: "number", float: "number", bool: "boolean",
                    type(None): "null", list: "list", dict: "object"}


def _json_type(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


# Allowed keys per op: unknown keys are rejected so that a misspelt field ("source",
# "kinds") is reported instead of silently ignored.
_ALLOWED = {
    "ADD": ("op", "text", "sources", "kind"),
    "UPDATE": ("op", "id", "text", "sources", "kind"),
    "DELETE": ("op", "id"),
    "NOOP": ("op",),
}
_REQUIRED = {"ADD": ("text",), "UPDATE": ("id", "text"), "DELETE": ("id",), "NOOP": ()}


def op_name(i: int, raw: Any) -> str:
    """The op name of the decoded op ``raw`` (upper case), or ``MalformedOp``."""
    if not isinstance(raw, dict):
        raise MalformedOp(f"op {i} is not an object (got {_json_type(raw)})")
    if "op" not in raw:
        raise MalformedOp(f"op {i}: missing field 'op'")
    name = raw["op"]
    if not isinstance(name, str):
        raise MalformedOp(f"op {i}: 'op' must be a string, got {_json_type(name)}")
    name = name.strip().upper()
    if name not in OP_NAMES:
        raise MalformedOp(f"op {i}: unknown op {raw['op']!r} (expected ADD, UPDATE, DELETE or NOOP)")
    return name


def check_keys(where: str, raw: dict[str, Any], allowed: tuple[str, ...], required: tuple[str, ...]) -> None:
    """``MalformedOp`` for a key outside ``allowed`` or a missing ``required`` one."""
    for key in raw:
        if key not in allowed:
            raise MalformedOp(f"{where}: unexpected field {key!r} (allowed: {', '.join(allowed)})")
    for key in required:
        if key not in raw:
            raise MalformedOp(f"{where}: missing field {key!r}")


def parse_op(i: int, raw: Any) -> Op:
    """Op ``i`` of a batch in the text format, from its decoded JSON value, or ``MalformedOp``."""
    name = op_name(i, raw)
    where = f"op {i} ({name})"
    check_keys(where, raw, _ALLOWED[name], _REQUIRED[name])
    for key in ("id", "text"):
        if key in raw and not isinstance(raw[key], str):
            raise MalformedOp(f"{where}: {key!r} must be a string, got {_json_type(raw[key])}")
    sources = raw.get("sources")
    if "sources" in raw and not (isinstance(sources, list) and all(isinstance(s, str) for s in sources)):
        raise MalformedOp(f"{where}: 'sources' must be a list of strings")
    # A JSON escape such as "\ud800" decodes to a lone surrogate: not Unicode text, and stored in
    # memory it would make the trajectory unwritable.
    for key in ("id", "text"):
        if key in raw and has_lone_surrogate(raw[key]):
            raise MalformedOp(
                f"{where}: {key!r} holds a lone surrogate escape (\\ud800-\\udfff), expected Unicode text")
    if sources and any(has_lone_surrogate(s) for s in sources):
        raise MalformedOp(f"{where}: 'sources' holds a lone surrogate escape (\\ud800-\\udfff), expected evidence ids")
    kind = raw.get("kind")
    if "kind" in raw:
        if not isinstance(kind, str) or kind.strip().lower() not in KINDS:
            raise MalformedOp(f"{where}: 'kind' must be 'fact' or 'open', got {json.dumps(kind)}")
        kind = kind.strip().lower()
    if name == "ADD":
        return Add(text=raw["text"], sources=tuple(sources or ()), kind=kind or "fact")
    if name == "UPDATE":
        return Update(id=raw["id"], text=raw["text"],
                      sources=None if sources is None else tuple(sources), kind=kind)
    if name == "DELETE":
        return Delete(id=raw["id"])
    return Noop()


def _parse_batch(value: Any, read_op: Callable[[int, Any], Op]) -> tuple[Op, ...]:
    """Ops of one decoded JSON value (an ``{"ops": [...]}`` object or a bare list)."""
    if isinstance(value, dict):
        extra = [k for k in value if k != "ops"]
        if extra:
            raise MalformedOp(f"unexpected key {extra[0]!r} next to 'ops' (only 'ops' is allowed)")
        items = value["ops"]
        if not isinstance(items, list):
            raise MalformedOp(f"'ops' must be a list, got {_json_type(items)}")
    else:
        items = value
    if not items:
        raise MalformedOp('the ops list is empty (use [{"op": "NOOP"}] to change nothing)')
    return tuple(read_op(i, raw) for i, raw in enumerate(items))


def _rank(value: Any) -> int | None:
    """How much a decoded value looks like an attempt at a batch (lower = more), or ``None``.

    Decides whose error is reported when no value parses: an ``{"ops": ...}`` object beats a
    bare list of objects, which beats some other list (a "[1]" in chatter).
    """
    if isinstance(value, dict):
        return 0 if "ops" in value else None
    if isinstance(value, list):
        return 1 if any(isinstance(v, dict) for v in value) else 2
    return None


# Each failed start costs up to one scan of the rest of the text (or ~1000 levels of
# recursion for "[[[[..."), so bound them: parsing stays linear-ish on adversarial text while
# real outputs (a few hundred tokens) never come close.
MAX_FAILED_STARTS = 1000
_OPS_OPENING = re.compile(r'\{\s*"ops"')


def _decode_error(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid JSON in the ops object: {exc.msg} at char {exc.pos}"
    return f"invalid JSON in the ops object ({type(exc).__name__})"


def parse_ops(text: str, read_op: Callable[[int, Any], Op] | None = None) -> ParseResult:
    """Parse a batch of memory ops from model text. Never raises.

    Every ``{`` or ``[`` is tried, left to right, as the start of a JSON value
    (``json.JSONDecoder.raw_decode``); a value that decodes is skipped as a whole, so lists
    nested inside an object are never taken on their own. The first value that is a
    well-formed batch wins. When none is, the error of the value that most looks like an
    attempt at a batch is returned (``ops=None``). ``read_op`` (op index, decoded JSON value)
    reads one op of another format with the same wrapping rules (``memory.extractive``); it
    raises ``MalformedOp`` with the reason for the policy.
    """
    try:
        return _parse_ops(text, read_op or parse_op)
    except Exception as exc:  # noqa: BLE001 - the contract is "never raises on model text"
        return ParseResult(None, f"could not parse ops: {type(exc).__name__}")


def _parse_ops(text: str, read_op: Callable[[int, Any], Op]) -> ParseResult:
    if not isinstance(text, str):
        return ParseResult(None, f"expected text, got {type(text).__name__}")
    if not text.strip():
        return ParseResult(None, "empty output")
    # strict=False lets raw newlines / tabs inside strings through: small models emit them,
    # and the memory collapses white space in item text anyway.
    decoder = json.JSONDecoder(strict=False)
    best: tuple[int, str, tuple[int, int]] | None = None  # (rank, error, span)
    single_op: tuple[int, int] | None = None
    broken: tuple[str, tuple[int, int]] | None = None  # an '{"ops"' that is not valid JSON
    found_json = False
    pos, n = 0, len(text)
    failed, gave_up = 0, False
    while pos < n:
        starts = [i for i in (text.find("{", pos), text.find("[", pos)) if i >= 0]
        if not starts:
            break
        start = min(starts)
        try:
            # RecursionError (deeply nested brackets) is an Exception too: treat as no value.
            value, end = decoder.raw_decode(text, start)
        except Exception as exc:  # noqa: BLE001
            if broken is None and _OPS_OPENING.match(text, start):
                broken = (_decode_error(exc), (start, n))
            failed += 1
            if failed >= MAX_FAILED_STARTS:
                gave_up = True
                break
            pos = start + 1
            continue
        found_json = True
        pos = end
        rank = _rank(value)
        if rank is None:
            if isinstance(value, dict) and "op" in value and single_op is None:
                single_op = (start, end)
            continue
        try:
            return ParseResult(_parse_batch(value, read_op), None, (start, end))
        except MalformedOp as exc:
            if best is None or rank < best[0]:
                best = (rank, str(exc), (start, end))
    if best is not None and best[0] == 0:
        return ParseResult(None, best[1], best[2])
    if broken is not None:
        # Usually output cut off by the token limit, or a missing comma or quote.
        return ParseResult(None, broken[0], broken[1])
    if best is not None and best[0] == 1:
        return ParseResult(None, best[1], best[2])
    if single_op is not None:
        return ParseResult(None, 'found a single op object; wrap it as {"ops": [...]}', single_op)
    if best is not None:
        return ParseResult(None, best[1], best[2])
    if gave_up:
        return ParseResult(None, f"gave up after {MAX_FAILED_STARTS} brackets that start no JSON value")
    if found_json:
        return ParseResult(None, "no JSON object with an 'ops' list found")
    return ParseResult(None, "no JSON object or list found")
