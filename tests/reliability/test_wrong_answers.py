"""Sources and servers that answer with the wrong content, and damaged data records (issue 62),
through real CLI processes: a page at a data URL is refused naming the split and nothing of it
is kept, and the corrected URL continues the same --out; a deleted data manifest is written
again and a deleted prepared file is refused by name before anything else runs; more questions
asked than a file holds are refused before the prepare stage writes anything; a server answering
HTTP 200 with bodies that are not JSON fails the run within seconds, said at once, instead of
spending the retry window on every request."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from memsearch.cli.app import EXIT_INCOMPLETE
from memsearch.testing.agent_server import AgentServer

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "data" / "samples" / "hotpotqa"
EXAMPLE = ROOT / "configs" / "experiment.example.toml"
PAGE = (b"<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head>\n<body><h1>Welcome to nginx!</h1>"
        b"</body></html>\n")
TASKS = 4


class _Web:
    """A web server on 127.0.0.1 that is no API: ``routes`` maps a path to (content type, body),
    answered with 200; every other GET and every POST gets ``PAGE`` with status 200 (a default
    site on the port)."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[str, bytes]] = {}
        self.posts = 0
        web = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, kind: str, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802 (http.server's name)
                self._answer(*web.routes.get(self.path, ("text/html", PAGE)))

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                web.posts += 1
                self._answer("text/html", PAGE)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> _Web:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --------------------------------------------------------------------------- non-JSON 200 body


@pytest.mark.parametrize("server", ["a web page on the port", "JSON cut short on every answer"])
def test_a_server_answering_200_with_no_json_fails_the_run_within_seconds(hotpot_dev_dir, tmp_path, rel, server):
    """The default transport (8 retries within 60 s per request): every call of every task used to
    be retried for up to a minute without a word. Now the first such body is a warning line, the
    server is refused after its first answers, and the run ends incomplete (exit 3) in seconds,
    every task failed and recorded once."""
    ids = rel.task_ids(hotpot_dev_dir, TASKS)
    out = tmp_path / "run"
    started = time.perf_counter()
    if server == "a web page on the port":
        with _Web() as web:
            proc = rel.run_cli(rel.cli_args("eval", rel.API, hotpot_dev_dir, out, TASKS,
                                            rel.api_sets(web.url + "/v1")), timeout=120)
        sent, base = web.posts, web.url + "/v1"
    else:
        with AgentServer(delay_s=0.0, faults={"bad_json": 1.0}, max_faults_per_request=10_000, lifetime_s=90) as fs:
            proc = rel.run_cli(rel.cli_args("eval", rel.API, hotpot_dev_dir, out, TASKS, rel.api_sets(fs.base_url)),
                               timeout=120)
        sent, base = fs.requests, fs.base_url
    seconds = time.perf_counter() - started
    lost, dup = rel.lost_and_duplicated(out, ids)
    rel.LEDGER.record("non-JSON 200 body", runs=1, lost=lost, duplicated=dup,
                      wrong_exit=int(proc.returncode != EXIT_INCOMPLETE or "Traceback" in proc.stderr),
                      seconds=seconds)
    assert proc.returncode == EXIT_INCOMPLETE, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert (lost, dup) == (0, 0)
    assert seconds < 30, seconds  # the CLI's start included; before: at least a minute per call
    # Said once, at once (a progress bar may share its line).
    assert proc.stderr.count(f"openai backend {base}: HTTP 200 with a body that is not JSON (") == 1, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    rows = rel.raw_lines(out / "metrics.jsonl")
    assert summary["complete"] is False and summary["tasks"]["failed"] == TASKS == len(rows)
    errors = [e["error"] for t in rel.raw_lines(out / "trajectories.jsonl") for e in t["events"]
              if e["type"] == "policy_call" and e["error"]]
    assert errors and all("not JSON" in e for e in errors), errors[:3]
    assert sent <= 16  # a few answers, then refused without sending


# ------------------------------------------------- wrong content at a data URL, damaged records


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _experiment(rel, out: Path, model: Path, train: str, *extra: str):
    """`memsearch experiment run` (the example's CPU profile on the tiny model, 3 + 3 questions) with
    a reader server that exits at once: every run ends by exit 2 at the latest where the reader
    would start, after the download, models and prepare stages."""
    sets = [f"models.policy={json.dumps(str(model))}", f"models.reader={json.dumps(str(model))}",
            f"data.train={json.dumps(train)}", f"data.dev={json.dumps(str(SAMPLES / 'dev_distractor_sample.json'))}",
            f"services.reader.port={_free_port()}", f"services.stage1.port={_free_port()}",
            'services.reader.command=["{python}", "-c", "raise SystemExit(3)"]', *extra]
    args = [str(rel.EXE), "experiment", "run", "--config", str(EXAMPLE), "--profile", "cpu", "--out", str(out)]
    for s in sets:
        args += ["--set", s]
    return rel.run_cli(args, timeout=300)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_a_page_at_a_data_url_then_the_fixed_url_then_damaged_records(tiny_model_dir, tmp_path, rel):
    out = tmp_path / "exp"
    with _Web() as web:
        web.routes["/wrong/hotpot_train_v1.1.json"] = ("text/html; charset=utf-8", PAGE)
        web.routes["/hotpot_train_v1.1.json"] = ("application/json", (SAMPLES / "train_sample.json").read_bytes())
        bad, good = f"{web.url}/wrong/hotpot_train_v1.1.json", f"{web.url}/hotpot_train_v1.1.json"

        # 1. A page answering 200 at the train URL: refused naming the split, the URL and the page;
        #    nothing of it kept, the stage not finished.
        started = time.perf_counter()
        first = _experiment(rel, out, tiny_model_dir, bad)
        first_state = (_files(out / "data" / "train"), json.loads((out / "download.stage.json").read_text()),
                       (out / "prepare.stage.json").exists())
        # 2. The corrected URL on the same --out: it continues (before: refused as "made from
        #    different inputs"), through download, models and prepare to the reader, which exits.
        second = _experiment(rel, out, tiny_model_dir, good)
        wrong = sum(p.returncode != 2 or "Traceback" in p.stderr for p in (first, second))
        rel.LEDGER.record("wrong content at a data URL", runs=2, wrong_exit=wrong,
                          seconds=time.perf_counter() - started)

        # 3. Damaged records: the data manifest and a prepared file deleted. The manifest is
        #    written again from the stage record and the verified files; the missing prepared file
        #    is refused by name before anything after the prepare stage runs.
        manifest = out / "data" / "manifest.json"
        written = json.loads(manifest.read_text())
        manifest.unlink()
        tasks = out / "prepare" / "dev" / "tasks.jsonl"
        tasks.unlink()
        started = time.perf_counter()
        third = _experiment(rel, out, tiny_model_dir, good)
        rel.LEDGER.record("damaged data records", runs=1,
                          wrong_exit=int(third.returncode != 2 or "Traceback" in third.stderr),
                          seconds=time.perf_counter() - started)

    err = [line for line in first.stderr.splitlines() if line.startswith("error: ")]
    assert first.returncode == 2, first.stderr[-2000:]
    assert err[0].startswith(f"error: data.train: {bad}: got an HTML page (Content-Type text/html; charset=utf-8, "
                             "starting '<!DOCTYPE html> <html><head><title>Welcome to nginx!</title></head>")
    assert err[0].endswith("(--set data.train=PATH; the same --out continues)")
    assert first_state[0] == [] and first_state[1]["complete"] is False and first_state[2] is False

    assert second.returncode == 2, second.stderr[-2000:]
    assert "exited with status 3 before answering /health" in second.stderr  # the reader: past every data stage
    assert ("download: unfinished, and its inputs changed since (train.source); redoing what they made, keeping the "
            "rest") in second.stdout
    assert written["files"]["train"]["source"] == good
    assert json.loads((out / "prepare.stage.json").read_text())["complete"] is True

    err = [line for line in third.stderr.splitlines() if line.startswith("error: ")]
    assert third.returncode == 2, third.stderr[-2000:]
    assert f"download: {manifest} is missing; written again from the stage record" in third.stdout
    assert err[0] == f"error: {tasks}: missing", third.stderr[-2000:]
    assert "prepare: 1 prepared file(s) missing or changed since the stage finished" in third.stderr
    assert not tasks.exists() and json.loads(manifest.read_text()) == written
    assert "before answering /health" not in third.stderr  # refused before the services


def test_more_questions_than_the_file_holds_are_refused_before_prepare_writes(tiny_model_dir, tmp_path, rel):
    out = tmp_path / "exp"
    started = time.perf_counter()
    proc = _experiment(rel, out, tiny_model_dir, str(SAMPLES / "train_sample.json"), "data.dev_questions=5000")
    rel.LEDGER.record("more questions than the file holds", runs=1,
                      wrong_exit=int(proc.returncode != 2 or "Traceback" in proc.stderr),
                      seconds=time.perf_counter() - started)
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert err == [f"error: data.dev_questions = 5000: {out / 'data' / 'dev' / 'dev_distractor_sample.json'} holds "
                   "1000 questions; set data.dev_questions to at most 1000 (the held-out questions are the first N "
                   "of data.dev)"]
    assert not (out / "prepare").exists() and not (out / "prepare.stage.json").exists()
