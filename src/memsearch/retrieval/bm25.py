"""BM25 retrieval over documents with bm25s: build, save, load, search.

    from memsearch.retrieval import BM25Retriever
    index = BM25Retriever.build(documents)            # Iterable[Document]
    index.save("runs/index")                           # the folder must not exist yet
    index = BM25Retriever.load("runs/index")           # score arrays memory-mapped
    index.search("Who directed Ed Wood?", k=5)         # scope "corpus"
    index.search("...", k=5, candidates=task.doc_ids)  # scope "candidates"

Each document is indexed as ``title + "\\n" + paragraph text``. The analyzer settings
(lower-casing, stop words, stemmer, token pattern) are saved with the index and reloaded from
it, so queries are always tokenized exactly as the documents were; query terms the index has
never seen are ignored.

Documents whose score is 0 are never returned: with the supported BM25 variants a zero score
means the document shares no (informative) term with the query, and padding a result list
with them would show the agent arbitrary text. A query with no known term returns ``[]``.
Candidate scope multiplies the scores by a 0/1 weight mask over the corpus (bm25s's
``weight_mask``), so a document outside the candidates scores 0 and is dropped by that rule.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from memsearch.config import config_json
from memsearch.data.records import Document
from memsearch.errors import InputError, Problem
from memsearch.io import atomic_output_dir, dumps_line, iter_jsonl, sha256_file, write_json
from memsearch.retrieval.base import Passage, check_search_args, passage_from_document, unknown_ids_error

FORMAT = "memsearch-bm25-index"
FORMAT_VERSION = 1
META_FILE = "memsearch_index.json"
DOCUMENTS_FILE = "documents.jsonl"
# What bm25s's BM25.save writes for the supported methods (no non-occurrence array).
BM25S_FILES = (
    "params.index.json",
    "vocab.index.json",
    "data.csc.index.npy",
    "indices.csc.index.npy",
    "indptr.csc.index.npy",
)

# Stop-word lists shipped with bm25s, by the names a settings file may use.
_STOPWORD_LISTS = {
    "en": "STOPWORDS_EN", "english": "STOPWORDS_EN", "en_plus": "STOPWORDS_EN_PLUS",
    "de": "STOPWORDS_GERMAN", "nl": "STOPWORDS_DUTCH", "fr": "STOPWORDS_FRENCH",
    "es": "STOPWORDS_SPANISH", "pt": "STOPWORDS_PORTUGUESE", "it": "STOPWORDS_ITALIAN",
    "ru": "STOPWORDS_RUSSIAN", "sv": "STOPWORDS_SWEDISH", "no": "STOPWORDS_NORWEGIAN",
    "zh": "STOPWORDS_CHINESE", "tr": "STOPWORDS_TURKISH", "ko": "STOPWORDS_KOREAN",
    "da": "STOPWORDS_DANISH",
}


class BM25Settings(BaseModel):
    """How documents and queries are turned into terms, and how BM25 scores them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lowercase: bool = Field(default=True, description="Lower-case text before splitting it into tokens")
    stopwords: str | list[str] | None = Field(
        default="en",
        description="Tokens to drop (matched after lower-casing, before stemming): the name of a "
        f"bm25s stop-word list ({', '.join(sorted(_STOPWORD_LISTS))}), an explicit list, or None "
        "for none. The resolved list is saved with the index, so a later bm25s release that "
        "edits its lists cannot change how a saved index tokenizes queries",
    )
    stemmer: str | None = Field(
        default="english",
        description="PyStemmer (Snowball) algorithm applied to every token, e.g. 'english'; None "
        "keeps tokens as they are",
    )
    token_pattern: str = Field(
        default=r"(?u)\b\w\w+\b",
        description="Regular expression whose matches are the tokens (bm25s's and scikit-learn's "
        "default: words of two or more characters); it must not contain capturing groups",
    )
    method: Literal["lucene", "robertson", "atire"] = Field(
        default="lucene",
        description="BM25 variant of bm25s (idf and term-frequency formulas, Kamphuis et al. "
        "2020). Only variants where a document sharing no query term scores exactly 0",
    )
    k1: float = Field(default=1.5, ge=0, description="Term-frequency saturation")
    b: float = Field(default=0.75, ge=0, le=1, description="Document-length normalization (0 = none, 1 = full)")

    @field_validator("stopwords")
    @classmethod
    def _known_stopwords(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, str) and value not in _STOPWORD_LISTS:
            raise ValueError(
                f"unknown stop-word list {value!r}; choose one of {sorted(_STOPWORD_LISTS)}, a list of words, or None"
            )
        return value

    @field_validator("stemmer")
    @classmethod
    def _known_stemmer(cls, value: str | None) -> str | None:
        if value is not None:
            import Stemmer

            if value not in Stemmer.algorithms():
                raise ValueError(f"unknown stemmer {value!r}; choose one of {Stemmer.algorithms()} or None")
        return value

    @field_validator("token_pattern")
    @classmethod
    def _valid_pattern(cls, value: str) -> str:
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise ValueError(f"invalid regular expression: {exc}") from None
        if compiled.groups:
            raise ValueError("the token pattern has capturing groups; use non-capturing groups (?:...)")
        return value

    def resolved_stopwords(self) -> list[str]:
        """The stop words these settings drop, as a sorted list."""
        if self.stopwords is None:
            return []
        if isinstance(self.stopwords, str):
            from bm25s import stopwords as lists

            return sorted(set(getattr(lists, _STOPWORD_LISTS[self.stopwords])))
        return sorted(set(self.stopwords))


class _Analyzer:
    """Text to terms: lower-case, split with the token pattern, drop stop words, stem."""

    _CACHE_LIMIT = 1_000_000  # distinct words remembered; plenty for one corpus' vocabulary
    # ... and their characters: queries reach the memo too (the retrieval service), and a client
    # sending unique 4,096-character words would otherwise grow it to gigabytes before the count cap.
    _CACHE_CHARS = 32_000_000

    def __init__(self, settings: BM25Settings, stopwords: Iterable[str]) -> None:
        self._lower = settings.lowercase
        self._split = re.compile(settings.token_pattern).findall
        self._stop = frozenset(stopwords)
        self._stem = None
        if settings.stemmer is not None:
            import Stemmer

            self._stem = Stemmer.Stemmer(settings.stemmer).stemWord
        # word -> term ("" = dropped); stemming each word once makes indexing ~2x faster.
        # Not thread-safe (neither is a PyStemmer object): one analyzer per thread.
        self._terms: dict[str, str] = {}
        self._chars = 0  # characters of the words and terms in self._terms

    def _term(self, word: str) -> str:
        if word in self._stop:
            return ""
        return self._stem(word) if self._stem is not None else word

    def __call__(self, text: str) -> list[str]:
        if self._lower:
            text = text.lower()
        terms, out = self._terms, []
        for word in self._split(text):
            term = terms.get(word)
            if term is None:
                if len(terms) >= self._CACHE_LIMIT or self._chars >= self._CACHE_CHARS:
                    terms.clear()
                    self._chars = 0
                term = terms[word] = self._term(word)
                self._chars += len(word) + len(term)
            if term:
                out.append(term)
        return out


def index_text(document: Document) -> str:
    """The text indexed for a document: its title, a newline, then its paragraph."""
    return f"{document.title}\n{document.text}"


def _documents_bytes(documents: Sequence[Document]) -> Iterable[bytes]:
    for doc in documents:
        yield (dumps_line(doc.model_dump(mode="json")) + "\n").encode("utf-8")


def write_documents(path: Path, documents: Sequence[Document]) -> None:
    """``documents.jsonl`` of an index folder: canonical JSON lines in index order."""
    with open(path, "wb") as fh:
        fh.writelines(_documents_bytes(documents))


def documents_sha256(documents: Sequence[Document]) -> str:
    """SHA-256 of ``documents`` as written by ``write_documents`` (an index's corpus fingerprint)."""
    digest = hashlib.sha256()
    for line in _documents_bytes(documents):
        digest.update(line)
    return digest.hexdigest()


def read_documents(index_dir: Path, expected_sha256: str) -> tuple[list[Document], str]:
    """The documents of an index folder and their SHA-256, refused (``InputError``) when the
    file is missing, changed since the build, or holds an invalid document."""
    docs_path = index_dir / DOCUMENTS_FILE
    if not docs_path.is_file():
        raise InputError(f"{docs_path}: missing; the index folder is incomplete, rebuild it")
    fingerprint = sha256_file(docs_path)
    if fingerprint != expected_sha256:
        raise InputError(
            f"{docs_path}: content does not match the SHA-256 recorded in {META_FILE}; the file was changed after the "
            "index was built"
        )
    documents = []
    for lineno, obj in iter_jsonl(docs_path):
        try:
            documents.append(Document.model_validate(obj))
        except ValidationError as exc:
            raise InputError([Problem(str(docs_path), lineno, "document", _first_error(exc))]) from None
    return documents, fingerprint


class BM25Retriever:
    """A bm25s index plus the documents it returns and the settings that tokenize queries.

    Implements ``memsearch.retrieval.Retriever``. Build with ``build`` or ``load``; the
    constructor is internal.
    """

    name = "bm25"

    def __init__(
        self,
        model: Any,
        documents: list[Document],
        settings: BM25Settings,
        stopwords: list[str],
        fingerprint: str | None = None,
    ) -> None:
        self._model = model
        self._documents = documents
        self._row = {doc.doc_id: i for i, doc in enumerate(documents)}
        self.settings = settings
        self._stopwords = stopwords
        self._analyze = _Analyzer(settings, stopwords)
        self._fingerprint = fingerprint

    # ---------------------------------------------------------------- building and files

    @classmethod
    def build(
        cls, documents: Iterable[Document], settings: BM25Settings | None = None, show_progress: bool = False
    ) -> BM25Retriever:
        """Index ``documents`` (kept in the given order, which breaks score ties)."""
        import bm25s
        from tqdm.auto import tqdm

        settings = settings or BM25Settings()
        docs = list(documents)
        if not docs:
            raise ValueError("cannot build an index from no documents")
        counts = Counter(d.doc_id for d in docs)
        duplicates = sorted(doc_id for doc_id, n in counts.items() if n > 1)
        if duplicates:
            raise ValueError(f"duplicate doc ids, each document needs its own id: {_preview(duplicates)}")
        stopwords = settings.resolved_stopwords()
        analyze = _Analyzer(settings, stopwords)
        # Term ids in order of first occurrence, so the same documents give the same files
        # (bm25s's own token path numbers terms in set order, which varies between runs).
        vocab: dict[str, int] = {}
        corpus_ids = [
            [vocab.setdefault(term, len(vocab)) for term in analyze(index_text(doc))]
            for doc in tqdm(docs, desc="BM25 tokenize", disable=not show_progress)
        ]
        if not vocab:
            raise ValueError("no document has a single term under these settings; check token_pattern and stopwords")
        model = bm25s.BM25(k1=settings.k1, b=settings.b, method=settings.method, backend="numpy", csc_backend="scipy")
        model.index((corpus_ids, vocab), create_empty_token=False, show_progress=show_progress)
        return cls(model, docs, settings, stopwords)

    def save(self, out_dir: str | Path) -> Path:
        """Write the index to the new folder ``out_dir`` (refused if it exists); returns it.

        The folder holds bm25s's files (``params.index.json``, ``vocab.index.json``,
        ``data/indices/indptr.csc.index.npy``), ``documents.jsonl`` (the documents in index
        order) and ``memsearch_index.json`` (format, settings, resolved stop words, versions,
        counts and the SHA-256 of ``documents.jsonl``).
        """
        import bm25s

        out_dir = Path(out_dir)
        with atomic_output_dir(out_dir) as tmp:
            self._model.save(tmp, show_progress=False)
            write_documents(tmp / DOCUMENTS_FILE, self._documents)
            write_json(
                tmp / META_FILE,
                {
                    "format": FORMAT,
                    "format_version": FORMAT_VERSION,
                    "settings": config_json(self.settings),
                    "stopwords": self._stopwords,
                    "bm25s_version": bm25s.__version__,
                    "pystemmer_version": _pystemmer_version(),
                    "num_docs": len(self._documents),
                    "num_terms": len(self._model.vocab_dict),
                    "documents_file": DOCUMENTS_FILE,
                    "documents_sha256": self.fingerprint,
                },
            )
        return out_dir

    @classmethod
    def load(cls, index_dir: str | Path, mmap: bool = True) -> BM25Retriever:
        """Open an index written by ``save``; ``mmap`` maps the score arrays instead of reading them.

        Raises ``InputError`` naming the file when the folder is not a complete index.
        """
        import bm25s

        index_dir = Path(index_dir)
        if not index_dir.is_dir():
            raise InputError(f"{index_dir}: no such index folder (expected a folder written by BM25Retriever.save)")
        meta_path = index_dir / META_FILE
        if not meta_path.is_file():
            raise InputError(f"{meta_path}: missing; {index_dir} is not a memsearch BM25 index (no {META_FILE})")
        meta = _read_meta(meta_path)
        for name in BM25S_FILES:
            if not (index_dir / name).is_file():
                raise InputError(
                    f"{index_dir / name}: missing bm25s index file; the index folder is incomplete, rebuild it"
                )
        try:
            model = bm25s.BM25.load(index_dir, mmap=mmap, load_corpus=False, show_progress=False)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise InputError(
                f"{index_dir}: unreadable bm25s index files ({type(exc).__name__}: {exc}); rebuild the index"
            ) from None
        documents, fingerprint = read_documents(index_dir, meta["documents_sha256"])
        counts = {
            META_FILE: meta["num_docs"],
            DOCUMENTS_FILE: len(documents),
            "params.index.json": model.scores["num_docs"],
        }
        if len(set(counts.values())) != 1:
            raise InputError(f"{index_dir}: document counts disagree ({counts}); rebuild the index")
        return cls(model, documents, meta["settings"], meta["stopwords"], fingerprint)

    # ---------------------------------------------------------------- inspection

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the documents as canonical JSON lines in index order (= of the saved
        ``documents.jsonl``)."""
        if self._fingerprint is None:
            self._fingerprint = documents_sha256(self._documents)
        return self._fingerprint

    @property
    def documents(self) -> list[Document]:
        """The indexed documents in index order (do not modify)."""
        return self._documents

    def __len__(self) -> int:
        return len(self._documents)

    def __repr__(self) -> str:
        return (
            f"BM25Retriever({len(self._documents)} documents, {len(self._model.vocab_dict)} terms, {self.settings!r})"
        )

    def tokenize(self, text: str) -> list[str]:
        """The terms of ``text`` exactly as this index sees them (documents and queries alike),
        including terms the index does not hold."""
        return self._analyze(text)

    def term_ids(self, query: str) -> list[int]:
        """Index term ids of the query's terms that the index holds (repeats kept)."""
        vocab = self._model.vocab_dict
        return [vocab[t] for t in self._analyze(query) if t in vocab]

    # ---------------------------------------------------------------- search

    def search(self, query: str, k: int = 5, candidates: Sequence[str] | None = None) -> list[Passage]:
        """Top-``k`` passages for ``query``, over the corpus or only ``candidates``."""
        return self.search_many([query], k, None if candidates is None else [candidates])[0]

    def search_many(
        self, queries: Sequence[str], k: int = 5, candidates: Sequence[Sequence[str] | None] | None = None
    ) -> list[list[Passage]]:
        """``search`` for each query; ``candidates`` is None or one list (or None) per query."""
        queries, per_query = check_search_args(queries, k, candidates)
        masks = [None if c is None else self._mask(c) for c in per_query]  # all checked before any search
        results = []
        for query, mask in zip(queries, masks):
            term_ids = self.term_ids(query)
            if not term_ids:
                results.append([])
                continue
            # Scoring is bm25s's (sparse index, weight mask); selection is ours. bm25s's
            # retrieve() (numpy backend) is a per-query loop too, but its argpartition over
            # every document is slow on the many zero scores and breaks ties arbitrarily.
            scores = self._model.get_scores_from_ids(term_ids, weight_mask=mask)
            results.append(
                [
                    passage_from_document(self._documents[row], score, rank)
                    for rank, (row, score) in enumerate(self._topk(scores, k))
                ]
            )
        return results

    def _mask(self, candidates: Sequence[str]) -> np.ndarray:
        unknown = sorted({c for c in candidates if c not in self._row})
        if unknown:
            raise unknown_ids_error(unknown, len(self._documents))
        mask = np.zeros(len(self._documents), dtype=self._model.dtype)
        mask[[self._row[c] for c in candidates]] = 1
        return mask

    @staticmethod
    def _topk(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The k best positive scores, ties by row, from a full score vector."""
        rows = np.flatnonzero(scores > 0)
        values = scores[rows]
        if rows.size > k:
            kth = np.partition(values, rows.size - k)[rows.size - k]
            keep = values >= kth
            rows, values = rows[keep], values[keep]
        order = np.lexsort((rows, -values))[:k]
        return list(zip(rows[order].tolist(), values[order].tolist()))


def _preview(items: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(repr(x) for x in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "record"
    return f"{where}: {err['msg']}"


def _pystemmer_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("PyStemmer")
    except PackageNotFoundError:
        return None


def _read_meta(path: Path) -> dict[str, Any]:
    """Parse and check ``memsearch_index.json``; settings come back as ``BM25Settings``."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: unreadable ({exc}); expected the JSON written by BM25Retriever.save") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(f'{path}: not a memsearch BM25 index description (expected "format": "{FORMAT}")')
    if meta.get("format_version") != FORMAT_VERSION:
        raise InputError(
            f"{path}: index format version {meta.get('format_version')!r}, this memsearch reads version "
            f"{FORMAT_VERSION}; rebuild the index"
        )
    missing = [key for key in ("settings", "stopwords", "num_docs", "documents_sha256") if key not in meta]
    if missing:
        raise InputError(f"{path}: missing fields {missing}; rebuild the index")
    try:
        meta["settings"] = BM25Settings.model_validate(meta["settings"])
    except ValidationError as exc:
        raise InputError([Problem(str(path), None, "settings", _first_error(exc))]) from None
    if not isinstance(meta["stopwords"], list) or not all(isinstance(w, str) for w in meta["stopwords"]):
        raise InputError(f"{path}: stopwords: expected a list of strings")
    return meta
