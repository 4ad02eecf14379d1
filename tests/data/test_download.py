"""Data downloads (``memsearch.data.download``) against a real HTTP server on 127.0.0.1: the bytes
and their SHA-256 recorded, a transfer cut off mid-body continued with a Range request (or
restarted where the server ignores ranges), a wrong checksum refused with nothing left behind,
a complete file reused without a request, local sources copied the same way."""

from __future__ import annotations

import hashlib
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from memsearch.data.download import download
from memsearch.errors import InputError

DATA = bytes(range(256)) * 4096 + b"tail"  # 1 MiB and a bit: more than one read chunk
SHA = hashlib.sha256(DATA).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    """Serves ``DATA``; ``server.ranges``: honour Range (206); ``server.cut``: the first GET sends
    only that many bytes of its body, then closes the connection."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        server = self.server
        if self.path != "/hotpot_dev.json":
            self.send_error(404)
            return
        asked = self.headers.get("Range")
        server.asked.append(asked)
        start = int(asked[len("bytes="):].split("-")[0]) if asked and server.ranges else 0
        body = DATA[start:]
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(DATA) - 1}/{len(DATA)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if server.cut is not None:
            body, server.cut = body[: server.cut], None
            self.wfile.write(body)
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.asked, httpd.ranges, httpd.cut = [], True, None
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def _url(httpd) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}/hotpot_dev.json"


def test_a_download_records_its_sha256_and_a_complete_file_is_reused_without_a_request(server, tmp_path):
    dest = tmp_path / "raw" / "dev.json"
    lines: list[str] = []
    got = download(_url(server), dest, sha256=SHA.upper(), echo=lines.append)
    assert (got.sha256, got.bytes, got.resumed, got.reused, got.path) == (SHA, len(DATA), False, False, dest)
    assert dest.read_bytes() == DATA and not (tmp_path / "raw" / "dev.json.part").exists()
    assert (tmp_path / "raw" / "dev.json.sha256").read_text() == f"{SHA}  dev.json\n"
    assert server.asked == [None]
    # Again, with the sha configured or only recorded in the sidecar: no request, the same record.
    for sha in (SHA, None):
        again = download(_url(server), dest, sha256=sha, echo=lines.append)
        assert (again.sha256, again.bytes, again.reused) == (SHA, len(DATA), True)
    assert server.asked == [None] and lines[-1].endswith("reused")
    # A different configured digest: refused, and the file is left as it is.
    with pytest.raises(InputError, match=rf"dev.json: exists with SHA-256 {SHA}, not {'0' * 64} \(the configured"):
        download(_url(server), dest, sha256="0" * 64, echo=lines.append)
    assert dest.read_bytes() == DATA


@pytest.mark.parametrize("ranges", [True, False])
def test_a_transfer_cut_off_mid_body_is_continued_by_the_next_run(server, tmp_path, ranges):
    server.ranges, server.cut = ranges, 300_000
    dest = tmp_path / "dev.json"
    with pytest.raises(InputError, match=r"connection closed after 300000 of \d+ bytes \(after 1 attempt"):
        download(_url(server), dest, sha256=SHA, retries=0, echo=lambda _: None)
    assert (tmp_path / "dev.json.part").stat().st_size == 300_000 and not dest.exists()
    got = download(_url(server), dest, sha256=SHA, retries=0, echo=lambda _: None)
    assert dest.read_bytes() == DATA and got.sha256 == SHA
    # A server that honours Range sends the rest (206); one that ignores it sends it all (200).
    assert server.asked == [None, "bytes=300000-"]
    assert got.resumed is ranges


def test_a_cut_off_transfer_is_retried_within_one_call(server, tmp_path, monkeypatch):
    monkeypatch.setattr("memsearch.data.download.BACKOFF_S", (0.01,))
    server.cut = 1000
    lines: list[str] = []
    got = download(_url(server), tmp_path / "dev.json", sha256=SHA, echo=lines.append)
    assert got.resumed and got.bytes == len(DATA) and server.asked == [None, "bytes=1000-"]
    assert any("connection closed after 1000 of" in line and "retrying" in line for line in lines)


def test_a_checksum_mismatch_is_refused_and_the_download_removed(server, tmp_path):
    dest = tmp_path / "dev.json"
    with pytest.raises(InputError) as info:
        download(_url(server), dest, sha256="ab" * 32, echo=lambda _: None)
    assert str(info.value).startswith(f"{_url(server)}: SHA-256 mismatch: expected {'ab' * 32}, got {SHA};")
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_host_or_a_missing_file_is_a_clear_error(server, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(InputError, match=rf"could not reach 127.0.0.1:{port}: ConnectionRefusedError.*"
                       r"download the file yourself and set the path"):
        download(f"http://127.0.0.1:{port}/x.json", tmp_path / "x.json", retries=0, echo=lambda _: None)
    with pytest.raises(InputError, match=r"/missing.json: HTTP 404"):
        download(_url(server).replace("hotpot_dev", "missing"), tmp_path / "y.json", echo=lambda _: None)


def test_local_sources_are_copied_with_the_same_record(tmp_path):
    source = tmp_path / "src.json"
    source.write_bytes(DATA)
    for url, name in ((source.as_uri(), "a.json"), (str(source), "b.json")):
        got = download(url, tmp_path / "out" / name, sha256=SHA, echo=lambda _: None)
        assert (got.sha256, got.bytes, got.resumed, got.reused) == (SHA, len(DATA), False, False)
        assert (tmp_path / "out" / name).read_bytes() == DATA
    with pytest.raises(InputError, match="no such file"):
        download(str(tmp_path / "nope.json"), tmp_path / "out" / "c.json", echo=lambda _: None)
    with pytest.raises(InputError, match="expected an http"):
        download("ftp://127.0.0.1/x", tmp_path / "out" / "d.json", echo=lambda _: None)
    assert isinstance(got.path, Path)
