"""The text grammar of agent actions that more than one layer reads: evidence ids mentioned in
free text, and the controller's ``SEARCH(query)`` / ``FINISH``.

It sits at the bottom of the package (docs/design.md §11) because both the engine (which parses
policy output) and the ``oracle`` backend (which writes text the engine will parse, and must
predict how it will be read) need it, and backends sit below the engine. Pure functions; nothing
here raises on model output: a text that cannot be read becomes an invalid action with a reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Every parser here runs on raw model output inside the event loop that drives all concurrent
# episodes, so each one is linear in the length of the text: a model that degenerates into a
# long run of spaces, dashes or brackets must not freeze the run. Patterns are possessive (no
# backtracking) and the rest is plain string scanning.

# An evidence id (``doc:sentence``) as it appears in model text, as one regular expression: the
# specification ``evidence_ids_in`` implements in linear time. Backtracking makes it quadratic
# on long runs of ``-``: use it only on short, bounded text.
EVIDENCE_ID_IN_TEXT = re.compile(r"(?<![\w:/.@])([A-Za-z][\w\-]*:\d+)(?![\w:])")
# The head of a controller search: ``SEARCH:`` or ``SEARCH(``, any case, as a whole word.
_SEARCH_HEAD = re.compile(r"\bSEARCH\s*+[:(]", re.IGNORECASE)
_FINISH = re.compile(r"\bFINISH\b", re.IGNORECASE)
# A maximal run of the characters an evidence id's document part is made of, and the digits of
# its sentence index (both possessive: a run is read once).
_ID_RUN = re.compile(r"[\w\-]++")
_DIGITS = re.compile(r"\d++")
# A character that may not stand right before an evidence id (URL, path, time, e-mail, longer id).
_NOT_BEFORE = frozenset(":/.@")
# What may not follow an id's sentence index.
_WORD_OR_COLON = re.compile(r"[\w:]")
_ASCII_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class ControllerAction:
    """``SEARCH(query)`` or ``FINISH``; ``error`` set when the text was neither."""

    kind: str  # "search" | "finish" | "invalid"
    query: str | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "query": self.query, "error": self.error}


def parse_controller(text: str) -> ControllerAction:
    """Read ``SEARCH: <query>`` / ``SEARCH(<query>)`` or ``FINISH``, whichever comes first.

    The query is the rest of the line after the head (or the next non-blank line when the head
    ends its line), without one closing parenthesis and surrounding quotes or angle brackets.
    """
    search = _SEARCH_HEAD.search(text)
    finish = _FINISH.search(text)
    if search and (not finish or search.start() < finish.start()):
        start = search.end()
        while start < len(text) and text[start].isspace():
            start += 1
        end = text.find("\n", start)
        query = text[start:] if end < 0 else text[start:end]
        query = query.rstrip()
        if query.endswith(")"):
            query = query[:-1]
        query = query.strip().strip("\"'`<>").strip()
        if query:
            return ControllerAction("search", query=query)
        return ControllerAction("invalid", error="SEARCH without a query")
    if finish:
        return ControllerAction("finish")
    return ControllerAction("invalid", error="neither 'SEARCH: <query>' nor 'FINISH' found")


def evidence_ids_in(text: str) -> tuple[str, ...]:
    """Evidence ids (``doc:sentence``) mentioned in ``text``, first mention first.

    An id is an ASCII letter, then word characters or ``-``, a colon and digits; it may not be
    preceded by a word character or one of ``: / . @``, nor followed by a word character or a
    colon (so URLs, paths, times and longer ids are not read as ids). Where a run such as
    ``a-b-d1:0`` admits several starts, the leftmost one is the id (``a-b-d1:0``).
    """
    return tuple(dict.fromkeys(text[a:b] for a, b in evidence_id_spans(text)))


def evidence_id_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every evidence id in ``text``, left to right: the matches of
    ``EVIDENCE_ID_IN_TEXT.finditer``, found in linear time (each run of ``[\\w-]`` is read once)."""
    spans: list[tuple[int, int]] = []
    last_end = 0
    for run in _ID_RUN.finditer(text):
        s, e = run.span()
        if e >= len(text) or text[e] != ":":
            continue
        digits = _DIGITS.match(text, e + 1)
        if digits is None:
            continue
        d = digits.end()
        if _WORD_OR_COLON.match(text, d):
            continue
        start = _leftmost_id_start(text, max(s, last_end), s, e)
        if start is not None:
            spans.append((start, d))
            last_end = d
    return spans


def _leftmost_id_start(text: str, lo: int, run_start: int, run_end: int) -> int | None:
    """The first index in ``[lo, run_end)`` where an id may begin: an ASCII letter at the start of
    the run (not right after ``: / . @``) or right after a ``-`` inside it."""
    if (
        lo <= run_start
        and text[run_start] in _ASCII_LETTERS
        and (run_start == 0 or text[run_start - 1] not in _NOT_BEFORE)
    ):
        return run_start
    dash = text.find("-", max(lo - 1, run_start), run_end)
    while dash >= 0:
        if dash + 1 < run_end and text[dash + 1] in _ASCII_LETTERS:
            return dash + 1
        dash = text.find("-", dash + 1, run_end)
    return None
