"""What every retriever returns (``Passage``) and the protocol retrievers implement.

Scopes (docs/design.md §8): ``candidates=None`` searches the whole index (scope ``"corpus"``);
a list of doc ids restricts the search to those documents (scope ``"candidates"``, the
distractor setting), without re-indexing anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from memsearch.data.records import Document, evidence_id

Scope = Literal["corpus", "candidates"]


class Passage(BaseModel):
    """One retrieved document with its sentences keyed by evidence id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    doc_id: str = Field(description="Id of the retrieved document")
    title: str = Field(description="Title of the document")
    sentences: list[tuple[str, str]] = Field(
        description="(evidence id 'doc_id:i', sentence text) for every sentence, in order"
    )
    score: float = Field(description="Retrieval score; higher is better, comparable within one query only")
    rank: int = Field(ge=0, description="0-based position in the result list")

    @property
    def evidence_ids(self) -> list[str]:
        return [eid for eid, _ in self.sentences]

    @property
    def text(self) -> str:
        """The paragraph as one string, like ``Document.text``."""
        return "".join(sentence for _, sentence in self.sentences)


def passage_from_document(document: Document, score: float, rank: int) -> Passage:
    """The passage a retriever returns for ``document`` at ``rank`` with ``score``."""
    # A validated Document yields valid fields; skipping re-validation is ~30 % of search time.
    return Passage.model_construct(
        doc_id=document.doc_id,
        title=document.title,
        sentences=[(evidence_id(document.doc_id, i), s) for i, s in enumerate(document.sentences)],
        score=float(score),
        rank=rank,
    )


def scope_of(candidates: Sequence[str] | None) -> Scope:
    """The retrieval scope a ``candidates`` argument stands for."""
    return "corpus" if candidates is None else "candidates"


def check_search_args(
    queries: Sequence[str], k: int, candidates: Sequence[Sequence[str] | None] | None
) -> tuple[list[str], list[Sequence[str] | None]]:
    """The queries as a list and one candidate list (or ``None``) per query, after the checks
    every ``search_many`` makes (``TypeError`` / ``ValueError`` naming the problem)."""
    if isinstance(queries, str):
        raise TypeError("queries must be a sequence of strings, not one string (use search())")
    queries = list(queries)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if candidates is None:
        return queries, [None] * len(queries)
    per_query = list(candidates)
    if len(per_query) != len(queries):
        raise ValueError(
            f"candidates has {len(per_query)} entries for {len(queries)} queries; give one list (or None) per query"
        )
    for c in per_query:
        if isinstance(c, str):
            raise TypeError("candidates must be a list of doc ids, not one string")
    return queries, per_query


def unknown_ids_error(unknown: Sequence[str], size: int, limit: int = 10) -> ValueError:
    """The ``ValueError`` for candidate ids an index does not hold."""
    shown = ", ".join(repr(x) for x in unknown[:limit])
    more = f" and {len(unknown) - limit} more" if len(unknown) > limit else ""
    return ValueError(f"unknown candidate doc ids (not in this index of {size} documents): {shown}{more}")


@runtime_checkable
class Retriever(Protocol):
    """A searchable index of documents.

    Contract shared by all implementations: results are sorted by score (best first) with ties
    broken by corpus order, so the same query always gives the same list; at most ``k``
    passages come back (fewer when fewer documents match, never an error); with
    ``candidates`` only those documents can be returned, and an id the index does not hold
    raises ``ValueError`` naming it.
    """

    name: str

    def search(self, query: str, k: int = 5, candidates: Sequence[str] | None = None) -> list[Passage]:
        """Top-``k`` passages for one query; ``candidates=None`` means the whole corpus."""
        ...

    def search_many(
        self,
        queries: Sequence[str],
        k: int = 5,
        candidates: Sequence[Sequence[str] | None] | None = None,
    ) -> list[list[Passage]]:
        """``search`` for many queries at once; ``candidates`` is ``None`` (corpus scope for
        all) or one candidate list (or ``None``) per query."""
        ...
