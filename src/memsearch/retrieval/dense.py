"""Dense retrieval: all-MiniLM-L6-v2 vectors (``encoder.py``) in a faiss index.

    from memsearch.retrieval import DenseRetriever
    index = DenseRetriever.build(documents)                  # exact inner product (IndexFlatIP)
    index = DenseRetriever.build(documents, index_type="hnsw")  # approximate, HNSW graph
    index.save("runs/dense")                                 # the folder must not exist yet
    index = DenseRetriever.load("runs/dense")
    index.search("Who directed Ed Wood?", k=5, candidates=task.doc_ids)

Each document is embedded as ``title + "\\n" + paragraph`` (``index_text``, as BM25 indexes it).
Vectors are unit length, so a score is the cosine similarity. Corpus scope asks faiss; candidate
scope scores the candidates' stored vectors exactly (a handful of dot products, no index walk),
so it is exact even over an HNSW index. Ties are broken by corpus order, as the ``Retriever``
contract says. Unlike BM25, every document has a score: a result list is always ``k`` long (or
the number of candidates).

The folder holds ``dense.faiss`` (faiss's own file, loadable by faiss-gpu), ``documents.jsonl``,
a BM25 index of the same documents in ``bm25/`` (so a hybrid retriever loads without
re-tokenizing the corpus) and ``memsearch_index.json``: corpus SHA-256, encoder name and weights
SHA-256, pooling, index type, dimension, counts, builder version.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from memsearch import DISTRIBUTION
from memsearch.data.records import Document
from memsearch.errors import InputError, InputValueError
from memsearch.io import atomic_output_dir, sha256_file, write_json
from memsearch.retrieval.base import Passage, check_search_args, passage_from_document, unknown_ids_error
from memsearch.retrieval.bm25 import (
    DOCUMENTS_FILE,
    META_FILE,
    BM25Retriever,
    documents_sha256,
    index_text,
    read_documents,
    write_documents,
)

FORMAT = "memsearch-dense-index"
FORMAT_VERSION = 1
# dense-1: MiniLM mean pooling + L2 norm, title "\n" paragraph, faiss IndexFlatIP / IndexHNSWFlat.
BUILDER_VERSION = "dense-1"
FAISS_FILE = "dense.faiss"
BM25_DIR = "bm25"
IndexType = Literal["flat", "hnsw"]


class DenseRetriever:
    """A faiss index of MiniLM vectors plus the documents it returns. Implements ``Retriever``.

    Build with ``build`` or ``load``; the constructor is internal. ``encoder`` is shared: the
    service's micro-batcher counts its ``encode_calls``.
    """

    name = "dense"

    def __init__(self, index: Any, documents: list[Document], encoder: Any, manifest: dict[str, Any],
                 bm25: BM25Retriever | None = None) -> None:
        self._index = index
        self._documents = documents
        self._row = {doc.doc_id: i for i, doc in enumerate(documents)}
        # Candidate scope scores these exactly; reconstructing once costs n * dim floats.
        self._vectors = index.reconstruct_n(0, index.ntotal)
        self.encoder = encoder
        self.manifest = manifest
        self.bm25 = bm25

    @classmethod
    def build(cls, documents: Iterable[Document], index_type: IndexType = "flat", hnsw_m: int = 32,
              ef_search: int = 128, encoder: Any = None, show_progress: bool = False) -> DenseRetriever:
        """Embed ``documents`` (kept in the given order, which breaks score ties) and index them."""
        import faiss

        from memsearch.retrieval.encoder import MiniLMEncoder

        docs = list(documents)
        if not docs:
            raise ValueError("cannot build an index from no documents")
        if len({d.doc_id for d in docs}) != len(docs):
            raise ValueError("duplicate doc ids, each document needs its own id")
        encoder = encoder or MiniLMEncoder()
        vectors = encoder.encode([index_text(d) for d in docs], show_progress=show_progress)
        if index_type == "flat":
            index = faiss.IndexFlatIP(encoder.dim)
        elif index_type == "hnsw":
            index = faiss.IndexHNSWFlat(encoder.dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efSearch = ef_search
        else:
            raise InputValueError(f"unknown index_type {index_type!r}; choose 'flat' or 'hnsw'")
        index.add(vectors)
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "builder_version": BUILDER_VERSION,
            "memsearch_version": _version(DISTRIBUTION), "faiss_version": faiss.__version__,
            "encoder": encoder.describe(), "pooling": "mean", "index_type": index_type,
            "hnsw": {"m": hnsw_m, "ef_search": ef_search} if index_type == "hnsw" else None,
            "metric": "inner_product", "dim": encoder.dim, "num_docs": len(docs), "num_vectors": int(index.ntotal),
            "documents_file": DOCUMENTS_FILE, "documents_sha256": documents_sha256(docs),
        }
        return cls(index, docs, encoder, manifest, BM25Retriever.build(docs))

    def save(self, out_dir: str | Path) -> Path:
        """Write the index to the new folder ``out_dir`` (refused if it exists); returns it."""
        import faiss

        out_dir = Path(out_dir)
        with atomic_output_dir(out_dir) as tmp:
            faiss.write_index(self._index, str(tmp / FAISS_FILE))
            write_documents(tmp / DOCUMENTS_FILE, self._documents)
            if self.bm25 is not None:
                self.bm25.save(tmp / BM25_DIR)
            write_json(tmp / META_FILE, {**self.manifest, "faiss_sha256": sha256_file(tmp / FAISS_FILE)})
        return out_dir

    @classmethod
    def load(cls, index_dir: str | Path, encoder: Any = None) -> DenseRetriever:
        """Open a folder written by ``save``; ``InputError`` names what is missing or changed,
        including an installed encoder whose weights differ from the ones the index was built with."""
        import faiss

        from memsearch.retrieval.encoder import MiniLMEncoder

        index_dir = Path(index_dir)
        meta = read_manifest(index_dir)
        if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
            raise InputError(
                f"{index_dir / META_FILE}: not a memsearch dense index of format version {FORMAT_VERSION}; rebuild it"
            )
        faiss_path = index_dir / FAISS_FILE
        if not faiss_path.is_file() or sha256_file(faiss_path) != meta.get("faiss_sha256"):
            raise InputError(f"{faiss_path}: missing or changed since the index was built; rebuild it")
        documents, _ = read_documents(index_dir, meta["documents_sha256"])
        index = faiss.read_index(str(faiss_path))
        if index.ntotal != len(documents) or index.d != meta["dim"]:
            raise InputError(
                f"{index_dir}: {index.ntotal} vectors of dim {index.d} for {len(documents)} documents; rebuild the "
                "index"
            )
        if isinstance(index, faiss.IndexHNSW) and meta.get("hnsw"):
            index.hnsw.efSearch = meta["hnsw"]["ef_search"]
        encoder = encoder or MiniLMEncoder()
        if encoder.weights_sha256 != meta["encoder"]["weights_sha256"]:
            raise InputError(
                f"{index_dir}: built with encoder weights {meta['encoder']['weights_sha256'][:12]}..., "
                f"the installed ones are {encoder.weights_sha256[:12]}...; rebuild the index"
            )
        bm25 = BM25Retriever.load(index_dir / BM25_DIR) if (index_dir / BM25_DIR).is_dir() else None
        return cls(index, documents, encoder, meta, bm25)

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the documents in index order (= of the saved ``documents.jsonl``)."""
        return self.manifest["documents_sha256"]

    @property
    def documents(self) -> list[Document]:
        """The indexed documents in index order (do not modify)."""
        return self._documents

    def __len__(self) -> int:
        return len(self._documents)

    def search(self, query: str, k: int = 5, candidates: Sequence[str] | None = None) -> list[Passage]:
        """Top-``k`` passages for ``query``, over the corpus or only ``candidates``."""
        return self.search_many([query], k, None if candidates is None else [candidates])[0]

    def search_many(
        self, queries: Sequence[str], k: int = 5, candidates: Sequence[Sequence[str] | None] | None = None
    ) -> list[list[Passage]]:
        """``search`` for each query with one encoder call for all of them."""
        return [
            [passage_from_document(self._documents[row], score, rank) for rank, (row, score) in enumerate(hits)]
            for hits in self.rows_many(queries, k, candidates)
        ]

    def rows_many(
        self, queries: Sequence[str], k: int, candidates: Sequence[Sequence[str] | None] | None = None
    ) -> list[list[tuple[int, float]]]:
        """``(row, score)`` lists, best first, ties by row: what ``search_many`` returns as passages."""
        queries, per_query = check_search_args(queries, k, candidates)
        rows_of = [None if c is None else self._rows(c) for c in per_query]  # all checked before encoding
        if not queries:
            return []
        vectors = self.encoder.encode(queries)
        results: list[list[tuple[int, float]]] = [[] for _ in queries]
        corpus = [i for i, rows in enumerate(rows_of) if rows is None]
        if corpus:
            # One extra hit lets a tie at the k-th place be seen and broken by row.
            depth = min(k + 1, len(self._documents))
            scores, ids = self._index.search(vectors[corpus], depth)
            for i, s_row, i_row in zip(corpus, scores, ids):
                results[i] = _best(i_row[i_row >= 0], s_row[i_row >= 0], k)
        for i, rows in enumerate(rows_of):
            if rows is not None and rows.size:
                results[i] = _best(rows, self._vectors[rows] @ vectors[i], k)
        return results

    def _rows(self, candidates: Sequence[str]) -> np.ndarray:
        unknown = sorted({c for c in candidates if c not in self._row})
        if unknown:
            raise unknown_ids_error(unknown, len(self._documents))
        return np.array(sorted({self._row[c] for c in candidates}), dtype=np.int64)


def _best(rows: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The ``k`` best ``(row, score)``, by score then row."""
    order = np.lexsort((rows, -scores))[:k]
    return list(zip(rows[order].tolist(), scores[order].astype(float).tolist()))


def read_manifest(index_dir: Path) -> dict[str, Any]:
    """``memsearch_index.json`` of an index folder (BM25 or dense), or ``InputError``."""
    path = Path(index_dir) / META_FILE
    if not Path(index_dir).is_dir():
        raise InputError(f"{index_dir}: no such index folder (expected one written by `memsearch retrieval build`)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: unreadable ({exc}); not a memsearch index folder") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: not a memsearch index description")
    return meta


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
