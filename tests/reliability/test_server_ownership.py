"""The model servers a run starts, against other runs and against ``kill -9`` (issue 62, class
2), with real processes: a "run" here is a child process doing what `memsearch experiment run`
does with its services (port check, ``stop_on_signals``, ``running_services``, errors mapped to
exit statuses by the CLI's own ``friendly``), each serving a minimal OpenAI-compatible server.

- two runs on one port, both past the port check before either server binds (the first's
  server still loading): the one whose server binds second is refused (exit 2) naming the
  other's server, which is left serving;
- ``kill -9`` of a run: its server stops serving within seconds (its reaper);
- the reaper killed too: the server a run left is found from its record and stopped, and the
  next run starts on the port;
- the server killed while the run uses it: the run ends at once with exit 2 saying so.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from tests.serving.test_ownership import SERVER, free_port, gone_within, owner_of  # the same minimal server

from memsearch.serving import recorded_orphans, stop_orphan
from memsearch.serving.ownership import process_running
from memsearch.serving.process import port_in_use

pytestmark = pytest.mark.reliability

SCENARIO = "server impostor / orphan"

RUN = """
import json, sys, time
from pathlib import Path
import typer
from memsearch.cli.common import friendly
from memsearch.serving import ServiceSpec, check_ports_free, running_services, stop_on_signals
from memsearch.serving.ownership import reaper_pid

@friendly
def run(script, port, folder, hold, *server_args):
    spec = ServiceSpec(engine="vllm", model="m", port=int(port), start_timeout_s=30,
                       command=["{python}", script, "{port}", "{served_name}", *server_args])
    check_ports_free({"reader": spec})  # as `memsearch experiment run` does before anything starts
    with stop_on_signals(), running_services({"reader": spec}, Path(folder), echo=lambda _: None) as services:
        r = services["reader"]
        print(json.dumps({"event": "ready", "pid": r.pid, "started": r.started, "url": r.url, "log": str(r.log),
                          "reaper": reaper_pid(r.pid)}), flush=True)
        time.sleep(float(hold))

try:
    run(*sys.argv[1:])
except typer.Exit as exc:
    sys.exit(exc.exit_code)
"""

# What a custom command is called in messages: its program (serving.process.started_service).
PYTHON = Path(sys.executable).name


class Run:
    """One run as a child process (``RUN``); ``server_args`` go to its server's command."""

    def __init__(self, script: Path, port: int, folder: Path, *server_args: str, hold: float = 120) -> None:
        self.folder = folder
        self.proc = subprocess.Popen([sys.executable, "-c", RUN, str(script), str(port), str(folder), str(hold),
                                      *server_args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def event(self, timeout: float = 60) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"no word from the run within {timeout} s"
        line = self.proc.stdout.readline()
        assert line, f"the run ended (status {self.proc.wait(10)}): {self.proc.stderr.read()}"
        return json.loads(line)

    def server_started(self, timeout: float = 60) -> int:
        """The pid of its server once started (before it is ready), from the log's header."""
        log, deadline = self.folder / "reader.log", time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r"^=== pid (\d+)$", log.read_text(), flags=re.M) if log.is_file() else None
            if found:
                return int(found.group(1))
            time.sleep(0.05)
        raise AssertionError(f"the run started no server within {timeout} s")

    def end(self, timeout: float = 30) -> tuple[int, str]:
        code = self.proc.wait(timeout)
        return code, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "server.py"
    path.write_text(SERVER)
    return path


def _cleanup(*pids: int) -> None:
    for pid in pids:
        if process_running(pid):
            os.killpg(pid, signal.SIGKILL)


@contextmanager
def _serving(script: Path, port: int, folder: Path):
    """A child run started on ``port``, yielded with its server's event once it serves; the run and
    its server are killed on the way out, whatever the test did to them."""
    run, server = Run(script, port, folder), None
    try:
        server = run.event()
        yield run, server
    finally:
        run.kill()
        if server:
            _cleanup(server["pid"])


def test_a_second_run_on_the_same_port_is_refused_and_leaves_the_first_serving(script, tmp_path, rel):
    started = time.perf_counter()
    port = free_port()
    second = Run(script, port, tmp_path / "b", "delay=3")  # its server loads for 3 s before it binds
    second.server_started()
    first = Run(script, port, tmp_path / "a")  # past the port check too: nothing listens yet
    server = None
    try:
        server = first.event()  # the first to bind
        t0 = time.monotonic()
        code2, err2 = second.end()
        refused_in = time.monotonic() - t0
        serving = process_running(server["pid"]) and owner_of(port) == f"pid {server['pid']}"
        first.proc.send_signal(signal.SIGTERM)
        code1, _ = first.end()
        rel.LEDGER.record(f"{SCENARIO}: two runs, one port", runs=2,
                          wrong_exit=int(code2 != 2) + int(code1 != 128 + signal.SIGTERM),
                          seconds=time.perf_counter() - started)
        assert code2 == 2, err2
        assert err2.startswith(f"error: port {port} on 127.0.0.1 is served by pid {server['pid']} ("), err2
        assert "not by the service reader we started" in err2 and "--set services.reader.port=" in err2
        assert refused_in < 10, refused_in
        assert serving, "the first run's server must be left serving"
        assert code1 == 128 + signal.SIGTERM and gone_within(server["pid"], port, 5) is not None
    finally:
        first.kill()
        second.kill()
        if server:
            _cleanup(server["pid"])


def test_kill_9_of_a_run_leaves_no_server_serving(script, tmp_path, rel):
    started = time.perf_counter()
    port = free_port()
    with _serving(script, port, tmp_path) as (run, server):
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(10)
        took = gone_within(server["pid"], port, 15)
        rel.LEDGER.record(f"{SCENARIO}: kill -9 of the run", runs=1, wrong_exit=int(run.proc.returncode != -9),
                          seconds=time.perf_counter() - started)
        assert took is not None, "the server still serves 15 s after kill -9 of its run"
        assert took < 5, took


def test_a_server_left_by_a_killed_run_and_reaper_is_found_and_stopped_by_the_next(script, tmp_path, rel):
    started = time.perf_counter()
    port = free_port()
    with _serving(script, port, tmp_path / "a") as (run, server):
        os.kill(server["reaper"], signal.SIGKILL)
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(10)
        time.sleep(1)
        left_serving = process_running(server["pid"]) and port_in_use("127.0.0.1", port)
        record = {"reader": {key: server[key] for key in ("pid", "started", "url", "log")}}
        orphans = recorded_orphans(record)
        lines: list[str] = []
        for orphan in orphans:
            stop_orphan(orphan, echo=lines.append)
        following = Run(script, port, tmp_path / "b")
        again = following.event()
        following.proc.send_signal(signal.SIGTERM)
        code, err = following.end()
        rel.LEDGER.record(f"{SCENARIO}: reaper killed too, next run", runs=2,
                          wrong_exit=int(run.proc.returncode != -9) + int(code != 128 + signal.SIGTERM),
                          seconds=time.perf_counter() - started)
        assert left_serving, "without its reaper the server outlives the run (what recorded_orphans is for)"
        assert [o.pid for o in orphans] == [server["pid"]] and lines[0].startswith(
            f"service reader: pid {server['pid']} from the previous invocation")
        assert again["pid"] != server["pid"] and code == 128 + signal.SIGTERM, err
        assert not process_running(server["pid"]) and recorded_orphans(record) == []


def test_a_server_killed_while_the_run_uses_it_ends_the_run_at_once(script, tmp_path, rel):
    started = time.perf_counter()
    port = free_port()
    with _serving(script, port, tmp_path) as (run, server):
        t0 = time.monotonic()
        os.kill(server["pid"], signal.SIGKILL)
        code, err = run.end(timeout=30)
        took = time.monotonic() - t0
        rel.LEDGER.record(f"{SCENARIO}: server killed mid-run", runs=1, wrong_exit=int(code != 2),
                          seconds=time.perf_counter() - started)
        assert code == 2 and err.startswith(
            f"error: service reader ({PYTHON} of services.reader.command, pid {server['pid']}) exited with status -9 "
            f"(killed by signal SIGKILL) while the run was using it; the end of its log ({server['log']}):"), err
        assert took < 5, took
        assert not port_in_use("127.0.0.1", port)
