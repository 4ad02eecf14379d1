"""The servers a run starts, for real (child processes, real ports): ready only when our own
process is the one listening (another process on the port is refused at once, naming it), gone
within seconds after ``kill -9`` of the run (the reaper), found and stopped from a record when
they outlive it anyway, and their death while in use interrupts the block with ``ServiceDied``."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from memsearch.errors import InputError
from memsearch.serving import (
    Orphan,
    PortTaken,
    ServiceDied,
    ServiceSpec,
    check_ports_free,
    process_start_time,
    recorded_orphans,
    running_services,
    stop_orphan,
)
from memsearch.serving.ownership import port_holders, process_running, reaper_pid
from memsearch.serving.process import port_in_use, started_service

# A minimal OpenAI-compatible server: /health, and /v1/models listing argv[2] (owned_by names its
# pid, so a test sees which process answered). "reuseport": bind with SO_REUSEPORT, as vLLM does;
# "delay=S": bind only after S seconds, as a server loading its model does.
SERVER = r"""
import json, os, socket, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
port, name, reuse = int(sys.argv[1]), sys.argv[2], "reuseport" in sys.argv[3:]
time.sleep(sum(float(arg[6:]) for arg in sys.argv[3:] if arg.startswith("delay=")))

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            body = b"{}"
        elif self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": name, "object": "model",
                                                          "owned_by": f"pid {os.getpid()}"}]}).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

class Server(HTTPServer):
    allow_reuse_address = True

    def server_bind(self):
        if reuse:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()

server = Server(("127.0.0.1", port), Handler)
print(f"serving {name} on port {port} (pid {os.getpid()})", flush=True)
server.serve_forever()
"""

linux_only = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")

# What a custom command is called in messages: its program (serving.process.started_service).
PYTHON = Path(sys.executable).name


def free_port() -> int:
    from memsearch.pipelines.memory_policy.serving import free_port

    return free_port()


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "server.py"
    path.write_text(SERVER)
    return path


def spec_for(script: Path, port: int, *extra: str) -> ServiceSpec:
    return ServiceSpec(engine="vllm", model="m", port=port, command=["{python}", str(script), "{port}", "{served_name}",
                                                                      *extra], start_timeout_s=30)


def start_other(script: Path, port: int, *extra: str) -> subprocess.Popen:
    """A server that is not ours (started by the test), answering at ``port`` once this returns."""
    proc = subprocess.Popen([sys.executable, str(script), str(port), "m", *extra], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert "serving" in proc.stdout.readline()
    return proc


def owner_of(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as response:
        return json.loads(response.read())["data"][0]["owned_by"]


def pids_in(log: Path) -> list[int]:
    return [int(m) for m in re.findall(r"^=== pid (\d+)$", log.read_text(), flags=re.M)]


def gone_within(pid: int, port: int, seconds: float) -> float | None:
    """Seconds until ``pid`` no longer runs (a zombie serves nothing) and ``port`` is free; None past ``seconds``."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if not process_running(pid) and not port_in_use("127.0.0.1", port):
            return time.monotonic() - start
        time.sleep(0.1)
    return None


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


# ----------------------------------------------------------------------------- impostor


@linux_only
@pytest.mark.parametrize("bind", ["plain", "reuseport"])
def test_another_process_on_the_port_is_refused_at_once_naming_it(script, tmp_path, bind):
    """Two runs passed the port check before either server bound; the second run's server must
    not be declared ready because the first's answers. With SO_REUSEPORT (vLLM) both listen."""
    port = free_port()
    extra = ("reuseport",) if bind == "reuseport" else ()
    other = start_other(script, port, *extra)
    try:
        log = tmp_path / "reader.log"
        started = time.monotonic()
        with pytest.raises(PortTaken) as info:
            with started_service("reader", spec_for(script, port, *extra), log, echo=lambda _: None):
                pytest.fail("another process's server must not count as ours")
        elapsed = time.monotonic() - started
        ours = pids_in(log)[0]
        message = str(info.value)
        assert message.startswith(f"port {port} on 127.0.0.1 is served by pid {other.pid} ({sys.executable} "
                                  f"{script} {port} m"), message
        assert f"not by the service reader we started (pid {ours}, " in message
        assert re.search(r"another run or program holds it: stop it or move this service with --set "
                         r"services\.reader\.port=\d+ \(a free port\); the end of our server's log", message)
        assert elapsed < 10, elapsed
        assert not process_running(ours)
        # The other server is untouched and still the one answering.
        assert other.poll() is None and owner_of(port) == f"pid {other.pid}"
    finally:
        stop(other)


@linux_only
def test_the_port_check_names_the_process_listening_and_how_to_move_the_service(script):
    port = free_port()
    other = start_other(script, port)
    try:
        spec = spec_for(script, port)
        with pytest.raises(InputError) as info:
            check_ports_free({"reader": spec})
        message = str(info.value)
        assert message.startswith(f"port {port} (service reader) is already in use on 127.0.0.1 by pid {other.pid} "
                                  f"({sys.executable} {script} {port} m); stop what listens there or move this "
                                  "service with --set services.reader.port="), message
        suggested = int(re.search(r"services\.reader\.port=(\d+)", message).group(1))
        assert suggested > port and not port_in_use("127.0.0.1", suggested)
        # A caller whose services have no such setting gets no made-up key.
        with pytest.raises(InputError, match=r"stop what listens there or give service reader another port$"):
            check_ports_free({"reader": spec}, port_key=None)
        assert [h.pid for h in port_holders("127.0.0.1", port)] == [other.pid]
    finally:
        stop(other)


# ----------------------------------------------------------------------------- kill -9 of the run

# A run as a process of its own: starts the server, says which (and its reaper), then waits.
RUN = """
import json, sys, time
from pathlib import Path
from memsearch.serving import ServiceSpec, running_services
from memsearch.serving.ownership import reaper_pid
spec = ServiceSpec(engine="vllm", model="m", port=int(sys.argv[2]), start_timeout_s=30,
                   command=["{python}", sys.argv[1], "{port}", "{served_name}"])
with running_services({"reader": spec}, Path(sys.argv[3]), echo=lambda _: None) as services:
    reader = services["reader"]
    print(json.dumps({"pid": reader.pid, "started": reader.started, "url": reader.url, "log": str(reader.log),
                      "reaper": reaper_pid(reader.pid)}), flush=True)
    time.sleep(300)
"""


def start_run(script: Path, port: int, folder: Path) -> tuple[subprocess.Popen, dict]:
    run = subprocess.Popen([sys.executable, "-c", RUN, str(script), str(port), str(folder)], stdout=subprocess.PIPE,
                           text=True)
    ready, _, _ = select.select([run.stdout], [], [], 60)
    assert ready, "the run did not report a ready server within 60 s"
    return run, json.loads(run.stdout.readline())


def test_kill_9_of_the_run_leaves_no_server_serving(script, tmp_path):
    port = free_port()
    run, server = start_run(script, port, tmp_path)
    try:
        assert process_running(server["pid"]) and process_running(server["reaper"])
        assert server["started"] == process_start_time(server["pid"])
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=10)
        took = gone_within(server["pid"], port, 15)
        assert took is not None, "the server outlived the run by 15 s"
        assert gone_within(server["reaper"], port, 5) is not None
        assert re.search(rf"reaper \(pid {server['reaper']}\): the run \(pid {run.pid}\) is gone; stopping the "
                         rf"server's process group {server['pid']}", Path(server["log"]).read_text())
    finally:
        if process_running(server["pid"]):
            os.killpg(server["pid"], signal.SIGKILL)


# ----------------------------------------------------------------------------- recorded orphans


@linux_only
def test_a_recorded_server_still_running_is_found_and_stopped(script, tmp_path):
    port = free_port()
    left = start_other(script, port)  # what a run left behind (its reaper killed too)
    # A server whose leader exited, its worker still serving (the group outlives the leader).
    port2 = free_port()
    shell = subprocess.Popen(["sh", "-c", f"{sys.executable} {script} {port2} m >/dev/null & exit 0"],
                             start_new_session=True)
    worker_started = process_start_time(shell.pid)
    shell.wait(timeout=10)
    try:
        deadline = time.monotonic() + 20
        while not port_in_use("127.0.0.1", port2) and time.monotonic() < deadline:
            time.sleep(0.05)
        entry = {"engine": "vllm", "url": f"http://127.0.0.1:{port}/v1", "pid": left.pid,
                 "started": process_start_time(left.pid), "log": str(tmp_path / "reader.log")}
        services = {
            "reader": entry,
            "stage1": {"seed-1": {**entry, "started": str(int(entry["started"]) + 1)},  # the pid, given again
                       "seed-2": {**entry, "pid": shell.pid, "started": worker_started,
                                  "url": f"http://127.0.0.1:{port2}/v1"}},
            "old": {key: value for key, value in entry.items() if key != "started"},  # an older record
            "gone": {**entry, "pid": shell.pid, "started": str(int(worker_started) + 1)},
        }
        orphans = recorded_orphans(services)
        assert orphans == [Orphan("reader", left.pid, entry["started"], entry["url"], entry["log"]),
                           Orphan("stage1 seed-2", shell.pid, worker_started, f"http://127.0.0.1:{port2}/v1",
                                  entry["log"])]
        lines: list[str] = []
        for orphan in orphans:
            stop_orphan(orphan, echo=lines.append)
        assert lines[0] == (f"service reader: pid {left.pid} from the previous invocation (started {entry['started']}, "
                            f"log {entry['log']}) is still serving at {entry['url']}; stopping it")
        assert left.wait(timeout=10) == -signal.SIGTERM
        assert not port_in_use("127.0.0.1", port) and not port_in_use("127.0.0.1", port2)
        assert recorded_orphans(services) == []
    finally:
        stop(left)
        try:
            os.killpg(shell.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ----------------------------------------------------------------------------- death while in use


def test_a_server_that_dies_while_in_use_interrupts_the_block(script, tmp_path):
    port = free_port()
    before = signal.getsignal(signal.SIGUSR1)
    started = time.monotonic()
    with pytest.raises(ServiceDied) as info:
        with running_services({"reader": spec_for(script, port)}, tmp_path, echo=lambda _: None) as services:
            pid = services["reader"].pid
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            time.sleep(30)
    took = time.monotonic() - killed
    log = tmp_path / "reader.log"
    assert took < 5, took
    assert str(info.value) == (
        f"service reader ({PYTHON} of services.reader.command, pid {pid}) exited with status -9 (killed by signal "
        f"SIGKILL) while the run was using it; the end of its log ({log}):\n"
        + "\n".join(log.read_text().splitlines()[:-1]))
    assert f"serving m on port {port} (pid {pid})" in str(info.value)
    assert (info.value.name, info.value.pid, info.value.status) == ("reader", pid, -9)
    assert log.read_text().splitlines()[-1].endswith("stopped (exit status -9)")
    assert signal.getsignal(signal.SIGUSR1) == before and not port_in_use("127.0.0.1", port)
    assert time.monotonic() - started < 20


def test_an_unwatched_server_may_die_while_the_block_goes_on(script, tmp_path):
    """``watch_death=False`` (a test that kills the server its clients use, on purpose): the block
    is neither interrupted nor failed at its end; the server is still stopped and its port free."""
    port = free_port()
    with running_services({"reader": spec_for(script, port)}, tmp_path, echo=lambda _: None,
                          watch_death=False) as services:
        pid = services["reader"].pid
        os.kill(pid, signal.SIGKILL)
        time.sleep(1.5)  # three watcher polls, were it watched
        went_on = True
    assert went_on and not process_running(pid) and not port_in_use("127.0.0.1", port)
    assert (tmp_path / "reader.log").read_text().splitlines()[-1].endswith("stopped (exit status -9)")


def test_each_of_several_services_is_watched_and_a_deliberate_stop_is_no_death(script, tmp_path):
    specs = {"reader": spec_for(script, free_port()), "stage1": spec_for(script, free_port())}
    theirs: list[int] = []

    def handler(signum, frame):
        theirs.append(signum)

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        with running_services(specs, tmp_path, echo=lambda _: None) as services:  # stopped on exit: no ServiceDied
            pids = {name: s.pid for name, s in services.items()}
            reapers = [reaper_pid(pid) for pid in pids.values()]
            os.kill(os.getpid(), signal.SIGUSR1)  # not from a watcher: the handler set before gets it
            time.sleep(0.2)
        assert theirs == [signal.SIGUSR1] and signal.getsignal(signal.SIGUSR1) is handler  # restored
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert all(not process_running(pid) for pid in [*pids.values(), *reapers])  # the reapers dismissed too
    assert "reaper" not in (tmp_path / "reader.log").read_text()  # a deliberate stop: nothing for it to do
    # The first of two nested blocks dies: the inner one is stopped on the way out too.
    with pytest.raises(ServiceDied, match=rf"^service reader \({PYTHON} of services\.reader\.command, pid \d+\) "
                                         r"exited with status -15"):
        with running_services({"reader": specs["reader"]}, tmp_path, echo=lambda _: None) as outer:
            with running_services({"stage1": specs["stage1"]}, tmp_path, echo=lambda _: None) as inner:
                os.kill(outer["reader"].pid, signal.SIGTERM)
                time.sleep(30)
    assert not process_running(inner["stage1"].pid) and not process_running(outer["reader"].pid)


def test_outside_the_main_thread_the_death_is_reported_when_the_block_ends(script, tmp_path):
    got: list[BaseException] = []

    def work():
        try:
            with running_services({"reader": spec_for(script, free_port())}, tmp_path, echo=lambda _: None) as s:
                os.kill(s["reader"].pid, signal.SIGKILL)
                time.sleep(1.5)  # no signal can reach this thread: the block runs to its end
        except BaseException as exc:  # noqa: B036 - handed to the test's thread
            got.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=30)
    assert len(got) == 1 and isinstance(got[0], ServiceDied) and got[0].status == -9


def test_a_death_the_block_swallows_is_still_its_error(script, tmp_path):
    with pytest.raises(ServiceDied, match=rf"^service reader \({PYTHON} of services\.reader\.command, pid \d+\) "
                                         r"exited with status -9"):
        with running_services({"reader": spec_for(script, free_port())}, tmp_path, echo=lambda _: None) as s:
            os.kill(s["reader"].pid, signal.SIGKILL)
            try:
                time.sleep(30)
            except Exception:  # a broad handler in the work must not hide the death
                pass


def test_child_processes_are_found_and_only_the_same_ones_killed(tmp_path):
    # A parent (its own session) whose two children each lead a process group of their own, as
    # torchrun's ranks do: found with their start times; kill_groups stops the ones still running
    # as noted and leaves a pid whose start time differs (a later process given that id) alone.
    from memsearch.serving.ownership import child_processes, kill_groups

    code = ("import subprocess, sys, time\n"
            "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)"
            " for _ in range(2)]\n"
            "print(' '.join(str(k.pid) for k in kids), flush=True)\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        kids = [int(p) for p in parent.stdout.readline().split()]
        found = child_processes(parent.pid)
        assert sorted(found) == sorted(kids) and all(found[k] == process_start_time(k) for k in kids)
        assert child_processes(kids[0]) == {}
        kill_groups({kids[0]: found[kids[0]], kids[1]: "not-its-start-time"})
        deadline = time.monotonic() + 10
        while process_running(kids[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_running(kids[0]) and process_running(kids[1])
    finally:
        for pid in (*child_processes(parent.pid), parent.pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        parent.wait()
