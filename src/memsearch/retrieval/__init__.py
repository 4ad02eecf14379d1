"""Retrieval over a corpus of documents: the ``Passage`` record, the ``Retriever`` protocol,
BM25 (bm25s), dense (MiniLM + faiss), hybrid (reciprocal-rank fusion) and the client of the
retrieval service (docs/design.md §8).

Dense, hybrid and HTTP retrievers are imported lazily (``from memsearch.retrieval import
DenseRetriever`` works) so that importing this package never loads torch or faiss.
"""

from memsearch.retrieval.base import Passage, Retriever, Scope, passage_from_document, scope_of
from memsearch.retrieval.bm25 import BM25Retriever, BM25Settings, index_text

_LAZY = {
    "DenseRetriever": "memsearch.retrieval.dense",
    "HybridRetriever": "memsearch.retrieval.hybrid",
    "HttpRetriever": "memsearch.retrieval.client",
    "RetrievalRequestError": "memsearch.retrieval.client",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memsearch.retrieval' has no attribute {name!r}")


__all__ = [
    "BM25Retriever",
    "BM25Settings",
    "DenseRetriever",
    "HttpRetriever",
    "HybridRetriever",
    "Passage",
    "RetrievalRequestError",
    "Retriever",
    "Scope",
    "index_text",
    "passage_from_document",
    "scope_of",
]
