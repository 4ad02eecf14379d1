"""Benchmark: the retrieval service with and without its micro-batcher, and with its cache.

    uv run python bench/retrieval_service.py

64 concurrent clients (one aiohttp session, 64 workers, in a client process of their own) send the shipped
HotpotQA dev questions,
one query per request, to ``memsearch retrieval serve``'s application on a loopback port, for the
dense index and for BM25. The baseline is the same service in the same process over the same
index with batching off (``max_batch = 1``: every request is encoded and searched on its own);
the cache is off in both so every query is searched. Then the cache run: the same questions again
against a warm cache. Answers must be identical with batching on and off. Goal: dense
``batched_qps_ratio >= 5``. The dense index is the one ``bench/retrieval_quality.py`` builds and
caches (built here if absent, ~5-20 min once on 2 CPU cores). The last line is machine-readable:

    RESULT batched_qps_ratio=<dense batched/unbatched> p99_ms=<dense batched p99>
           cache_hit_qps_ratio=<cache hits/batched> ...
"""

from __future__ import annotations

import asyncio
import statistics
import time

from retrieval_common import dense_index, dev_dataset

from memsearch.retrieval.server import RetrievalService, ServiceSettings, running_service

CLIENTS = 64
QUERIES = {"dense": 640, "bm25": 2000}  # per run; unbatched dense runs ~50 qps on 2 cores
UNBATCHED_DENSE = 320  # the slow baseline is timed on the first half (its rate is flat)


async def load(url: str, questions: list[str]) -> tuple[float, list[float], list[list[str]]]:
    """(queries per second, latencies in ms, doc ids per question) for ``questions`` sent by 64 clients."""
    import aiohttp

    answers: list[list[str]] = [[] for _ in questions]
    latencies: list[float] = []
    todo = iter(range(len(questions)))

    async def client(session):
        for i in todo:
            start = time.perf_counter()
            async with session.post(url + "/retrieve", json={"queries": [questions[i]], "topk": 5}) as response:
                body = await response.json()
                assert response.status == 200, body
            latencies.append((time.perf_counter() - start) * 1000)
            answers[i] = [d["id"] for d in body["result"][0]]

    connector = aiohttp.TCPConnector(limit=CLIENTS)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(CLIENTS)))
        took = time.perf_counter() - start
    return len(questions) / took, latencies, answers


def load_elsewhere(url: str, questions: list[str]):
    """``load`` in a separate client process, so the 64 clients' Python work does not hold the
    service process's GIL (rollout workers run in processes of their own)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_load_sync, (url, questions))


def _load_sync(url: str, questions: list[str]):
    return asyncio.run(load(url, questions))


def p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98]


def run(retriever, questions: list[str], unbatched_n: int) -> dict[str, float]:
    """QPS batched / unbatched / from the cache, and p99 latency, for one retriever."""
    off = RetrievalService(retriever, ServiceSettings(max_batch=1, cache_size=0))
    with running_service(off) as url:
        load_elsewhere(url, questions[:CLIENTS])  # warm-up: first requests pay for imports and pools
        qps_off, lat_off, ans_off = load_elsewhere(url, questions[:unbatched_n])
    on = RetrievalService(retriever, ServiceSettings(max_batch=64, max_wait_ms=5, cache_size=0))
    with running_service(on) as url:
        load_elsewhere(url, questions[:CLIENTS])
        qps_on, lat_on, ans_on = load_elsewhere(url, questions)
    assert ans_on[:unbatched_n] == ans_off, "answers differ with batching on and off"
    cached = RetrievalService(retriever, ServiceSettings(max_batch=64, max_wait_ms=5, cache_size=100_000))
    with running_service(cached) as url:
        load_elsewhere(url, questions)  # fills the cache
        qps_hit, lat_hit, ans_hit = load_elsewhere(url, questions)
    assert ans_hit == ans_on and cached.counts["cache_hits"] >= len(questions)
    mean_batch = on.counts["searched"] / on.counts["batches"]
    return {
        "qps_unbatched": qps_off,
        "qps_batched": qps_on,
        "qps_cache": qps_hit,
        "ratio": qps_on / qps_off,
        "cache_ratio": qps_hit / qps_on,
        "p99_ms": p99(lat_on),
        "p99_unbatched_ms": p99(lat_off),
        "p99_cache_ms": p99(lat_hit),
        "mean_batch": mean_batch,
    }


def main() -> None:
    dataset = dev_dataset()
    dense, build_s, _ = dense_index(dataset.documents)
    print(f"{len(dataset.documents)} paragraphs; dense index {'built in %.0fs' % build_s if build_s else 'cached'}")
    # Distinct queries: 1000 questions, repeated with a suffix for the larger BM25 run, so no
    # search is answered by an identical one in flight.
    questions = [t.question for t in dataset.tasks]
    questions += [q + " ?" for q in questions]
    results = {}
    for name, retriever, n, unbatched in (
        ("dense", dense, QUERIES["dense"], UNBATCHED_DENSE),
        ("bm25", dense.bm25, QUERIES["bm25"], QUERIES["bm25"]),
    ):
        r = results[name] = run(retriever, questions[:n], unbatched)
        print(
            f"{name:5s} unbatched {r['qps_unbatched']:7.1f} qps (p99 {r['p99_unbatched_ms']:.0f} ms) | batched "
            f"{r['qps_batched']:7.1f} qps (p99 {r['p99_ms']:.0f} ms, mean batch {r['mean_batch']:.1f}) | cache hits "
            f"{r['qps_cache']:7.1f} qps (p99 {r['p99_cache_ms']:.0f} ms) | batched/unbatched {r['ratio']:.2f}x"
        )
    d, b = results["dense"], results["bm25"]
    print(
        f"dense batched_qps_ratio {d['ratio']:.2f} ({'meets' if d['ratio'] >= 5 else 'BELOW'} the goal of 5); answers "
        "identical"
    )
    print(
        f"RESULT batched_qps_ratio={d['ratio']:.2f} p99_ms={d['p99_ms']:.0f} "
        f"cache_hit_qps_ratio={d['cache_ratio']:.2f} "
        f"dense_qps={d['qps_batched']:.0f} dense_unbatched_qps={d['qps_unbatched']:.0f} "
        f"bm25_batched_qps_ratio={b['ratio']:.2f} bm25_p99_ms={b['p99_ms']:.0f} "
        f"bm25_cache_hit_qps_ratio={b['cache_ratio']:.2f}"
    )


if __name__ == "__main__":
    main()
