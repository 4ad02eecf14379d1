"""Index folders of any method, and the retriever a run config asks for.

    build_index(documents, "dense", "runs/dense")     # or "bm25"; the folder must not exist
    retriever = open_index("runs/dense", "hybrid")    # the method must fit the folder
    retriever = make_retriever(config.retrieval, dataset.documents)

Which folders serve which method: a BM25 folder serves ``bm25``; a dense folder serves ``dense``
and ``hybrid`` (it holds a BM25 index of the same documents) and ``bm25``. ``describe`` is what
``run.json`` and the service's ``/info`` record about the index that answered.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memsearch.data.records import Document
from memsearch.errors import InputError, InputValueError

METHODS = ("bm25", "dense", "hybrid")


def build_index(documents: Sequence[Document], method: str, out: str | Path, index_type: str = "flat",
                show_progress: bool = False) -> Any:
    """Build a ``bm25`` or ``dense`` index over ``documents`` and save it to the new folder ``out``
    (checked first: ``check_new_index_folder``)."""
    check_new_index_folder(out)
    if method == "bm25":
        from memsearch.retrieval.bm25 import BM25Retriever

        retriever = BM25Retriever.build(documents, show_progress=show_progress)
    elif method == "dense":
        from memsearch.retrieval.dense import DenseRetriever

        retriever = DenseRetriever.build(documents, index_type=index_type, show_progress=show_progress)
    else:
        raise InputValueError(f"--method {method!r}: build 'bm25' or 'dense' (a dense folder also serves 'hybrid')")
    retriever.save(out)
    return retriever


def check_new_index_folder(out: str | Path) -> None:
    """``InputError`` (one line) unless ``out`` can become a new index folder: nothing is there,
    not even an empty folder or a dangling symlink, and the nearest existing folder above it is a
    writable folder. Checked before any work: saving is the last step of a build that can take
    minutes."""
    out = Path(out)
    if os.path.lexists(out):
        what = ("a dangling symlink" if not out.exists() else "a folder" if out.is_dir() else "a file")
        raise InputError(f"{out}: already exists ({what}); choose a new folder (nothing was written)")
    parent = out.parent
    while not parent.exists():
        if os.path.lexists(parent):
            raise InputError(f"{out}: {parent} is a dangling symlink; choose a new folder (nothing was written)")
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"{out}: {parent} is a file, not a folder; choose a new folder (nothing was written)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{out}: cannot create a folder in {parent} (not writable); choose another place")


def open_index(index_dir: str | Path, method: str | None = None) -> Any:
    """The retriever of ``method`` over a built folder (``None``: the folder's own method)."""
    from memsearch.retrieval.bm25 import FORMAT as BM25_FORMAT
    from memsearch.retrieval.bm25 import BM25Retriever
    from memsearch.retrieval.dense import BM25_DIR, DenseRetriever, read_manifest

    kind = read_manifest(Path(index_dir)).get("format")
    if kind == BM25_FORMAT:
        if method not in (None, "bm25"):
            raise InputError(f"{index_dir}: a BM25 index cannot serve method {method!r}; build one with --method dense")
        return BM25Retriever.load(index_dir)
    if method == "bm25":
        return BM25Retriever.load(Path(index_dir) / BM25_DIR)
    dense = DenseRetriever.load(index_dir)
    if method == "hybrid":
        from memsearch.retrieval.hybrid import HybridRetriever

        return HybridRetriever.from_dense(dense)
    return dense


def build_in_process(documents: Sequence[Document], method: str) -> Any:
    """A retriever of ``method`` built in memory (no folder): what a run without an index uses."""
    from memsearch.retrieval.bm25 import BM25Retriever

    if method == "bm25":
        return BM25Retriever.build(documents)
    from memsearch.retrieval.dense import DenseRetriever

    dense = DenseRetriever.build(documents)
    if method == "hybrid":
        from memsearch.retrieval.hybrid import HybridRetriever

        return HybridRetriever.from_dense(dense)
    return dense


def make_retriever(settings: Any, documents: Sequence[Document]) -> Any:
    """The retriever of a run's ``[retrieval]`` table: the service at ``url``, else the folder at
    ``index`` (refused when it indexes other documents than the data folder's), else one built in
    process over ``documents``."""
    from memsearch.retrieval.bm25 import documents_sha256

    if settings.url:
        from memsearch.retrieval.client import HttpRetriever

        retriever = HttpRetriever(settings.url)
        served = (retriever.describe()["info"] or {}).get("documents_sha256")
        if served is not None and served != documents_sha256(documents):
            raise InputError(f"retrieval.url {settings.url}: the service indexes other documents than the data "
                             "folder's corpus; serve an index built from this data folder")
        return retriever
    if settings.index:
        retriever = open_index(settings.index, settings.method)
        if retriever.fingerprint != documents_sha256(documents):
            raise InputError(f"retrieval.index {settings.index}: indexes other documents than the data folder's "
                             "corpus; build it from this data folder (`memsearch retrieval build --data ...`)")
        return retriever
    return build_in_process(documents, settings.method)


def describe(retriever: Any) -> dict[str, Any]:
    """What answered the searches: method, corpus SHA-256, and for dense/hybrid the manifest
    (for a service: its url and ``/info``)."""
    if hasattr(retriever, "describe"):
        return retriever.describe()
    out: dict[str, Any] = {"method": retriever.name, "num_docs": len(retriever),
                           "documents_sha256": retriever.fingerprint}
    dense = getattr(retriever, "dense", retriever)
    manifest = getattr(dense, "manifest", None)
    if manifest is not None:
        out.update(encoder=manifest["encoder"], index_type=manifest["index_type"], dim=manifest["dim"],
                   builder_version=manifest["builder_version"], faiss_sha256=manifest.get("faiss_sha256"))
    return out
