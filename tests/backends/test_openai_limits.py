"""OpenAIBackend against a real loopback server that answers with bodies larger than the request
can legitimately return (issue 54): 30 MB completions with and without a Content-Length, gzip
bodies that inflate a thousandfold, completions longer than the tokens asked. Each is an errored
result naming the bound, read no further than the bound (memory measured), never retried; a body
just under the bound is accepted."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import tracemalloc
import zlib
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memsearch.backends.base import GenerationRequest, SamplingParams
from memsearch.backends.openai import OpenAIBackend
from memsearch.backends.response_limits import FLOOR_BYTES, MAX_CHARS_PER_TOKEN, response_byte_limit

MB = 1 << 20


class Reply:
    """One answer: status, headers, the body as chunks, and whether its length is announced
    (otherwise it is sent chunked)."""

    def __init__(self, chunks: Iterable[bytes], *, status: int = 200, headers: dict[str, str] | None = None,
                 announce: bool = True) -> None:
        self.chunks, self.status, self.headers, self.announce = chunks, status, headers or {}, announce


class HostileServer:
    """A loopback HTTP server answering every POST with ``plan(request body)``."""

    def __init__(self) -> None:
        self.plan: Callable[[dict[str, Any]], Reply] = lambda body: Reply([b"{}"])
        self.requests: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                reply = owner.plan(body)
                chunks = list(reply.chunks) if reply.announce else reply.chunks
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                if reply.announce:
                    self.send_header("Content-Length", str(sum(map(len, chunks))))
                else:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for chunk in chunks:
                        if not reply.announce:
                            self.wfile.write(b"%x\r\n" % len(chunk))
                        self.wfile.write(chunk)
                        if not reply.announce:
                            self.wfile.write(b"\r\n")
                    if not reply.announce:
                        self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client stopped reading: what it should do

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda *args: None  # a client that stopped reading is expected here
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = HostileServer()
    yield s
    s.stop()


def chat(text: str, completion_tokens: int | None = 3, **extra: Any) -> bytes:
    body: dict[str, Any] = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                         "finish_reason": "stop"}], **extra}
    if completion_tokens is not None:
        body["usage"] = {"prompt_tokens": 5, "completion_tokens": completion_tokens}
    return json.dumps(body).encode()


def request(max_tokens: int = 64, logprobs: bool = False) -> GenerationRequest:
    return GenerationRequest(role="reader", messages=({"role": "user", "content": "Who directed Ed Wood?"},),
                             sampling=SamplingParams(max_tokens=max_tokens, logprobs=logprobs))


def generate(server: HostileServer, req: GenerationRequest, **kwargs: Any):
    backend = OpenAIBackend(server.base_url, "m", max_retries=2, backoff_base_s=0.01, timeout_s=60, **kwargs)

    async def go():
        try:
            return (await backend.generate([req]))[0]
        finally:
            await backend.aclose()

    result = asyncio.run(go())
    return result, backend.stats()


def traced_generate(server, req):
    """``generate`` with the peak of traced Python memory during it: ``(result, stats, peak)``."""
    tracemalloc.start()
    try:
        result, stats = generate(server, req)
        return result, stats, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def pieces(data: bytes, size: int = 1 << 16) -> Iterable[memoryview]:
    # Views, not copies: the server thread's own memory must not count in the client's measured peak.
    view = memoryview(data)
    return (view[i:i + size] for i in range(0, len(data), size))


@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "chunked"])
def test_30_mb_completion_for_64_tokens_is_an_error_read_no_further(server, announce):
    big = chat("x" * (30 * MB))
    server.plan = lambda body: Reply(pieces(big), announce=announce)
    result, stats, peak = traced_generate(server, request(64))
    assert result.finish_reason == "error" and result.text == ""
    assert "response too large" in result.error and "max_tokens=64" in result.error, result.error
    assert ("announced" in result.error) is announce
    assert result.attempts == 1 and len(server.requests) == 1  # not retried
    assert result.error.endswith("[1 attempt, last HTTP status 200]"), result.error
    assert stats["errors"] == {"oversized": 1} and stats["failed"] == 1
    # The client holds at most the bound (about 1 MiB here), never the 30 MB; tracemalloc also sees
    # the in-process server's write buffers (7.7 MB measured with Content-Length on a quiet machine).
    assert peak < 16 * MB, peak


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    # 128 MiB of zeros in about 130 KB of gzip.
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    zeros = bytes(MB)
    return b"".join([*(packer.compress(zeros) for _ in range(128)), packer.flush()])


@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "chunked"])
def test_gzip_bomb_is_inflated_no_further_than_the_bound(server, gzip_bomb, announce):
    assert len(gzip_bomb) < FLOOR_BYTES // 2  # the compressed body alone is within the bound
    server.plan = lambda body: Reply(pieces(gzip_bomb), headers={"Content-Encoding": "gzip"}, announce=announce)
    result, stats, peak = traced_generate(server, request(64))
    assert result.finish_reason == "error"
    assert "response too large" in result.error and "Content-Encoding: gzip" in result.error, result.error
    assert stats["errors"] == {"oversized": 1} and result.attempts == 1
    assert peak < 16 * MB, peak  # not the 128 MiB it inflates to


def test_oversized_error_body_is_not_read_whole(server):
    huge = b'{"error": "' + b"e" * (20 * MB) + b'"}'
    server.plan = lambda body: Reply(pieces(huge), status=500, announce=False)
    result, stats = generate(server, request(64))
    assert "response too large" in result.error and stats["errors"] == {"oversized": 1}
    assert len(server.requests) == 1


def test_completion_longer_than_the_tokens_asked(server):
    # Within the byte bound, but more text than 8 tokens can hold.
    server.plan = lambda body: Reply([chat("y" * (8 * MAX_CHARS_PER_TOKEN + 1), completion_tokens=None)])
    result, stats = generate(server, request(8))
    assert "response too large" in result.error and "8 tokens can hold" in result.error, result.error
    # The server's own usage says it ignored max_tokens.
    server.plan = lambda body: Reply([chat("short", completion_tokens=9_000)])
    result, _ = generate(server, request(64))
    assert "reports 9,000 completion tokens, more than the 64 asked" in result.error, result.error
    # Exactly what was asked is fine.
    server.plan = lambda body: Reply([chat("z" * (8 * MAX_CHARS_PER_TOKEN), completion_tokens=8)])
    result, _ = generate(server, request(8))
    assert result.error is None and len(result.text) == 8 * MAX_CHARS_PER_TOKEN


def padded_to(size: int, text: str) -> bytes:
    """A valid completion body of exactly ``size`` bytes (padded with a field the client ignores)."""
    bare = chat(text, completion_tokens=1, padding="")
    return chat(text, completion_tokens=1, padding="p" * (size - len(bare)))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(max_tokens=st.integers(1, 4096), logprobs=st.booleans(), n=st.sampled_from([None, 1, 3]),
       compressed=st.booleans())
def test_body_at_the_bound_is_accepted_one_byte_more_is_not(server, max_tokens, logprobs, n, compressed):
    extra = {} if n is None else {"n": n}
    backend = OpenAIBackend(server.base_url, "m", extra_body=extra)
    path, body = backend.build_body(request(max_tokens, logprobs))
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    limit = response_byte_limit(body, len(payload))
    assert limit >= FLOOR_BYTES + (n or 1) * max_tokens * 256
    for size, ok in ((limit, True), (limit + 1, False)):
        data = padded_to(size, "answer")
        assert len(data) == size
        headers = {"Content-Encoding": "gzip"} if compressed else {}
        server.plan = lambda body, data=data, headers=headers: Reply(
            [gzip.compress(data, 1)] if compressed else pieces(data), headers=headers)
        result, _ = generate(server, request(max_tokens, logprobs), extra_body=extra)
        assert (result.error is None) is ok, (size, limit, result.error)
        if ok:
            assert result.text == "answer"
