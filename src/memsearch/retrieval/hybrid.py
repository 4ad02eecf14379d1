"""Hybrid retrieval: BM25 and dense lists fused by reciprocal rank (Cormack et al., SIGIR 2009).

A document's fused score is ``sum over lists of 1 / (rrf_k + rank)`` (rank 1-based; a list that
does not hold the document adds nothing), over the top ``depth`` of each list (in candidate scope
every candidate is ranked by both). Ties are broken by corpus order, as the ``Retriever`` contract
says. Rank fusion needs no score calibration between BM25 (unbounded) and cosine scores, which is
why it is the default.
"""

from __future__ import annotations

from collections.abc import Sequence

from memsearch.data.records import Document
from memsearch.retrieval.base import Passage, check_search_args, passage_from_document
from memsearch.retrieval.bm25 import BM25Retriever
from memsearch.retrieval.dense import DenseRetriever

RRF_K = 60  # the constant of the RRF paper, also Elasticsearch's and Vespa's default


class HybridRetriever:
    """BM25 + dense with reciprocal-rank fusion. Implements ``Retriever``.

    Both retrievers must index the same documents in the same order (a dense index folder holds
    its BM25 twin, ``DenseRetriever.bm25``).
    """

    name = "hybrid"

    def __init__(self, bm25: BM25Retriever, dense: DenseRetriever, rrf_k: int = RRF_K, depth: int = 100) -> None:
        if bm25.fingerprint != dense.fingerprint:
            raise ValueError("BM25 and dense indexes hold different documents; build both from one corpus")
        self.bm25, self.dense = bm25, dense
        self.rrf_k, self.depth = rrf_k, depth
        self._row = {doc.doc_id: i for i, doc in enumerate(dense.documents)}

    @classmethod
    def from_dense(cls, dense: DenseRetriever) -> HybridRetriever:
        """The hybrid of a dense index and the BM25 index saved beside it (built if absent)."""
        return cls(dense.bm25 or BM25Retriever.build(dense.documents), dense)

    @property
    def documents(self) -> list[Document]:
        """The indexed documents in index order (do not modify)."""
        return self.dense.documents

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the documents in index order."""
        return self.dense.fingerprint

    def __len__(self) -> int:
        return len(self.dense)

    def search(self, query: str, k: int = 5, candidates: Sequence[str] | None = None) -> list[Passage]:
        """Top-``k`` fused passages for ``query``, over the corpus or only ``candidates``."""
        return self.search_many([query], k, None if candidates is None else [candidates])[0]

    def search_many(self, queries: Sequence[str], k: int = 5,
                    candidates: Sequence[Sequence[str] | None] | None = None) -> list[list[Passage]]:
        """``search`` for each query (one dense encoder call for all of them)."""
        queries, per_query = check_search_args(queries, k, candidates)
        depth = max(k, self.depth)
        # Candidate lists are short (10 in the distractor setting): rank all of them.
        depths = [depth if c is None else max(k, len(c)) for c in per_query]
        lexical = [self.bm25.search_many([q], d, [c])[0] for q, d, c in zip(queries, depths, per_query)]
        dense = self.dense.rows_many(queries, max(depths) if queries else 1, per_query)
        out = []
        for lex, vec in zip(lexical, dense):
            fused: dict[int, float] = {}
            for rank, p in enumerate(lex, start=1):
                fused[self._row[p.doc_id]] = 1.0 / (self.rrf_k + rank)
            for rank, (row, _) in enumerate(vec, start=1):
                fused[row] = fused.get(row, 0.0) + 1.0 / (self.rrf_k + rank)
            best = sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:k]
            out.append(
                [passage_from_document(self.documents[row], score, rank) for rank, (row, score) in enumerate(best)]
            )
        return out
