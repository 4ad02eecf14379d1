"""Model servers as child processes: refuse a taken port before anything starts, start each in a
session of its own with its log file, wait (bounded) until it is ready, record what it serves,
and always stop every one of them (SIGTERM to its process group, then SIGKILL) and wait for its
port to be free again, whether the work inside ends, fails or is interrupted::

    check_ports_free(specs)
    with stop_on_signals(), running_services(specs, run / "logs", gpus={"reader": [7]}) as services:
        url = services["reader"].url   # http://127.0.0.1:8001/v1, listing services["reader"].served_name
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from memsearch.errors import InputError
from memsearch.serving.engines import (
    HAS_HEALTH,
    LABELS,
    ServiceSpec,
    check_engine_installed,
    engine_environment,
    launch_command,
)

LOG_TAIL_LINES = 30
STOP_WAIT_S = 30.0  # per signal: SIGTERM, then SIGKILL
PORT_FREE_WAIT_S = 30.0
POLL_S = 0.5


@dataclass(frozen=True)
class RunningService:
    """A started, ready server: its API root ``url`` (``http://host:port/v1``), the name requests
    use, its process id and log, and ``identity``: its ``/v1/models`` entry as the server wrote it."""

    name: str
    engine: str
    url: str
    served_name: str
    pid: int
    log: Path
    identity: dict


def listed_models(url: str, timeout_s: float) -> list[dict]:
    with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=timeout_s) as response:
        data = json.loads(response.read())
    return [m for m in data.get("data") or [] if isinstance(m, dict)]


def served_identity(url: str, name: str, timeout_s: float = 10) -> dict:
    """The ``{url}/models`` entry whose id is ``name`` (``url`` is the API root, ``.../v1``);
    ``InputError`` when the server does not answer or does not list it."""
    try:
        models = listed_models(url, timeout_s)
    except (OSError, ValueError) as exc:
        raise InputError(f"{url}: GET /models failed ({type(exc).__name__}: {exc}); is the server running?") from None
    for entry in models:
        if entry.get("id") == name:
            return entry
    raise InputError(f"{url}: the server lists {[m.get('id') for m in models]}, not {name!r}; serve the model under "
                     "that name or fix the configured name")


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on ``host:port``: a bind there fails. SO_REUSEADDR, as servers
    set it, so the connections a stopped server left in TIME_WAIT do not count."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def check_ports_free(specs: Mapping[str, ServiceSpec]) -> None:
    """Refuse (``InputError``) two services on one port, or a port something already listens on,
    naming the port and the service, before any server starts."""
    owner: dict[int, str] = {}
    for name, spec in specs.items():
        if spec.port in owner:
            raise InputError(f"port {spec.port} is given to both service {owner[spec.port]} and service {name}; "
                             "give each service its own port")
        owner[spec.port] = name
    for name, spec in specs.items():
        if port_in_use(spec.host, spec.port):
            raise InputError(f"port {spec.port} (service {name}) is already in use on {spec.host}; stop what listens "
                             "there or choose another port")


def log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a server log (for the error that quotes it)."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user took the id: not ours any more
        return False
    return True


def stop_process(proc: subprocess.Popen, host: str | None = None, port: int | None = None) -> None:
    """Stop a server started in a session of its own and everything it started: SIGTERM to its
    process group, wait, then SIGKILL; then wait (bounded) until ``port`` is free again. The
    group is signalled even when the leader has exited, since workers it spawned may remain."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + STOP_WAIT_S
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            continue
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _group_alive(proc.pid):
            break
    if proc.poll() is None:
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:  # unkillable (uninterruptible I/O): nothing more to do
            pass
    if port is not None:
        deadline = time.monotonic() + PORT_FREE_WAIT_S
        while port_in_use(host or "127.0.0.1", port) and time.monotonic() < deadline:
            time.sleep(0.1)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _wait_ready(proc: subprocess.Popen, spec: ServiceSpec, url: str, log: Path, label: str,
                timeout_key: str) -> dict:
    """Poll until the server is ready and return its /v1/models entry; ``InputError`` with the
    log's tail when it exits first, times out, or lists another name."""
    root = url[: -len("/v1")]
    probe = "/health" if HAS_HEALTH[spec.engine] else "/v1/models"
    deadline = time.monotonic() + spec.start_timeout_s
    while True:
        if proc.poll() is not None:
            raise InputError(f"{label} exited with status {proc.returncode} before answering {probe} at {root}; "
                             f"the end of its log ({log}):\n{log_tail(log)}")
        if _answers(root + probe):
            break
        if time.monotonic() > deadline:
            raise InputError(f"{label} did not answer {probe} at {root} within {spec.start_timeout_s:g} s "
                             f"({timeout_key}); the end of its log ({log}):\n{log_tail(log)}")
        time.sleep(POLL_S)
    try:
        models = listed_models(url, 10)
    except (OSError, ValueError) as exc:
        raise InputError(f"{label} at {url}: GET /models failed ({type(exc).__name__}: {exc}); the end of its log "
                         f"({log}):\n{log_tail(log)}") from None
    listed = {m.get("id"): m for m in models}
    missing = [name for name in (spec.name_served, *spec.adapters) if name not in listed]
    if missing:
        raise InputError(f"{label} at {url} lists {list(listed)}, not {', '.join(map(repr, missing))}; the end of "
                         f"its log ({log}):\n{log_tail(log)}")
    return listed[spec.name_served]


def _environment(spec: ServiceSpec, gpus: list[int] | None) -> dict[str, str]:
    env = dict(os.environ)
    if Path(spec.model).exists():  # a local folder or file: the server has nothing to download
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    env.update(engine_environment(spec, {**env, **spec.env}))
    env.update(spec.env)
    return env


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """A second Ctrl-C or SIGTERM while a server is being stopped must not cut the stop short
    (the server would be left running): in the main thread, such signals are held until the
    stop is done (bounded: ``stop_process``), then raised."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, lambda signum, frame: held.append(signum)) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if held:
            signal.raise_signal(held[0])


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@contextmanager
def started_service(name: str, spec: ServiceSpec, log: Path, gpus: list[int] | None = None, echo=print,
                    title: str | None = None, timeout_key: str | None = None) -> Iterator[RunningService]:
    """One server: started in a session of its own (its output appended to ``log`` after a
    header line and its pid), waited for, yielded as a ``RunningService``, stopped on exit
    however the block ends. ``gpus``: its ``CUDA_VISIBLE_DEVICES``. ``title`` starts the line
    echoed once it is ready; ``timeout_key`` is the setting the timeout message names."""
    check_engine_installed(name, spec)
    command = launch_command(spec)
    label = LABELS[spec.engine]
    url = f"http://{spec.host}:{spec.port}/v1"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"=== {_stamp()} {' '.join(command)}\n")
        fh.flush()
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=_environment(spec, gpus), start_new_session=True)
        except OSError as exc:
            raise InputError(f"service {name}: cannot start {command[0]!r} ({exc}); install {label} or give the "
                             f"services.{name}.command that starts it") from None
        fh.write(f"=== pid {proc.pid}\n")
    try:
        identity = _wait_ready(proc, spec, url, log, label, timeout_key or f"services.{name}.start_timeout_s")
        echo(f"{title or f'service {name}'}: {label} {spec.model} at {url} (pid {proc.pid}, ready in "
             f"{time.perf_counter() - start:.1f} s; log {log})")
        yield RunningService(name, spec.engine, url, spec.name_served, proc.pid, log, identity)
    finally:
        with _signals_deferred():
            stop_process(proc, spec.host, spec.port)
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"=== {_stamp()} stopped (exit status {proc.returncode})\n")


@contextmanager
def running_services(specs: Mapping[str, ServiceSpec], log_dir: Path, gpus: Mapping[str, list[int]] | None = None,
                     echo=print) -> Iterator[dict[str, RunningService]]:
    """Start every service of ``specs`` (ports checked first; each logs to ``log_dir/NAME.log``,
    sees ``gpus[NAME]`` as ``CUDA_VISIBLE_DEVICES`` when given) and yield them by name once all
    are ready; on exit, normal or not (an error, Ctrl-C, ``SystemExit`` from
    ``stop_on_signals``), every started one is stopped and its port free again."""
    check_ports_free(specs)
    with ExitStack() as stack:
        running: dict[str, RunningService] = {}
        for name, spec in specs.items():
            service_gpus = None if gpus is None or name not in gpus else list(gpus[name])
            running[name] = stack.enter_context(
                started_service(name, spec, Path(log_dir) / f"{name}.log", service_gpus, echo)
            )
        yield running


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise ``SystemExit(128 + signum)`` in the main thread, so
    every ``with`` block unwinds and the services it started are stopped (SIGINT already raises
    ``KeyboardInterrupt``). The previous handlers are restored afterwards. Outside the main
    thread (where Python cannot install handlers) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum, frame):
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, _exit) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
