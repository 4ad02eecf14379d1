"""Benchmark: memsearch's BM25 retriever (bm25s) against a naive rank_bm25 loop.

    uv run python bench/retrieval.py

Corpus: every distinct paragraph of the shipped HotpotQA and MuSiQue samples (dev + train).
Queries: the 1000 HotpotQA dev-sample questions. Both sides see identical terms (the
retriever's own tokenizer feeds rank_bm25). Measures index build time, ``search_many``
throughput (scope "corpus", k=10), rank_bm25 throughput (one query at a time, get_scores +
argmax, as a researcher would write it) and top-1 agreement. Targets: >= 50x the queries per
second and >= 95 % top-1 agreement. The last line is machine-readable:

    RESULT qps_ratio=<bm25s/rank_bm25> top1_agreement=<fraction> build_s=<s> qps=<bm25s qps>
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from memsearch.data.hotpot import convert_hotpot
from memsearch.data.musique import convert_musique
from memsearch.data.records import Document
from memsearch.retrieval import BM25Retriever, BM25Settings, index_text

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"
SOURCES = [
    (convert_hotpot, SAMPLES / "hotpotqa" / "dev_distractor_sample.json", "dev"),
    (convert_hotpot, SAMPLES / "hotpotqa" / "train_sample.json", "train"),
    (convert_musique, SAMPLES / "musique" / "musique_ans_dev_sample.json", "dev"),
    (convert_musique, SAMPLES / "musique" / "musique_ans_train_sample.json", "train"),
]
K = 10
BASELINE_MAX_S = 90.0  # rank_bm25 is timed on a subset (>= 200 queries) when all would take longer
MIN_BASELINE_QUERIES = 200


def load_corpus() -> tuple[list[Document], list[str]]:
    """Distinct paragraphs of all samples with fresh ids, and the HotpotQA dev questions."""
    documents: dict[tuple[str, tuple[str, ...]], Document] = {}
    questions: list[str] = []
    for convert, path, split in SOURCES:
        data = convert(path, split=split, limit=None)
        for doc in data.documents:
            key = (doc.title, tuple(doc.sentences))
            if key not in documents:
                documents[key] = Document(doc_id=f"p{len(documents)}", title=doc.title, sentences=doc.sentences)
        if convert is convert_hotpot and split == "dev":
            questions = [task.question for task in data.tasks]
        print(f"  {path.name}: {len(data.documents)} documents, {len(data.tasks)} tasks")
    return list(documents.values()), questions


def top1(retriever: BM25Retriever, queries: list[str]) -> list[str | None]:
    return [hits[0].doc_id if hits else None for hits in retriever.search_many(queries, k=K)]


def agreement(ours: list[str | None], theirs: list[str | None]) -> tuple[float, int]:
    both = [(a, b) for a, b in zip(ours, theirs) if a is not None and b is not None]
    return (sum(a == b for a, b in both) / len(both) if both else float("nan")), len(both)


def main() -> None:
    import bm25s  # imported before timing: a one-off ~1.5 s (scipy) that is not index building
    from rank_bm25 import BM25Okapi

    print("loading samples through memsearch.data converters ...")
    documents, queries = load_corpus()
    print(f"corpus: {len(documents)} distinct paragraphs; queries: {len(queries)} HotpotQA dev questions")

    settings = BM25Settings()
    print(f"bm25s {bm25s.__version__} settings: {settings.model_dump()}")
    t0 = time.perf_counter()
    retriever = BM25Retriever.build(documents, settings)
    build_s = time.perf_counter() - t0
    print(f"build: {build_s:.2f} s ({repr(retriever)})")

    results = retriever.search_many(queries, k=K)  # warm-up pass (page cache, stemmer cache)
    passes = []
    for _ in range(3):
        t0 = time.perf_counter()
        again = retriever.search_many(queries, k=K)
        passes.append(time.perf_counter() - t0)
        assert again == results, "search results changed between identical passes"
    search_s = float(np.median(passes))
    qps = len(queries) / search_s
    ours = [hits[0].doc_id if hits else None for hits in results]
    print(f"bm25s search_many (scope corpus, k={K}): {len(queries)} queries in {search_s:.3f} s "
          f"(median of {', '.join(f'{p:.3f}' for p in passes)}) = {qps:.0f} queries/s")

    # Baseline over the very same terms.
    t0 = time.perf_counter()
    corpus_terms = [retriever.tokenize(index_text(doc)) for doc in documents]
    okapi = BM25Okapi(corpus_terms)  # k1=1.5, b=0.75 as ours
    print(f"rank_bm25 build (tokenize + BM25Okapi): {time.perf_counter() - t0:.2f} s")
    query_terms = [retriever.tokenize(q) for q in queries]
    theirs: list[str | None] = []
    timed_n, timed_s = 0, 0.0
    t0 = time.perf_counter()
    for i, terms in enumerate(query_terms):
        scores = okapi.get_scores(terms)
        best = int(np.argmax(scores))
        theirs.append(documents[best].doc_id if scores[best] > 0 else None)
        elapsed = time.perf_counter() - t0
        if i + 1 >= MIN_BASELINE_QUERIES and elapsed > BASELINE_MAX_S and i + 1 < len(query_terms):
            print(f"  rank_bm25 is slow: stopping after {i + 1} queries")
            break
        timed_n, timed_s = i + 1, elapsed
    base_qps = timed_n / timed_s
    subset = "" if timed_n == len(queries) else f" (timed on the first {timed_n} of {len(queries)} queries)"
    print(
        f"rank_bm25 get_scores+argmax, one query at a time: {timed_n} queries in {timed_s:.2f} s = {base_qps:.1f} "
        f"queries/s{subset}"
    )

    top1_agreement, n_both = agreement(ours[: len(theirs)], theirs)
    print(
        f"top-1 agreement (default method={settings.method!r}) over {n_both} queries both answer: {top1_agreement:.4f}"
    )
    # Variants: rank_bm25's Okapi idf is log((N-df+0.5)/(df+0.5)) with a floor for common terms,
    # bm25s's lucene idf is log(1 + (N-df+0.5)/(df+0.5)); other variants for comparison.
    for method in ("robertson", "atire"):
        variant = BM25Retriever.build(documents, settings.model_copy(update={"method": method}))
        frac, n = agreement(top1(variant, queries[: len(theirs)]), theirs)
        print(f"  variant method={method!r}: top-1 agreement {frac:.4f} over {n} queries")

    ratio = qps / base_qps
    ok = ratio >= 50 and top1_agreement >= 0.95
    print(f"targets (>= 50x qps, >= 0.95 top-1 agreement): {'met' if ok else 'NOT met'}")
    print(f"RESULT qps_ratio={ratio:.1f} top1_agreement={top1_agreement:.4f} build_s={build_s:.2f} qps={qps:.0f}")


if __name__ == "__main__":
    main()
