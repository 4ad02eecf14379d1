"""Reading decisions out of real model text. Nothing here raises on model output: a text that
cannot be read becomes an invalid action with a reason."""

from __future__ import annotations

import re
from dataclasses import dataclass

from memsearch.eval.metrics import boxed_answer, unwrap_latex_text

_EVIDENCE_ID = re.compile(r"(?<![\w:/.@])([A-Za-z][\w\-]*:\d+)(?![\w:])")
_SEARCH = re.compile(r"\bSEARCH\s*[:(]\s*(.+?)\s*\)?\s*$", re.IGNORECASE | re.MULTILINE)
_FINISH = re.compile(r"\bFINISH\b", re.IGNORECASE)
_ANSWER_LINE = re.compile(r"^\s*(?:final\s+)?answer\s*[:：]\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
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


def evidence_ids_in(text: str) -> tuple[str, ...]:
    """Evidence ids (``doc:sentence``) mentioned in ``text``, first mention first."""
    return tuple(dict.fromkeys(_EVIDENCE_ID.findall(text)))


def parse_reader(text: str) -> ReaderAnswer:
    """Tolerant answer extraction: ``\\boxed{}``, an ``Answer:`` line, "the answer is …",
    else the first non-empty line. Evidence ids anywhere in the text count as citations."""
    citations = evidence_ids_in(text)
    answer = boxed_answer(text)
    if answer is not None:
        answer = unwrap_latex_text(answer)
    else:
        match = _ANSWER_LINE.search(text) or _ANSWER_IS.search(text)
        if match:
            answer = match.group(1)
        else:
            lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().lower().startswith("evidence")]
            answer = lines[0] if lines else None
    if answer is not None:
        # Citations and wrapping punctuation are not part of the answer.
        answer = re.sub(r"\[[^\]]*:\d+[^\]]*\]", "", answer)
        answer = _EVIDENCE_ID.sub("", answer).strip().strip("*\"'`").rstrip(".").strip()
    if not answer:
        return ReaderAnswer(None, citations, error="no answer found in the reader output")
    return ReaderAnswer(answer, citations)
