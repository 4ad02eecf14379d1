"""Model servers as child processes: refuse a taken port before anything starts, start each in a
session of its own with its log file, wait (bounded) until it is ready, record what it serves,
and always stop every one of them (SIGTERM to its process group, then SIGKILL) and wait for its
port to be free again, whether the work inside ends, fails or is interrupted::

    check_ports_free(specs)
    with stop_on_signals(), running_services(specs, run / "logs", gpus={"reader": [7]}) as services:
        url = services["reader"].url   # http://127.0.0.1:8001/v1, listing services["reader"].served_name

A server is ready only when the process we started (or one of its process group: workers) is the
one listening on its port (``ownership.port_holders``): another run's server on the same port is
refused at once (``PortTaken``) rather than taken for ours. A reaper process per server stops it
when this process dies without stopping it (``kill -9``, the OOM killer), and while a block uses
a server, its exit interrupts the block (``ServiceDied``) instead of surfacing later as failed
requests. Without ``/proc`` (not Linux) the port owner is not checked: any answer counts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from memsearch.backends.served_model import served_entry
from memsearch.errors import InputError
from memsearch.serving.engines import (
    HAS_HEALTH,
    LABELS,
    ServiceSpec,
    check_engine_installed,
    engine_environment,
    launch_command,
)
from memsearch.serving.ownership import (
    PORT_FREE_WAIT_S,
    STOP_WAIT_S,
    listening_sockets,
    port_holders,
    port_in_use,
    process_start_time,
    release_reaper,
    start_reaper,
)

LOG_TAIL_LINES = 30
POLL_S = 0.5


@dataclass(frozen=True)
class RunningService:
    """A started, ready server: its API root ``url`` (``http://host:port/v1``), the name requests
    use, its process id and log, ``identity``: its ``/v1/models`` entry as the server wrote it, and
    ``started``: the process's start time (``ownership.process_start_time``; None without
    ``/proc``), which tells it from a later process given the same pid (``recorded_orphans``)."""

    name: str
    engine: str
    url: str
    served_name: str
    pid: int
    log: Path
    identity: dict
    started: str | None = None


class PortTaken(InputError):
    """Another process listens on the port of a server we started: not ours, so never ready."""


class ServiceDied(InputError):
    """A server we started exited on its own while the block using it was active: ``name``,
    ``pid``, exit ``status`` (negative: the signal that killed it) and ``log``."""

    def __init__(self, message: str, name: str, pid: int, status: int | None, log: Path) -> None:
        super().__init__(message)
        self.name, self.pid, self.status, self.log = name, pid, status, log


def served_identity(url: str, name: str, timeout_s: float = 10) -> dict:
    """The ``{url}/models`` entry whose id is ``name`` (``url`` is the API root, ``.../v1``);
    ``InputError`` when the server does not answer or does not list it
    (``backends.served_model.served_entry``, the one served-model check)."""
    return served_entry(url, name, timeout_s, remedy="serve the model under that name or fix the configured name")


def free_port_near(host: str, port: int, avoid: Collection[int] = ()) -> int | None:
    """The first port above ``port`` (within 200) that nothing listens on and ``avoid`` does not
    hold: a concrete suggestion for a refusal message; None when there is none."""
    for candidate in range(port + 1, min(port + 200, 65535) + 1):
        if candidate not in avoid and not port_in_use(host, candidate):
            return candidate
    return None


def _move_hint(name: str, spec: ServiceSpec, port_key: str | None, avoid: Collection[int] = ()) -> str:
    """How to move service ``name`` to another port: its setting ``port_key`` (e.g.
    ``services.reader.port``) with a free port to give it, or in words when it has no setting."""
    if port_key is None:
        return f"give service {name} another port"
    near = free_port_near(spec.host, spec.port, {*avoid, spec.port})
    return f"move this service with --set {port_key}={near if near is not None else 'PORT'} (a free port)"


def check_ports_free(specs: Mapping[str, ServiceSpec], port_key: str | None = "services.{name}.port") -> None:
    """Refuse (``InputError``) two services on one port, or a port something already listens on,
    naming the port, the service, the process listening there (where readable) and how to move
    the service: ``port_key`` is the setting of a service's port, ``{name}`` its name
    (``memsearch experiment run``: ``services.NAME.port``); None: no setting to name."""
    owner: dict[int, str] = {}
    for name, spec in specs.items():
        if spec.port in owner:
            raise InputError(f"port {spec.port} is given to both service {owner[spec.port]} and service {name}; "
                             "give each service its own port")
        owner[spec.port] = name
    for name, spec in specs.items():
        if port_in_use(spec.host, spec.port):
            holders = port_holders(spec.host, spec.port) or []
            by = f" by {', '.join(h.describe() for h in holders)}" if holders else ""
            key = None if port_key is None else port_key.format(name=name)
            raise InputError(f"port {spec.port} (service {name}) is already in use on {spec.host}{by}; stop what "
                             f"listens there or {_move_hint(name, spec, key, set(owner))}")


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
    group is signalled even when the leader has exited, since workers it spawned may remain.
    Its reaper (``ownership.start_reaper``), where it has one, is then dismissed."""
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
    release_reaper(proc.pid)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _taken(name: str, spec: ServiceSpec, proc: subprocess.Popen, holders: list, log: Path,
           port_key: str | None) -> PortTaken:
    """The refusal when another process holds the port of the server we started."""
    state = "which is still starting" if proc.poll() is None else f"which exited with status {proc.returncode}"
    who = ", ".join(h.describe() for h in holders) or "a process not visible from here"
    return PortTaken(f"port {spec.port} on {spec.host} is served by {who}, not by the service {name} we started "
                     f"(pid {proc.pid}, {state}); another run or program holds it: stop it or "
                     f"{_move_hint(name, spec, port_key)}; the end of our server's log ({log}):\n{log_tail(log, 10)}")


def _owned(name: str, spec: ServiceSpec, proc: subprocess.Popen, log: Path, port_key: str | None) -> bool | None:
    """Whether only our server's process group listens on its port: True, False while nothing
    listens there yet, None without ``/proc`` (unknown); ``PortTaken`` when another process does."""
    others = port_holders(spec.host, spec.port, proc.pid)  # started with start_new_session: pgid == pid
    if others:
        raise _taken(name, spec, proc, others, log, port_key)
    if others is None:
        return None
    return bool(listening_sockets(spec.host, spec.port))


def _wait_ready(proc: subprocess.Popen, spec: ServiceSpec, url: str, log: Path, label: str,
                timeout_key: str, name: str = "", port_key: str | None = None) -> dict:
    """Poll until the server is ready and return its /v1/models entry; ``InputError`` with the
    log's tail when it exits first, times out, or lists another name; ``PortTaken`` at once when
    another process listens on its port (our process alive and the port's only listener is what
    ready means; without ``/proc``, an answer alone); ``ServiceDied`` when a server started
    before it dies meanwhile."""
    root = url[: -len("/v1")]
    probe = "/health" if HAS_HEALTH[spec.engine] else "/v1/models"
    deadline = time.monotonic() + spec.start_timeout_s
    while True:
        _raise_pending_death()
        _owned(name, spec, proc, log, port_key)
        if proc.poll() is not None:
            raise InputError(f"{label} exited with status {proc.returncode} before answering {probe} at {root}; "
                             f"the end of its log ({log}):\n{log_tail(log)}")
        if _answers(root + probe):
            owned = _owned(name, spec, proc, log, port_key)
            if owned is False:  # something answers, yet no listener of the port is visible here
                raise _taken(name, spec, proc, [], log, port_key)
            if proc.poll() is None:
                break
            continue  # it exited meanwhile: the check at the top says how
        if time.monotonic() > deadline:
            raise InputError(f"{label} did not answer {probe} at {root} within {spec.start_timeout_s:g} s "
                             f"({timeout_key}); the end of its log ({log}):\n{log_tail(log)}")
        time.sleep(POLL_S)
    try:
        for adapter in spec.adapters:
            served_entry(url, adapter, setting="adapter")
        return served_entry(url, spec.name_served, setting="served name")
    except InputError as exc:
        raise InputError(f"{label}: {exc}; the end of its log ({log}):\n{log_tail(log)}") from None


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


# ----------------------------------------------------------------------------- death while in use

# The signal a watcher sends the main thread when its server died; its handler is installed
# while at least one block started from the main thread is active (the previous one restored).
DEATH_SIGNAL = signal.SIGUSR1
_WATCHES: list[_Watch] = []
_HANDLER: dict[str, object] = {"depth": 0, "previous": None}


class _Watch:
    """A daemon thread polling a server's process while a block uses it; when the server exits
    on its own, it keeps the error and nudges the main thread (``DEATH_SIGNAL``) until the
    handler has raised it there (once: never again in the unwinding that follows)."""

    def __init__(self, name: str, label: str, proc: subprocess.Popen, log: Path, main: bool) -> None:
        self.name, self.label, self.proc, self.log = name, label, proc, log
        self.died: str | None = None
        self.raised = False
        self.done = threading.Event()
        self.target = threading.main_thread().ident if main else None
        self.thread = threading.Thread(target=self._run, name=f"memsearch-watch-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(POLL_S):
            status = self.proc.poll()
            if status is None:
                continue
            if self.died is None:
                how = f" (killed by signal {signal.Signals(-status).name})" if status < 0 else ""
                self.died = (f"service {self.name} ({self.label}, pid {self.proc.pid}) exited with status {status}"
                             f"{how} while the run was using it; the end of its log ({self.log}):\n"
                             f"{log_tail(self.log)}")
            if self.target is None or self.raised:
                return
            signal.pthread_kill(self.target, DEATH_SIGNAL)

    def error(self) -> ServiceDied:
        return ServiceDied(self.died or "", self.name, self.proc.pid, self.proc.returncode, self.log)

    def end(self) -> None:
        """Stop watching (before a deliberate stop, which must never count as a death)."""
        self.done.set()
        self.thread.join()


def _raise_pending_death() -> None:
    """Raise the ``ServiceDied`` of a watched server that died and was not reported yet."""
    for watch in _WATCHES:
        if watch.died is not None and not watch.raised:
            watch.raised = True
            raise watch.error()


def _in_own_code(frame) -> bool:
    """Whether ``frame`` runs inside a start or stop of ours (``started_service``,
    ``running_services``: their generator frames are on the stack only then): a death is raised
    there synchronously (``_wait_ready``) or not at all, never in the middle of a stop."""
    while frame is not None:
        if frame.f_code in _OWN_CODE:
            return True
        frame = frame.f_back
    return False


def _on_death_signal(signum, frame) -> None:
    if any(w.died is not None and not w.raised for w in _WATCHES):
        if not _in_own_code(frame):
            _raise_pending_death()
        return  # ours: the watcher nudges again (or the block's end reports it)
    previous = _HANDLER["previous"]
    if callable(previous):  # someone else's signal: theirs to handle (none set: ignored meanwhile)
        previous(signum, frame)


@contextmanager
def _watched(name: str, label: str, proc: subprocess.Popen, log: Path) -> Iterator[_Watch]:
    """Watch ``proc`` while inside; the handler of ``DEATH_SIGNAL`` is installed by the outermost
    such block of the main thread and restored when it ends. Outside the main thread no
    handler can be set: the death is reported when the block ends."""
    main = threading.current_thread() is threading.main_thread()
    if main:
        if _HANDLER["depth"] == 0:
            _HANDLER["previous"] = signal.signal(DEATH_SIGNAL, _on_death_signal)
        _HANDLER["depth"] += 1
    watch = _Watch(name, label, proc, log, main)
    _WATCHES.append(watch)
    try:
        yield watch
    finally:
        watch.end()
        _WATCHES.remove(watch)
        if main:
            _HANDLER["depth"] -= 1
            if _HANDLER["depth"] == 0:
                signal.signal(DEATH_SIGNAL, _HANDLER["previous"] or signal.SIG_DFL)


@contextmanager
def started_service(name: str, spec: ServiceSpec, log: Path, gpus: list[int] | None = None, echo=print,
                    title: str | None = None, timeout_key: str | None = None,
                    port_key: str | None = None, watch_death: bool = True) -> Iterator[RunningService]:
    """One server: started in a session of its own (its output appended to ``log`` after a
    header line and its pid), guarded by a reaper (stopped if this process dies), waited for
    until it is the one listening on its port, yielded as a ``RunningService``, stopped on exit
    however the block ends. ``gpus``: its ``CUDA_VISIBLE_DEVICES``. ``title`` starts the line
    echoed once it is ready; ``timeout_key`` is the setting the timeout message names and
    ``port_key`` the one a port refusal names (default ``services.NAME.port`` unless
    ``timeout_key`` is given, i.e. the service is configured elsewhere; then none is named).

    If the server exits on its own while the block is active, the block is interrupted (main
    thread: at once, by ``DEATH_SIGNAL``; other threads: when it ends) with ``ServiceDied``
    quoting its log; the stop still happens. ``watch_death=False``: not watched (a caller that
    lets others use the server and kills it on purpose, as a test of those others does)."""
    check_engine_installed(name, spec)
    command = launch_command(spec)
    # A custom command is not the engine's server: messages name what was started.
    label = LABELS[spec.engine] if spec.command is None else f"{Path(command[0]).name} of services.{name}.command"
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
            fix = (f"install {label} or give the services.{name}.command that starts it" if spec.command is None
                   else f"fix services.{name}.command")
            raise InputError(f"service {name}: cannot start {command[0]!r} ({exc}); {fix}") from None
        fh.write(f"=== pid {proc.pid}\n")
    started = process_start_time(proc.pid)
    if port_key is None and timeout_key is None:
        port_key = f"services.{name}.port"
    watch: _Watch | None = None
    error: BaseException | None = None
    try:
        start_reaper(proc.pid, started, log)
        identity = _wait_ready(proc, spec, url, log, label, timeout_key or f"services.{name}.start_timeout_s",
                               name, port_key)
        echo(f"{title or f'service {name}'}: {label} {spec.model} at {url} (pid {proc.pid}, ready in "
             f"{time.perf_counter() - start:.1f} s; log {log})")
        with _watched(name, label, proc, log) if watch_death else nullcontext() as watch:
            yield RunningService(name, spec.engine, url, spec.name_served, proc.pid, log, identity, started)
    except BaseException as exc:
        error = exc
        raise
    finally:
        with _signals_deferred():  # another process holds the port: it will not be free, do not wait
            stop_process(proc, spec.host, None if isinstance(error, PortTaken) else spec.port)
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"=== {_stamp()} stopped (exit status {proc.returncode})\n")
        if watch is not None and watch.died is not None and (
                error is None or (isinstance(error, Exception) and not isinstance(error, ServiceDied))):
            # Not raised in the block (another thread) or caught there: the death is the cause
            # of whatever the block ended with (a user's interrupt stays what it is).
            watch.raised = True
            raise watch.error() from error


@contextmanager
def running_services(specs: Mapping[str, ServiceSpec], log_dir: Path, gpus: Mapping[str, list[int]] | None = None,
                     echo=print, watch_death: bool = True) -> Iterator[dict[str, RunningService]]:
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
                started_service(name, spec, Path(log_dir) / f"{name}.log", service_gpus, echo,
                                watch_death=watch_death)
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


# The frames in which a death signal never raises (``_in_own_code``).
_OWN_CODE = frozenset(f.__wrapped__.__code__ for f in (started_service, running_services, _watched))
