"""The three record types of a prepared data folder, and evidence ids.

A prepared folder holds ``corpus.jsonl`` (``Document``), ``tasks.jsonl`` (``Task``: what an
agent may see) and ``labels.jsonl`` (``Label``: what only the scorer may see), plus
``manifest.json``. Tasks and labels are joined by ``id``; tasks never carry label fields.
"""

from __future__ import annotations

import unicodedata

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Keys that belong to labels; a task that carries any of them leaks the answer to the agent.
LABEL_KEYS = frozenset(
    {"answer", "answers", "answer_aliases", "supporting_facts", "gold_doc_ids", "gold_positions",
     "type", "level", "decomposition", "is_supporting"}
)


def has_visible_text(text: str) -> bool:
    """True when ``text`` holds a character a reader can see: not only white space and
    invisible format characters (zero-width space/joiners, BOM, word joiner: Unicode ``Cf``)."""
    return any(not ch.isspace() and unicodedata.category(ch) != "Cf" for ch in text)


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Document(_Record):
    """One paragraph. Its sentences are the units that evidence ids point at."""

    doc_id: str = Field(min_length=1, description="Stable id, unique in the corpus")
    title: str = Field(description="Title of the source article")
    sentences: list[str] = Field(
        min_length=1, description="Sentences in source order; blank ones are kept (real HotpotQA has them, and "
        "evidence ids count positions) but at least one must have visible text")

    @field_validator("sentences")
    @classmethod
    def _some_text(cls, sentences: list[str]) -> list[str]:
        if sentences and not any(has_visible_text(s) for s in sentences):
            raise ValueError("every sentence is blank, expected at least one with visible text")
        return sentences

    @property
    def text(self) -> str:
        """The paragraph as one string (HotpotQA sentences carry their own leading spaces)."""
        return "".join(self.sentences)


class Task(_Record):
    """What an agent may see of one question."""

    id: str = Field(min_length=1, description="Task id (the source dataset's question id)")
    question: str = Field(
        min_length=1, description="The question (visible text, not only white space or zero-width characters)"
    )
    doc_ids: list[str] = Field(
        description="Candidate documents (distractor setting), or, for long-context tasks, the "
        "documents of the context in the order they are rendered"
    )

    @field_validator("question")
    @classmethod
    def _question_visible(cls, question: str) -> str:
        if question and not has_visible_text(question):
            raise ValueError("no visible text (only white space or zero-width characters), expected the question")
        return question


class Label(_Record):
    """What only the scorer may see of one question."""

    id: str = Field(min_length=1, description="Task id this label belongs to")
    answers: list[str] = Field(min_length=1, description="Gold answer first, then aliases")
    supporting_facts: list[str] = Field(description="Gold evidence ids 'doc_id:sentence_index'")
    gold_doc_ids: list[str] = Field(description="Documents that hold the supporting facts")
    type: str | None = Field(default=None, description="Question type (bridge, comparison, 2hop, ...)")
    level: str | None = Field(default=None, description="Difficulty level when the source has one")
    gold_positions: list[int] | None = Field(
        default=None,
        description="Long-context sets only: 1-based 'Document {i}' numbers of the gold documents",
    )
    decomposition: list[dict[str, str]] | None = Field(
        default=None, description="Sub-questions with their answers, when the source has them (MuSiQue)"
    )


RECORD_TYPES: dict[str, type[_Record]] = {
    "corpus.jsonl": Document,
    "tasks.jsonl": Task,
    "labels.jsonl": Label,
}


def evidence_id(doc_id: str, sentence_index: int) -> str:
    """The unit of provenance: ``"{doc_id}:{sentence_index}"``."""
    return f"{doc_id}:{sentence_index}"


def split_evidence_id(eid: str) -> tuple[str, int] | None:
    """``(doc_id, sentence_index)`` of an evidence id, or ``None`` when it is malformed."""
    doc_id, sep, index = eid.rpartition(":")
    if not sep or not doc_id or not index.isdigit():
        return None
    return doc_id, int(index)
