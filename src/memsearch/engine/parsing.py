"""Reading decisions out of real model text. Nothing here raises on model output: a text that
cannot be read becomes an invalid action with a reason.

The controller grammar and evidence-id finding live in ``memsearch.actions`` (below the backends,
whose ``oracle`` needs them too, docs/design.md §11) and are re-exported here for the engine."""

from __future__ import annotations

import re
from dataclasses import dataclass

from memsearch.eval.metrics import boxed_answer, unwrap_latex_text

# Re-exported: the engine and its callers read the controller grammar and evidence ids here.
from memsearch.actions import EVIDENCE_ID_IN_TEXT as _EVIDENCE_ID
from memsearch.actions import ControllerAction, evidence_ids_in, parse_controller  # noqa: F401

_ANSWER_LINE = re.compile(r"^\s*(?:final\s+)?answer\s*[:：]\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_ANSWER_IS = re.compile(r"\bthe (?:final )?answer is[:\s]+(.+?)(?:\.\s|\.$|\n|$)", re.IGNORECASE)


@dataclass(frozen=True)
class ReaderAnswer:
    """The answer text (``None`` when none could be read) and the evidence ids cited."""

    answer: str | None
    citations: tuple[str, ...]
    error: str | None = None

    def to_dict(self) -> dict:
        return {"answer": self.answer, "citations": list(self.citations), "error": self.error}


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
