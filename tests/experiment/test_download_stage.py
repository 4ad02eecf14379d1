"""The experiment's download stage: a source that cannot be reached names the field to set, and
the same --out then continues with a local copy instead of refusing the changed input; a
finished download is still refused when its source changes."""

from __future__ import annotations

import json
import socket
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from tests.support.http import loopback_server

from memsearch.errors import InputError
from memsearch.experiment.config import load_experiment
from memsearch.experiment.stages import download_stage
from memsearch.io import sha256_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "experiment.example.toml"
SAMPLES = ROOT / "data" / "samples" / "hotpotqa"


def _closed_port() -> int:
    with socket.socket() as sock:  # bound, then released: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cfg(train: str, dev: str):
    return load_experiment(EXAMPLE, [f'data.train="{train}"', f'data.dev="{dev}"'], profile="cpu")


def test_an_unreachable_source_names_its_field_and_a_local_copy_continues_the_same_out(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("memsearch.data.download.BACKOFF_S", (0.01,))
    dev = str(SAMPLES / "dev_distractor_sample.json")
    unreachable = f"http://127.0.0.1:{_closed_port()}/hotpot_train_v1.1.json"
    lines: list[str] = []
    with pytest.raises(InputError, match=r"^data\.train: .*\(--set data\.train=PATH; the same --out continues\)"):
        download_stage(_cfg(unreachable, dev), tmp_path, echo=lines.append)
    assert json.loads((tmp_path / "download.stage.json").read_text())["complete"] is False

    train = str(SAMPLES / "train_sample.json")
    files = download_stage(_cfg(train, dev), tmp_path, echo=lines.append)
    assert any(line.startswith("download: unfinished, and its inputs changed") for line in lines)
    assert files["train"]["sha256"] == sha256_file(train) and files["dev"]["sha256"] == sha256_file(dev)
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert {n: f["source"] for n, f in manifest["files"].items()} == {"train": train, "dev": dev}

    # Finished: a source of other bytes is refused, never mixed with what later stages were made from.
    with pytest.raises(InputError, match=r"^data\.train: .*train_extended\.json gives SHA-256 [0-9a-f]{64}, not the "
                       rf"{sha256_file(train)} the finished download stage recorded from {train}: other bytes"):
        download_stage(_cfg(str(SAMPLES / "train_extended.json"), dev), tmp_path, echo=lines.append)


# --------------------------------------------------------------------------- what came back

PAGE = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>Please sign in to continue</body></html>\n"


class _Routes(BaseHTTPRequestHandler):
    """``server.routes[path] = (content type, body)`` answered with status 200; anything else 404."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.server.asked.append(self.path)
        if self.path not in self.server.routes:
            self.send_error(404)
            return
        kind, body = self.server.routes[self.path]
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def web():
    with loopback_server(_Routes, routes={}, asked=[]) as httpd:
        yield httpd


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_an_html_page_at_a_data_url_is_refused_with_nothing_kept_and_the_fixed_url_continues(web, tmp_path,
                                                                                           monkeypatch):
    """The issue-62 case: a page answering 200 at the train URL was saved and the stage recorded
    complete, so the corrected URL was refused. Now the page is refused naming the split, the URL
    and what came back; nothing of it is kept; the corrected URL continues the same --out."""
    monkeypatch.chdir(ROOT)
    dev = str(SAMPLES / "dev_distractor_sample.json")
    web.routes["/wrong/hotpot_train_v1.1.json"] = ("text/html; charset=utf-8", PAGE)
    web.routes["/hotpot_train_v1.1.json"] = ("application/json", (SAMPLES / "train_sample.json").read_bytes())
    bad = f"{web.url}/wrong/hotpot_train_v1.1.json"
    lines: list[str] = []
    started = time.perf_counter()
    with pytest.raises(InputError) as info:
        download_stage(_cfg(bad, dev), tmp_path, echo=lines.append)
    assert str(info.value) == (
        f"data.train: {bad}: got an HTML page (Content-Type text/html; charset=utf-8, starting '<!DOCTYPE html> "
        "<html><head><title>Sign in</title></head><body>Please sign in to'), not the data file: expected a "
        "JSON array of records ('[' first; JSON lines: '{' first); nothing of it was kept. Check the URL (a server "
        "answers an error, login or proxy page with status 200 too), or download the file yourself and give its "
        "path (--set data.train=PATH; the same --out continues)")
    assert time.perf_counter() - started < 5  # refused at once, never retried
    record = json.loads((tmp_path / "download.stage.json").read_text())
    assert record["complete"] is False and "outputs" not in record
    # The dev file (good) is there; of the train page nothing: no file, no .part, no sidecar; no manifest.
    assert _files_under(tmp_path / "data") == ["dev/dev_distractor_sample.json",
                                               "dev/dev_distractor_sample.json.sha256"]

    good = f"{web.url}/hotpot_train_v1.1.json"
    lines.clear()
    files = download_stage(_cfg(good, dev), tmp_path, echo=lines.append)
    assert lines[0] == ("download: unfinished, and its inputs changed since (train.source); redoing what they made, "
                        "keeping the rest")
    # Only the corrected split is fetched: the dev file finished before is reused, not fetched again.
    assert any(line.startswith(f"{tmp_path / 'data' / 'dev' / 'dev_distractor_sample.json'}: already there")
               and line.endswith("reused") for line in lines), lines
    assert files["train"]["sha256"] == sha256_file(SAMPLES / "train_sample.json")
    assert json.loads((tmp_path / "download.stage.json").read_text())["complete"] is True
    assert json.loads((tmp_path / "data" / "manifest.json").read_text())["files"]["train"]["source"] == good


@pytest.mark.parametrize(("path", "kind", "body", "what"), [
    ("/hotpot_dev.json", "application/json", b"  <html>maintenance</html>", "got an HTML page (Content-Type "
     "application/json, starting '<html>maintenance</html>'), not the data file: expected a JSON array of records "
     "('[' first; JSON lines: '{' first)"),
    ("/dev.parquet", "application/json", b'{"error": "not found"}', "got other bytes (Content-Type "
     "application/json, starting '{\"error\": \"not found\"}'), expected a parquet file (its bytes start with 'PAR1')"),
    ("/dev.jsonl", "text/plain", b"", "got an empty file (Content-Type text/plain, no bytes at all), expected JSON "
     "lines (one JSON object per line: '{' first)"),
])
def test_what_no_data_file_of_that_name_can_be_is_refused_by_its_first_bytes(web, tmp_path, monkeypatch, path, kind,
                                                                               body, what):
    monkeypatch.chdir(ROOT)
    web.routes[path] = (kind, body)
    with pytest.raises(InputError) as info:
        download_stage(_cfg(str(SAMPLES / "train_sample.json"), web.url + path), tmp_path, echo=lambda _: None)
    assert str(info.value).startswith(f"data.dev: {web.url}{path}: {what}; nothing of it was kept.")
    assert not (tmp_path / "data" / "dev").exists() or _files_under(tmp_path / "data" / "dev") == []


def test_every_unreachable_split_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("memsearch.data.download.BACKOFF_S", (0.01,))
    port = _closed_port()
    with pytest.raises(InputError) as info:
        download_stage(_cfg(f"http://127.0.0.1:{port}/train.json", f"http://127.0.0.1:{port}/dev.json"), tmp_path,
                       echo=lambda _: None)
    lines = str(info.value).splitlines()
    assert [line.split(":")[0] for line in lines] == ["data.train", "data.dev"]
    for name, line in zip(("train", "dev"), lines):
        assert f"could not reach 127.0.0.1:{port}: ConnectionRefusedError" in line
        assert line.endswith(f"(--set data.{name}=PATH; the same --out continues)")


def test_a_finished_download_continues_with_another_source_of_the_same_bytes(web, tmp_path, monkeypatch):
    """Finished from a URL; the config then names a mirror URL, then a local path, of the same
    bytes: the stage continues (nothing refetched into the folder, the path later stages read
    unchanged, the new source recorded). A source of other bytes is refused."""
    monkeypatch.chdir(ROOT)
    train = SAMPLES / "train_sample.json"
    dev = str(SAMPLES / "dev_distractor_sample.json")
    web.routes["/hotpot_train_v1.1.json"] = ("application/json", train.read_bytes())
    web.routes["/mirror/train.json"] = ("application/octet-stream", train.read_bytes())
    first = download_stage(_cfg(f"{web.url}/hotpot_train_v1.1.json", dev), tmp_path, echo=lambda _: None)
    stored = tmp_path / "data" / "train" / "hotpot_train_v1.1.json"
    assert first["train"]["path"] == str(stored)

    for source in (f"{web.url}/mirror/train.json", str(train)):
        lines: list[str] = []
        files = download_stage(_cfg(source, dev), tmp_path, echo=lines.append)
        assert files["train"] == {**first["train"], "source": source}
        assert any(line.startswith(f"download: data.train is now {source}: the same bytes") for line in lines)
        record = json.loads((tmp_path / "download.stage.json").read_text())
        assert record["inputs"]["train"]["source"] == source and record["complete"] is True
        assert json.loads((tmp_path / "data" / "manifest.json").read_text())["files"]["train"]["source"] == source
        assert _files_under(tmp_path / "data" / "train") == ["hotpot_train_v1.1.json", "hotpot_train_v1.1.json.sha256"]
    assert [len(record["inputs_before"]), web.asked.count("/mirror/train.json")] == [2, 1]
    # Again with the last source: nothing to check, nothing fetched.
    download_stage(_cfg(str(train), dev), tmp_path, echo=lambda _: None)
    assert web.asked.count("/mirror/train.json") == 1

    # A configured sha256 that is not the recorded one: refused, naming the setting.
    with pytest.raises(InputError, match=r"^data\.train: data\.train_sha256 = '0{64}' gives SHA-256 0{64}, not the"):
        download_stage(load_experiment(EXAMPLE, [f'data.train="{train}"', f'data.dev="{dev}"',
                                                 f'data.train_sha256="{"0" * 64}"'], profile="cpu"),
                       tmp_path, echo=lambda _: None)


def test_damaged_download_records_are_noticed_before_anything_changes(tmp_path, monkeypatch):
    """A finished download stage: a deleted manifest is written again from the record and the
    verified files; a changed data file is refused naming it (left as it is); a deleted one is
    fetched again and held to the recorded SHA-256."""
    monkeypatch.chdir(ROOT)
    train, dev = str(SAMPLES / "train_sample.json"), str(SAMPLES / "dev_distractor_sample.json")
    first = download_stage(_cfg(train, dev), tmp_path, echo=lambda _: None)
    manifest = tmp_path / "data" / "manifest.json"
    written = manifest.read_bytes()

    manifest.unlink()
    lines: list[str] = []
    assert download_stage(_cfg(train, dev), tmp_path, echo=lines.append) == first
    assert manifest.read_bytes() == written
    assert lines == [f"download: {manifest} is missing; written again from the stage record and the files (their "
                     "SHA-256 as recorded)"]

    stored = Path(first["dev"]["path"])
    stored.write_bytes(stored.read_bytes().replace(b"Scott Derrickson", b"Scott Derricksen", 1))
    with pytest.raises(InputError) as info:
        download_stage(_cfg(train, dev), tmp_path, echo=lambda _: None)
    assert str(info.value).startswith(f"data.dev: {stored} has SHA-256 {sha256_file(stored)}, not the "
                                      f"{first['dev']['sha256']} the download stage recorded: changed since;")
    assert b"Derricksen" in stored.read_bytes()  # left as it is

    stored.unlink()
    lines.clear()
    assert download_stage(_cfg(train, dev), tmp_path, echo=lines.append) == first
    assert lines[0].startswith(f"download: {stored} is missing; fetching data.dev again from {dev}")
    assert sha256_file(stored) == first["dev"]["sha256"]
