"""``HttpRetriever`` against a retrieval service whose answers are larger than the request can hold
(issue 54's oversized bodies, on the retrieval side): plain, chunked and gzip bodies past
``response_limit`` are a ``RetrievalRequestError`` naming the bound, read no further (memory
measured) and not retried; the real service's answer to the same request is accepted."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from memsearch.retrieval.client import BYTES_PER_HIT, HttpRetriever, RetrievalRequestError, response_limit
from memsearch.retrieval.server import load_service, running_service

MB = 1 << 20


@pytest.fixture(scope="module")
def oversized():
    """The base URL of ``oversized_server.py``, in a process of its own (its module doc: why)."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("oversized_server.py"))],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def url(bm25_dir):
    with running_service(load_service(str(bm25_dir))) as base:
        yield base


@pytest.mark.parametrize("route", ["announced", "chunked", "gzip"])
def test_an_answer_past_the_bound_is_an_error_read_no_further(oversized, route):
    def client_for(path: str) -> HttpRetriever:
        return HttpRetriever(f"{oversized}/{path}", backoff_base_s=0.01, seed=0)

    warm = client_for("chunked")  # one read first: the lazy imports of a first request are not the body
    with pytest.raises(RetrievalRequestError):
        warm.search("Ed Wood", k=2)
    client = client_for(route)

    async def search():
        try:
            return await client.asearch("Ed Wood", k=2)
        finally:
            await client.aclose()

    tracemalloc.start()
    try:
        with pytest.raises(RetrievalRequestError, match="response too large.*not retried") as caught:
            asyncio.run(search())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"{response_limit(1, 2):,}-byte bound" in str(caught.value)
    assert client.stats() == {"searches": 1, "attempts": 1, "failed": 1}
    if route == "announced":  # refused on its Content-Length, before any of the body is read
        assert "announced a 33,554," in str(caught.value)
    # The client alone (the server is another process): about its bound, neither the 32 MB body nor
    # the 64 MiB the gzip body inflates to (measured on a loaded CPU: chunked 1.7 MB, gzip 3.3 MB).
    assert peak < 8 * MB, peak


def test_the_services_own_answer_is_within_the_bound(url, bm25_dir):
    client = HttpRetriever(url, seed=0)
    hits = client.search_many(["Ed Wood film director", "Scott Derrickson American director"], k=10)
    assert [len(h) for h in hits] == [10, 10] and client.stats()["attempts"] == 1
    assert response_limit(2, 10) == (1 << 20) + 20 * BYTES_PER_HIT
