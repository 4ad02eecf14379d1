"""Oversized and compressed server bodies (issue 54): ``memsearch eval run`` against a model server
that answers every request with far more than it asked for: a 30 MB completion for at most a few
hundred tokens (announced by Content-Length, or chunked without one), and a gzip body of 200 KB
that inflates to 256 MiB. Each call must be an errored result naming the bound (nothing of the
body stored), the run incomplete (exit 3, no traceback), every record file strict JSON and small,
and the process's peak memory within 48 MB of the same run against a server whose every answer is
a small unusable body (``{}``): the error path alone, without the size (unbounded, the 30 MB answer
took 767 MB)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from memsearch.cli.app import EXIT_INCOMPLETE

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

TASKS = 2
MB = 1 << 20


def _completion(text: str) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                    "finish_reason": "stop"}]}).encode()


def _gzip_bomb() -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    zeros = bytes(MB)
    return b"".join([*(packer.compress(zeros) for _ in range(256)), packer.flush()])


class _Flooding:
    """A loopback OpenAI-compatible server answering every POST with ``body`` (chunked when
    ``announce`` is False), with ``headers``."""

    def __init__(self, body: bytes, headers: dict[str, str], announce: bool) -> None:
        view = memoryview(body)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                for key, value in headers.items():
                    self.send_header(key, value)
                length = ("Content-Length", str(len(body))) if announce else ("Transfer-Encoding", "chunked")
                self.send_header(*length)
                self.end_headers()
                try:
                    for i in range(0, len(body), 1 << 16):
                        piece = view[i:i + (1 << 16)]
                        self.wfile.write(piece if announce else b"%x\r\n%s\r\n" % (len(piece), piece))
                    if not announce:
                        self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda *args: None  # the client hanging up mid-body is the point
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def __enter__(self) -> _Flooding:
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _high_water_kb(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), None)


def _run(rel, args: list[str], folder: Path) -> tuple[int, str, int]:
    """Run a CLI command; (exit status, stderr, its peak RSS in KB). The peak is the process's own
    high-water mark (``VmHWM``), read while it runs: ``ru_maxrss`` of a child also counts the pages of
    the parent it was forked from (this test's process, which holds the bodies it serves)."""
    folder.mkdir(parents=True, exist_ok=True)
    peak = 0
    with open(folder / "stdout", "w") as out, open(folder / "stderr", "w") as err:
        proc = subprocess.Popen(args, stdout=out, stderr=err)
        deadline = time.monotonic() + 180
        while proc.poll() is None:
            peak = max(peak, _high_water_kb(proc.pid) or 0)
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.02)
    return proc.returncode, (folder / "stderr").read_text(), peak


def _strict(value: str) -> None:
    raise ValueError(f"not JSON: {value}")


CASES = {
    "30 MB, Content-Length": (lambda: _completion("x" * (30 * MB)), {}, True),
    "30 MB, chunked": (lambda: _completion("x" * (30 * MB)), {}, False),
    "gzip to 256 MiB": (_gzip_bomb, {"Content-Encoding": "gzip"}, False),
}


def test_oversized_server_bodies_are_errors_in_bounded_memory(hotpot_dev_dir, tmp_path, rel):
    started = time.perf_counter()
    sets = [f"backends.{r}.{k}" for r in rel.ROLES for k in ("max_retries=1", "timeout_s=60")]
    with _Flooding(b"{}", {}, True) as small:
        code, err, baseline_kb = _run(rel, rel.cli_args("eval", rel.API, hotpot_dev_dir, tmp_path / "small", TASKS,
                                                        rel.api_sets(small.base_url, *sets)), tmp_path / "small-io")
    assert code == EXIT_INCOMPLETE, err[-2000:]
    wrong, problems = 0, []
    for name, (make, headers, announce) in CASES.items():
        out = tmp_path / name.replace(" ", "_").replace(",", "")
        with _Flooding(make(), headers, announce) as server:
            code, err, peak_kb = _run(rel, rel.cli_args("eval", rel.API, hotpot_dev_dir, out, TASKS,
                                                        rel.api_sets(server.base_url, *sets)), out.with_suffix(".io"))
        wrong += int(code != EXIT_INCOMPLETE or "Traceback" in err)
        sizes = {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()}
        records = [json.loads(line, parse_constant=_strict) for p in out.glob("*.jsonl")
                   for line in p.read_text().splitlines()]
        errors = [e["error"] for t in rel.raw_lines(out / "trajectories.jsonl") for e in t["events"]
                  if e["type"] == "policy_call" and e["error"]]
        if not errors or not all("response too large" in e for e in errors):
            problems.append((name, "errors", errors[:2]))
        if max(sizes.values()) > 2 * MB:
            problems.append((name, "sizes", sizes))
        if peak_kb - baseline_kb > 48 * 1024:
            problems.append((name, "peak RSS MB", peak_kb // 1024, "baseline", baseline_kb // 1024))
        if code != EXIT_INCOMPLETE or "Traceback" in err:
            problems.append((name, "exit", code, err[-1500:]))
        assert records  # every line parsed as strict JSON
        print(f"{name}: exit {code}, peak RSS {peak_kb // 1024} MB (small bodies {baseline_kb // 1024} MB), "
              f"largest file {max(sizes.values())} bytes, e.g. {errors[0][:160] if errors else None}")
    rel.LEDGER.record("oversized and compressed server bodies (eval)", runs=len(CASES), wrong_exit=wrong,
                      seconds=time.perf_counter() - started)
    assert problems == []
