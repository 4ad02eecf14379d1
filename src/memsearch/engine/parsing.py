"""Reading decisions out of real model text. Nothing here raises on model output: a text that
cannot be read becomes an invalid action with a reason. Every parser is linear in the length of
the text (model output is parsed inside the event loop of all concurrent episodes).

The controller grammar and evidence-id finding live in ``memsearch.text.actions`` (below the backends,
whose ``oracle`` needs them too, docs/design.md §11) and are re-exported here for the engine."""

from __future__ import annotations

import re
from dataclasses import dataclass

from memsearch.text.actions import ControllerAction, evidence_id_spans, evidence_ids_in, parse_controller  # noqa: F401
from memsearch.text.answers import boxed_prediction

# Inside a [...] group (searched between its brackets only): a "name:number" citation.
_CITATION_IN_BRACKETS = re.compile(r":\d")
_ANSWER_IS = re.compile(r"\bthe (?:final )?answer is[:\s]+(.+?)(?:\.\s|\.$|\n|$)", re.IGNORECASE)


@dataclass(frozen=True)
class ReaderAnswer:
    """The answer text (``None`` when none could be read) and the evidence ids cited."""

    answer: str | None
    citations: tuple[str, ...]
    error: str | None = None

    def to_dict(self) -> dict:
        return {"answer": self.answer, "citations": list(self.citations), "error": self.error}


def _drop_evidence_ids(text: str) -> str:
    out, last = [], 0
    for a, b in evidence_id_spans(text):
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
    """Tolerant answer extraction: a box (``memsearch.text.answers.boxed_answer``: ``\\boxed{}``,
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
