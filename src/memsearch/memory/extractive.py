"""The extractive action format of decision memory (``agent.memory_format = "extractive"``,
docs/design.md §5): an op names evidence, not prose, and the environment writes the item.

    {"ops": [{"op": "ADD", "sources": ["d3:1"]}]}                        a fact: those sentences
    {"ops": [{"op": "ADD", "kind": "open", "text": "Find: Le Havre"}]}   an open sub-question
    {"ops": [{"op": "UPDATE", "id": "m2", "sources": ["d5:0"]}]}         m2 becomes a fact of these
    {"ops": [{"op": "DELETE", "id": "m1"}]}        {"ops": [{"op": "NOOP"}]}

A fact's text is written from the cited sentences (``fact_text``: each sentence, prefixed with
its paragraph's title when it does not name it, as the oracle teacher writes facts; several
joined by a space), so it is faithful by construction and the policy decides only *which*
evidence to keep, update or drop. An open sub-question has no sentence to copy: it keeps a
short free text (at most ``OPEN_TEXT_CHARS`` characters under the schema constraint).

``parse_extractive`` reads the format with the wrapping rules of ``ops.parse_ops`` (exact keys:
a fact with a ``text`` is refused, the environment writes it) and returns the store's own ops with
the text written, so every rule of ``Memory.apply`` (shown sources, the source cap, the budget)
applies unchanged. A source never shown has no sentence: its text is the id itself, and the
store rejects the batch for the unshown source.

What a constrained call may do from a given state is ``memory.choices``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from memsearch.memory.ops import Add, MalformedOp, Op, ParseResult, Update, check_keys, op_name, parse_op, parse_ops

OPEN_TEXT_CHARS = 48  # the longest open sub-question the constraint lets the policy write
_TRAILING_PAREN = re.compile(r"\s*\([^)]*\)\s*$")

_ALLOWED = {"ADD": ("op", "sources", "kind", "text"), "UPDATE": ("op", "id", "sources"), "DELETE": ("op", "id"),
            "NOOP": ("op",)}
_REQUIRED = {"ADD": (), "UPDATE": ("id", "sources"), "DELETE": ("id",), "NOOP": ()}


def mentions_title(sentence: str, title: str) -> bool:
    """Whether ``sentence`` names ``title`` (its disambiguation in parentheses aside)."""
    base = _TRAILING_PAREN.sub("", title).strip() or title
    return base.lower() in sentence.lower()


def fact_text(title: str | None, sentence: str) -> str:
    """A fact's text from one sentence: the sentence, prefixed with ``title: `` when it does not
    name its paragraph, so a reader can use the fact on its own."""
    sentence = sentence.strip()
    if not title or mentions_title(sentence, title):
        return sentence
    return f"{title}: {sentence}"


def written_text(sources: Sequence[str], texts: Mapping[str, str]) -> str:
    """The item text the environment writes for ``sources``; ``texts`` maps an evidence id to
    ``"title\\nsentence"`` (what the episode showed). An id never shown stands for itself."""
    parts = []
    for source in sources:
        shown = texts.get(source)
        if shown is None:
            parts.append(source)
            continue
        title, _, sentence = shown.partition("\n")
        parts.append(fact_text(title, sentence) if sentence else fact_text(None, title))
    return " ".join(parts)


def _sources(where: str, raw: dict[str, Any]) -> tuple[str, ...]:
    value = raw.get("sources")
    if not (isinstance(value, list) and value and all(isinstance(s, str) for s in value)):
        raise MalformedOp(f"{where}: 'sources' must be a non-empty list of evidence ids")
    return tuple(value)


def _op_reader(texts: Mapping[str, str]):
    def read(i: int, raw: Any) -> Op:
        name = op_name(i, raw)
        where = f"op {i} ({name})"
        check_keys(where, raw, _ALLOWED[name], _REQUIRED[name])
        if name == "ADD" and str(raw.get("kind", "fact")).strip().lower() == "open":
            if not isinstance(raw.get("text"), str):
                raise MalformedOp(f"{where}: an open item needs a 'text' (the sub-question)")
            return parse_op(i, {**raw, "kind": "open"})
        if name == "ADD":
            if "text" in raw:
                raise MalformedOp(f"{where}: a fact has no 'text' in the extractive format: give its 'sources', "
                                  "the memory writes the sentences")
            sources = _sources(where, raw)
            return parse_op(i, {"op": "ADD", "text": written_text(sources, texts), "sources": list(sources),
                                "kind": "fact"})
        if name == "UPDATE":
            sources = _sources(where, raw)
            return parse_op(i, {**raw, "text": written_text(sources, texts), "kind": "fact"})
        return parse_op(i, raw)

    return read


def parse_extractive(text: str, texts: Mapping[str, str]) -> ParseResult:
    """Parse an extractive batch (module doc) into the store's ops, texts written. Never raises."""
    return parse_ops(text, _op_reader(texts))


def format_extractive(ops: Sequence[Op]) -> str:
    """A batch of store ops as an extractive policy writes it (a fact by its sources only), in the
    one spelling the schema constraint can produce: a source list compact (it is an enum value,
    matched as compact JSON), every other gap ``", "`` / ``": "`` as ``format_ops`` writes them.
    ``parse_extractive`` of it gives the same ops back when their texts are the written ones."""
    out = []
    for op in ops:
        if isinstance(op, Add) and op.kind == "fact":
            fields = {"op": "ADD", "sources": list(op.sources)}
        elif isinstance(op, Add):
            fields = {"op": "ADD", "kind": "open", "text": op.text}
        elif isinstance(op, Update):
            fields = {"op": "UPDATE", "id": op.id, "sources": list(op.sources or ())}
        else:
            fields = op.to_json()
        out.append("{" + ", ".join(f"{json.dumps(k)}: {_value(v)}" for k, v in fields.items()) + "}")
    return '{"ops": [' + ", ".join(out) + "]}"


def _value(value: Any) -> str:
    if isinstance(value, list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(value, ensure_ascii=False)


__all__ = ["fact_text", "format_extractive", "mentions_title",
           "parse_extractive", "written_text"]
