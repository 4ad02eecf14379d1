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
from tests.support.http import loopback_server

from memsearch.data.download import data_file_problem, download
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
    with loopback_server(_Handler, asked=[], ranges=True, cut=None) as httpd:
        yield httpd


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


# --------------------------------------------------------------------------- what came back (issue 62)


@pytest.mark.parametrize(("name", "head", "kind", "problem"), [
    ("hotpot_dev.json", b"[{\"_id\": 1}]", "application/json", None),
    ("hotpot_dev.json", b"\xef\xbb\xbf \n{\"_id\": 1}", "text/plain", None),  # JSON lines after a BOM
    ("hotpot_dev.json", b"\x1f\x8b\x08\x00", None, None),  # gzip: read whatever the name
    ("train.parquet", b"PAR1\x15\x04", "binary/octet-stream", None),
    ("blob", b"PAR1\x15\x04", None, None),  # no known extension: any form the converter reads
    ("hotpot_dev.json", b"[]", "text/html; charset=utf-8", "got an HTML page (Content-Type text/html; charset=utf-8, "
     "starting '[]'), not the data file: expected a JSON array of records ('[' first; JSON lines: '{' first)"),
    ("dev.jsonl", b"\n\n <!doctype html><p>502</p>", None, "got an HTML page (Content-Type not given, starting "
     "'<!doctype html><p>502</p>'), not the data file: expected JSON lines (one JSON object per line: '{' first)"),
    ("train.parquet", b"[{}]", None, "got other bytes (Content-Type not given, starting '[{}]'), expected a parquet "
     "file (its bytes start with 'PAR1')"),
    ("dev.json", b"PAR1", None, "got other bytes (Content-Type not given, starting 'PAR1'), expected a JSON array "
     "of records ('[' first; JSON lines: '{' first)"),
    ("blob", b"Not Found", "text/plain", "got other bytes (Content-Type text/plain, starting 'Not Found'), expected "
     "a JSON array, JSON lines or a parquet file, as the HotpotQA converter reads"),
    ("dev.json", None, "text/html", "got an HTML page (Content-Type text/html), expected a JSON array of records ('[' "
     "first; JSON lines: '{' first)"),
    ("dev.json", None, "application/octet-stream", None),  # the middle of a file: its type alone
])
def test_data_file_problem_sniffs_the_first_bytes_by_name(name, head, kind, problem):
    assert data_file_problem(name, head, kind) == problem


def test_a_page_is_refused_before_a_byte_is_written_and_no_part_is_kept(tmp_path):
    page = b"<html><body>" + b"x" * 5000 + b"</body></html>"

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/dev.json"
    try:
        with pytest.raises(InputError) as info:
            download(url, tmp_path / "raw" / "dev.json", echo=lambda _: None, expect=data_file_problem)
        # Without ``expect`` download stays a plain fetcher (a page is bytes like any other).
        got = download(url, tmp_path / "plain" / "dev.json", echo=lambda _: None)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert str(info.value) == (
        f"{url}: got an HTML page (Content-Type text/html, starting '<html><body>{'x' * 68}'), not the data file: "
        "expected a JSON array of records ('[' first; JSON lines: '{' first); nothing of it was kept. Check the URL "
        "(a server answers an error, login or proxy page with status 200 too), or download the file yourself and "
        "give its path")
    assert list((tmp_path / "raw").iterdir()) == []
    assert got.bytes == len(page)


def test_local_copies_resumed_transfers_and_kept_files_are_judged_too(server, tmp_path):
    page = tmp_path / "page.json"
    page.write_bytes(b"<html>moved</html>")
    with pytest.raises(InputError, match=r"page\.json: got an HTML page .*nothing of it was kept"):
        download(str(page), tmp_path / "out" / "a.json", echo=lambda _: None, expect=data_file_problem)
    assert list((tmp_path / "out").iterdir()) == []

    # A .part whose first bytes were of another answer: the continued body completes it, the whole
    # file is judged before it is kept, and it is removed.
    dest = tmp_path / "dev.json"
    (tmp_path / "dev.json.part").write_bytes(b"<html>" + DATA[6:300_000])
    with pytest.raises(InputError, match=r"got an HTML page \(Content-Type not given, starting '<html>"):
        download(_url(server), dest, echo=lambda _: None, expect=data_file_problem)
    assert server.asked == ["bytes=300000-"] and not dest.exists() and not (tmp_path / "dev.json.part").exists()

    # A complete file an earlier memsearch kept: named and left as it is.
    kept = tmp_path / "kept.json"
    kept.write_bytes(b"<!DOCTYPE html>")
    with pytest.raises(InputError, match=rf"^{kept}: exists but got an HTML page .*; it is left as it is: remove it"):
        download(_url(server), kept, echo=lambda _: None, expect=data_file_problem)
    assert kept.read_bytes() == b"<!DOCTYPE html>"
