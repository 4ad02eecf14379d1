"""Every error of the retrieval service is its JSON ``{"error": reason}`` (issue 54): a
``Content-Encoding`` it does not decode (``br`` was aiohttp's plain-text 400 with a traceback in the
log), a gzip body that does not inflate, unparsable requests, unknown paths and methods, unknown
``Expect``. Real service on loopback, raw sockets, generated variants; the log holds no traceback."""

from __future__ import annotations

import gzip
import json
import logging
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memsearch.retrieval.server import ServiceSettings, load_service, running_service
from memsearch.retrieval.service_errors import SUPPORTED_ENCODINGS

BODY = b'{"queries": ["Ed Wood"], "topk": 2}'


@pytest.fixture(scope="module")
def port(bm25_dir):
    service = load_service(str(bm25_dir), settings=ServiceSettings(timeout_s=5))
    with running_service(service) as url:
        yield int(url.rsplit(":", 1)[1])


def exchange(port: int, data: bytes) -> tuple[int, dict, bytes]:
    """Send ``data`` on a fresh connection; the status, the JSON answer and the raw head."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
    head, _, body = received.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"content-type: application/json" in head.lower(), received[:300]
    return status, json.loads(body), head


def post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json", *headers,
             f"Content-Length: {len(body)}", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(encoding=st.one_of(st.sampled_from(["br", "zstd", "compress", "x-gzip2", "gzip, br", "identity;q=1"]),
                          st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True)))
def test_an_unsupported_content_encoding_is_415_in_json(port, encoding, caplog):
    if encoding in SUPPORTED_ENCODINGS:
        return
    with caplog.at_level(logging.DEBUG):
        status, answer, _ = exchange(port, post("/retrieve", BODY, f"Content-Encoding: {encoding}"))
    assert status == 415, answer
    assert "Content-Encoding" in answer["error"] and "gzip" in answer["error"], answer
    assert "Traceback" not in caplog.text


def test_supported_encodings_are_decoded_and_a_broken_one_is_400(port, caplog):
    status, answer, _ = exchange(port, post("/retrieve", gzip.compress(BODY), "Content-Encoding: gzip"))
    assert status == 200 and len(answer["result"][0]) == 2
    with caplog.at_level(logging.DEBUG):
        status, answer, _ = exchange(port, post("/retrieve", b"not gzip at all", "Content-Encoding: gzip"))
    assert status == 400 and "could not be read" in answer["error"] and "gzip" in answer["error"], answer
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize(("raw", "status", "words"), [
    (b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404, "Not Found: GET /nope"),
    (b"GET /retrieve HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405, "Method Not Allowed"),
    (b"DELETE /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405, "Method Not Allowed"),
    (b"GARBAGE\r\n\r\n", 400, "Invalid method"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 20_000 + b"\r\n\r\n", 400, "8190 bytes"),
    (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, "Content-Length"),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, "Bad Request"),
    (post("/retrieve", b"{}", "Expect: 100-weird"), 417, "Expect: 100-weird"),
    (post("/retrieve", b"\x00\x01", "Transfer-Encoding: chunked"), 400, "Bad Request"),
], ids=["404", "405", "405-delete", "request-line", "long-header", "content-length", "http2", "expect", "te+cl"])
def test_errors_aiohttp_answers_itself_are_json(port, raw, status, words, caplog):
    with caplog.at_level(logging.DEBUG):
        got, answer, head = exchange(port, raw)
    assert got == status, (answer, head)
    assert words in answer["error"], answer
    assert "Traceback" not in caplog.text
    if status == 405:
        assert b"allow:" in head.lower()
