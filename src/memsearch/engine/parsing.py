"""Reading decisions out of real model text. Nothing here raises on model output: a text that
cannot be read becomes an invalid action with a reason."""

from __future__ import annotations

import re
from dataclasses import dataclass

from memsearch.answers import boxed_prediction

# The definition of an evidence id in text (its reference semantics); matched through
# _evidence_id_spans, which gives the same matches in linear time.
_EVIDENCE_ID = re.compile(r"(?<![\w:/.@])([A-Za-z][\w\-]*:\d+)(?![\w:])")
# A whole run of [\w-] characters followed by :digits (the run starts where no [\w-] precedes).
_ID_RUN = re.compile(r"(?<![\w\-])[\w\-]+(?P<colon>):\d+(?![\w:])")
_SEARCH = re.compile(r"\bSEARCH\s*[:(]\s*(.+?)\s*\)?\s*$", re.IGNORECASE | re.MULTILINE)
_FINISH = re.compile(r"\bFINISH\b", re.IGNORECASE)
# Inside a [...] group (searched between its brackets only): a "name:number" citation.
_CITATION_IN_BRACKETS = re.compile(r":\d")
_ANSWER_IS = re.compile(r"\bthe (?:final )?answer is[:\s]+(.+?)(?:\.\s|\.$|\n|$)", re.IGNORECASE)


@dataclass(frozen=True)
class ControllerAction:
    """``SEARCH(query)`` or ``FINISH``; ``error`` set when the text was neither."""

    kind: str  # "search" | "finish" | "invalid"
    query: str | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "query": self.query, "error": self.error}


def parse_controller(text: str) -> ControllerAction:
    """Read ``SEARCH: <query>`` / ``SEARCH(<query>)`` or ``FINISH``, whichever comes first."""
    search = _SEARCH.search(text)
    finish = _FINISH.search(text)
    if search and (not finish or search.start() < finish.start()):
        query = search.group(1).strip().strip("\"'`<>").strip()
        if query:
            return ControllerAction("search", query=query)
        return ControllerAction("invalid", error="SEARCH without a query")
    if finish:
        return ControllerAction("finish")
    return ControllerAction("invalid", error="neither 'SEARCH: <query>' nor 'FINISH' found")


@dataclass(frozen=True)
class ReaderAnswer:
    """The answer text (``None`` when none could be read) and the evidence ids cited."""

    answer: str | None
    citations: tuple[str, ...]
    error: str | None = None

    def to_dict(self) -> dict:
        return {"answer": self.answer, "citations": list(self.citations), "error": self.error}


def _evidence_id_spans(text: str) -> list[tuple[int, int]]:
    """Where ``_EVIDENCE_ID`` matches in ``text`` (the same matches as its ``finditer``), in
    linear time. The pattern itself, tried at every letter after a ``-``, rescans the rest of a
    hyphenated run each time (50 s on a 100K-character ``a-a-a-...``). An id ends its run of
    ``[\\w-]`` characters (``:`` is not one), so each run followed by ``:digits`` is matched
    once, and its id starts at the first place the pattern may start: the run's first
    character when it is a letter not preceded by ``:/.@``, else the first letter after a ``-``."""
    spans = []
    for run in _ID_RUN.finditer(text):
        start, colon = run.start(), run.start("colon")
        after_url_char = start > 0 and text[start - 1] in ":/.@"
        first = start if text[start].isascii() and text[start].isalpha() and not after_url_char else None
        if first is None:
            hyphen = text.find("-", start, colon)
            while hyphen >= 0 and not (text[hyphen + 1].isascii() and text[hyphen + 1].isalpha()):
                hyphen = text.find("-", hyphen + 1, colon)
            first = hyphen + 1 if hyphen >= 0 else None
        if first is not None:
            spans.append((first, run.end()))
    return spans


def evidence_ids_in(text: str) -> tuple[str, ...]:
    """Evidence ids (``doc:sentence``) mentioned in ``text``, first mention first."""
    return tuple(dict.fromkeys(text[a:b] for a, b in _evidence_id_spans(text)))


def _drop_evidence_ids(text: str) -> str:
    out, last = [], 0
    for a, b in _evidence_id_spans(text):
        out.append(text[last:a])
        last = b
    out.append(text[last:])
    return "".join(out)


def _answer_line(text: str) -> str | None:
    """The rest of the first ``Answer:`` / ``Final answer:`` line (colon ASCII or full-width),
    stripped; line by line, so no pattern backtracks over white space."""
    for line in text.splitlines():
        low = line.strip().lower()
        if low.startswith("final"):
            rest = low[len("final"):]
            if rest[:1].isspace():
                low = rest.lstrip()
        if not low.startswith("answer"):
            continue
        rest = low[len("answer"):].lstrip()
        if rest[:1] in (":", "："):
            # Cut the same length off the original line, keeping the answer's case.
            value = line.strip()[len(line.strip()) - len(rest) + 1:].strip()
            if value:
                return value
    return None


def _drop_bracketed_citations(answer: str) -> str:
    """Remove ``[...]`` groups that hold a ``name:number`` citation, in one forward pass: a group
    without one is skipped whole (no ``[`` inside it can start a group that has one)."""
    out = []
    i = 0
    while True:
        start = answer.find("[", i)
        if start < 0:
            out.append(answer[i:])
            return "".join(out)
        end = answer.find("]", start)
        if end < 0:
            out.append(answer[i:])
            return "".join(out)
        out.append(answer[i:start])
        if not _CITATION_IN_BRACKETS.search(answer, start, end):
            out.append(answer[start:end + 1])
        i = end + 1


def parse_reader(text: str) -> ReaderAnswer:
    """Tolerant answer extraction: a box (``memsearch.answers.boxed_answer``: ``\\boxed{}``,
    ``\\boxed x``, ``\\fbox{}``), an ``Answer:`` line, "the answer is …", else the first
    non-empty line. Evidence ids anywhere in the text count as citations. Linear in the text's
    length. Scoring a reader that was asked for a box does not use this fallback chain
    (``eval.score``: no box scores 0)."""
    citations = evidence_ids_in(text)
    answer = boxed_prediction(text)
    if answer is None:
        answer = _answer_line(text)
    if answer is None:
        match = _ANSWER_IS.search(text)
        if match:
            answer = match.group(1)
        else:
            lines = (ln.strip() for ln in text.splitlines())
            answer = next((ln for ln in lines if ln and not ln.lower().startswith("evidence")), None)
    if answer is not None:
        # Citations and wrapping punctuation are not part of the answer.
        answer = _drop_bracketed_citations(answer)
        answer = _drop_evidence_ids(answer).strip().strip("*\"'`").rstrip(".").strip()
    if not answer:
        return ReaderAnswer(None, citations, error="no answer found in the reader output")
    return ReaderAnswer(answer, citations)
