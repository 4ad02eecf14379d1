"""Benchmark: gold-paragraph recall of BM25, dense (MiniLM + faiss) and hybrid (RRF) retrieval.

    uv run python bench/retrieval_quality.py

Queries: the 1000 shipped HotpotQA dev questions, the question itself as the query. Corpus: every
distinct paragraph of those questions (~9.8k). For each method and scope (``corpus``: the whole
corpus; ``candidates``: the question's 10 distractor-setting paragraphs) the mean over questions
of the fraction of its gold paragraphs in the top 2 / 5 / 10 (BM25 is the baseline, in the same
run). In candidate scope @10 is 1 by construction (10 candidates); @2 is the informative figure.
Goal: hybrid not below BM25 at @10 on corpus scope. The dense index is built once (~5 min on 2
CPU cores) and cached (``bench/retrieval_common.py``). The last line is machine-readable:

    RESULT <method>_<scope>_r<k>=<recall> ... hybrid_minus_bm25_corpus_r10=<difference>
"""

from __future__ import annotations

import time

from retrieval_common import dense_index, dev_dataset

from memsearch.retrieval import BM25Retriever
from memsearch.retrieval.hybrid import HybridRetriever

KS = (2, 5, 10)


def recall(retriever, tasks, labels, scope: str) -> dict[int, float]:
    """Mean gold-paragraph recall@k for each k of ``KS``."""
    found = retriever.search_many([t.question for t in tasks], max(KS),
                                  None if scope == "corpus" else [t.doc_ids for t in tasks])
    out = {}
    for k in KS:
        per = [len(set(labels[t.id].gold_doc_ids) & {p.doc_id for p in hits[:k]}) / len(labels[t.id].gold_doc_ids)
               for t, hits in zip(tasks, found)]
        out[k] = sum(per) / len(per)
    return out


def main() -> None:
    dataset = dev_dataset()
    tasks = [t for t in dataset.tasks]
    labels = {lab.id: lab for lab in dataset.labels}
    print(f"{len(tasks)} questions, {len(dataset.documents)} paragraphs")
    dense, build_s, _ = dense_index(dataset.documents)
    print(f"dense index: {'built in %.0fs' % build_s if build_s else 'cached'}")
    bm25 = dense.bm25 or BM25Retriever.build(dataset.documents)
    methods = {"bm25": bm25, "dense": dense, "hybrid": HybridRetriever(bm25, dense)}
    figures: dict[str, float] = {}
    for name, retriever in methods.items():
        for scope in ("corpus", "candidates"):
            start = time.perf_counter()
            r = recall(retriever, tasks, labels, scope)
            took = time.perf_counter() - start
            print(f"{name:7s} {scope:10s} " + "  ".join(f"R@{k} {r[k]:.3f}" for k in KS) + f"   ({took:.1f}s)")
            figures.update({f"{name}_{scope}_r{k}": r[k] for k in KS})
    diff = figures["hybrid_corpus_r10"] - figures["bm25_corpus_r10"]
    print(f"hybrid vs bm25 at @10, corpus scope: {diff:+.3f} ({'ok' if diff >= 0 else 'BELOW the goal'})")
    print(
        "RESULT " + " ".join(f"{k}={v:.3f}" for k, v in figures.items()) + f" hybrid_minus_bm25_corpus_r10={diff:.3f}"
    )


if __name__ == "__main__":
    main()
