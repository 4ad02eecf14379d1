"""Strict JSON in every record file (issue 54): a model server that sends a ``NaN`` log-prob (JSON
has no NaN; Python's parser reads it) used to put a bare ``NaN`` into trajectories.jsonl. The
OpenAI backend turns a non-finite log-prob into a failed request naming it, and every file a run
writes parses with a strict parser (``parse_constant`` refusing NaN/Infinity). A real loopback
server answering memsearch's prompts (``memsearch.testing.agent_server.answer_for``) with the
reader's answers carrying a non-finite log-prob, and the real CLI."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from memsearch.testing.agent_server import answer_for

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

TASKS = 3


def _refuse_constant(name: str):
    raise ValueError(f"bare {name} in a record file")


def strict_load(text: str):
    return json.loads(text, parse_constant=_refuse_constant)


def assert_strict_records(folder: Path) -> int:
    """Parse every JSON / JSON-lines file under ``folder`` strictly; returns how many were read."""
    n = 0
    for path in sorted(folder.rglob("*")):
        if path.suffix == ".jsonl":
            for line in path.read_text(encoding="utf-8").splitlines():
                strict_load(line)
        elif path.suffix == ".json":
            strict_load(path.read_text(encoding="utf-8"))
        else:
            continue
        n += 1
    return n


class _NonFiniteLogprobServer:
    """Chat completions as the agent server answers them; the reader's carry the log-prob ``value``
    (the raw token NaN, Infinity or -Infinity, as a server writing Python floats sends them)."""

    def __init__(self, value: str) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = answer_for("\n".join(m.get("content", "") for m in body.get("messages", [])))
                logprobs = ""
                if text.startswith("Answer:"):
                    outer.sent += 1
                    logprobs = f', "logprobs": {{"content": [{{"token": "Answer", "logprob": {value}}}]}}'
                raw = ('{"choices": [{"index": 0, "message": {"role": "assistant", "content": '
                       f'{json.dumps(text)}}}, "finish_reason": "stop"{logprobs}}}]}}').encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.sent = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_log_prob_is_a_failed_request_and_every_record_is_strict_json(hotpot_dev_dir, tmp_path, rel,
                                                                                    value):
    out = tmp_path / "run"
    server = _NonFiniteLogprobServer(value)
    started = time.perf_counter()
    try:
        sets = rel.api_sets(server.base_url, *[f"backends.{r}.max_retries=0" for r in rel.ROLES])
        result = rel.run_cli(rel.cli_args("eval", rel.API, hotpot_dev_dir, out, TASKS, sets))
    finally:
        server.close()
    strict = True
    try:
        files = assert_strict_records(out)
    except ValueError:
        strict, files = False, 0
    lost, dup = rel.lost_and_duplicated(out, rel.task_ids(hotpot_dev_dir, TASKS))
    rel.LEDGER.record("non-finite numbers from a server", lost=lost, duplicated=dup,
                      wrong_exit=int(result.returncode not in (0, 3) or "Traceback" in result.stderr),
                      seconds=time.perf_counter() - started)
    assert "Traceback" not in result.stderr and result.returncode in (0, 3), result.stderr[-2000:]
    assert strict and files >= 6  # marker, config, run, summary, trajectories, metrics
    assert server.sent >= 1 and (lost, dup) == (0, 0)
    errors = [e.get("error") or "" for line in (out / "trajectories.jsonl").read_text().splitlines()
              for e in strict_load(line)["events"] if e.get("type") == "policy_call" and e.get("role") == "reader"]
    assert errors and all(f"log-prob of token 0 is {float(value)!r}; expected a finite number" in e for e in errors)
    summary = strict_load((out / "summary.json").read_text())
    assert summary["request_errors"] == len(errors) and summary["usable_for_comparison"] is False
