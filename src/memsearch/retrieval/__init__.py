"""Retrieval over a corpus of documents: the ``Passage`` record, the ``Retriever`` protocol,
and the default BM25 implementation (bm25s)."""

from memsearch.retrieval.base import Passage, Retriever, Scope, passage_from_document, scope_of
from memsearch.retrieval.bm25 import BM25Retriever, BM25Settings, index_text

__all__ = [
    "BM25Retriever",
    "BM25Settings",
    "Passage",
    "Retriever",
    "Scope",
    "index_text",
    "passage_from_document",
    "scope_of",
]
