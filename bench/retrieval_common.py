"""Shared by the retrieval benchmarks: the shipped HotpotQA dev sample (1000 questions, ~9.8k
distinct paragraphs) and its dense index, built once and kept in the memsearch cache folder
(keyed by the corpus SHA-256 and the encoder weights), so a second benchmark does not re-encode."""

from __future__ import annotations

from pathlib import Path

from memsearch.assets.samples import HOTPOT_DEV, samples_dir
from memsearch.data.hotpot import convert_hotpot


def dev_dataset():
    """The prepared 1000-question dev sample (documents, tasks, labels)."""
    return convert_hotpot(samples_dir() / HOTPOT_DEV, split="dev")


def dense_index(documents) -> tuple[object, float | None, Path]:
    """The dense retriever over ``documents``, its build seconds (``None`` when cached) and its folder."""
    import time

    from memsearch.assets.embedded import cache_root
    from memsearch.retrieval.bm25 import documents_sha256
    from memsearch.retrieval.dense import DenseRetriever
    from memsearch.retrieval.encoder import MiniLMEncoder

    encoder = MiniLMEncoder()
    folder = Path(cache_root()) / "bench" / f"dense-{documents_sha256(documents)[:16]}-{encoder.weights_sha256[:12]}"
    if folder.is_dir():
        return DenseRetriever.load(folder, encoder=encoder), None, folder
    start = time.perf_counter()
    retriever = DenseRetriever.build(documents, encoder=encoder, show_progress=True)
    build_s = time.perf_counter() - start
    retriever.save(folder)
    return retriever, build_s, folder
