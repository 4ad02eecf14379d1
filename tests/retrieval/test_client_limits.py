"""``HttpRetriever`` against a retrieval service whose answers are larger than the request can hold
(issue 54's oversized bodies, on the retrieval side): plain, chunked and gzip bodies past
``response_limit`` are a ``RetrievalRequestError`` naming the bound, read no further (memory
measured) and not retried; the real service's answer to the same request is accepted."""

from __future__ import annotations

import asyncio
import tracemalloc
import zlib

import pytest

from memsearch.retrieval.client import BYTES_PER_HIT, HttpRetriever, RetrievalRequestError, response_limit
from memsearch.retrieval.server import load_service, running_service

MB = 1 << 20


def _gzip_zeros(mib: int) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    zeros = bytes(MB)
    return b"".join([*(packer.compress(zeros) for _ in range(mib)), packer.flush()])


@pytest.fixture(scope="module")
def url(bm25_dir):
    from aiohttp import web

    service = load_service(str(bm25_dir))
    # 32 MB: far past what the client may hold (about 1.1 MB here), so "read no further" is told
    # apart from "read it all" even with the in-process server's own write buffers in the peak.
    big = b'{"result": [[' + b" " * (32 * MB) + b"]]}"
    bomb = _gzip_zeros(64)

    async def announced(request):
        return web.Response(body=big, content_type="application/json")

    async def chunked(request):
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for i in range(0, len(big), 1 << 16):
            await response.write(big[i:i + (1 << 16)])
        await response.write_eof()
        return response

    async def gzipped(request):
        response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for i in range(0, len(bomb), 1 << 16):
            await response.write(bomb[i:i + (1 << 16)])
        await response.write_eof()
        return response

    app = service.app()
    for name, handler in (("announced", announced), ("chunked", chunked), ("gzip", gzipped)):
        app.router.add_post(f"/{name}/retrieve", handler)
    with running_service(service, app=app) as base:
        yield base


@pytest.mark.parametrize("route", ["announced", "chunked", "gzip"])
def test_an_answer_past_the_bound_is_an_error_read_no_further(url, route):
    client = HttpRetriever(f"{url}/{route}", backoff_base_s=0.01, seed=0)

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
    if route == "announced":  # refused on its Content-Length (the server's own buffer is in the peak)
        assert "announced a 33,554," in str(caught.value)
    else:
        # The client's bound plus what the server thread buffers (tracemalloc sees both: they share
        # the process; 1.6-3.3 MB here, 4.8 MB once on a loaded machine): neither the 32 MB body nor
        # the 64 MiB the gzip body inflates to.
        assert peak < 12 * MB, peak


def test_the_services_own_answer_is_within_the_bound(url, bm25_dir):
    client = HttpRetriever(url, seed=0)
    hits = client.search_many(["Ed Wood film director", "Scott Derrickson American director"], k=10)
    assert [len(h) for h in hits] == [10, 10] and client.stats()["attempts"] == 1
    assert response_limit(2, 10) == (1 << 20) + 20 * BYTES_PER_HIT
