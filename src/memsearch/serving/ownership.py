"""Who owns a server process and the port it listens on (Linux ``/proc``), so that the servers
a run starts are the ones that answer, do not outlive the run, and can be found again:

- ``port_holders(host, port)``: the processes listening on ``host:port`` (``/proc/net/tcp``,
  ``/proc/net/tcp6``: state 0A, the socket's inode; ``/proc/PID/fd`` links ``socket:[inode]``),
  so ``process._wait_ready`` can tell its own server from another run's on the same port.
- ``start_reaper`` / ``release_reaper``: a small watcher process per started server that stops
  the server's process group (SIGTERM, then SIGKILL) once the run that started it is gone,
  ``kill -9`` and the OOM killer included (the server runs in a session of its own, so nothing
  else would reach it). It learns of the run's death from a pipe whose write end only the run
  holds (end of file), and by polling its parent id (a forked copy of the run may hold the pipe).
- ``recorded_orphans`` / ``stop_orphan``: servers a previous invocation recorded (pid and
  ``process_start_time``) that still run, for when a reaper was killed too.

Without ``/proc`` (not Linux) these functions answer None or nothing: the port owner is not
checked (any answer at the address counts, as before) and orphans are not found; the reaper
still works (it polls process groups with signal 0).
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from memsearch.errors import InputError

STOP_WAIT_S = 30.0  # per signal: SIGTERM, then SIGKILL (here and in process.stop_process)
PORT_FREE_WAIT_S = 30.0
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


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


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name: [state, ppid, pgrp, session, ...]; None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start_time(pid: int) -> str | None:
    """``pid``'s start time (``/proc/PID/stat`` field 22, clock ticks since boot), None when it is
    gone or there is no ``/proc``: with the pid it tells a process from a later one given its id."""
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def process_running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (an exited process not yet waited for serves
    nothing; one left by a killed parent stays a zombie until its new parent waits for it)."""
    fields = _stat(pid)
    if fields is not None:
        return fields[0] != "Z"
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return not Path("/proc/self").exists()  # with /proc, no stat file means gone


def command_line(pid: int) -> str | None:
    """``pid``'s command line (``/proc/PID/cmdline``), None where unreadable."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part) or None


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def group_members(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that are not zombies (``/proc``; without it, the
    leader when signal 0 reaches the group)."""
    if not Path("/proc/self").exists():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for pid in _pids():
        fields = _stat(pid)
        if fields and fields[2] == str(pgid) and fields[0] != "Z":
            members.append(pid)
    return members


def child_processes(pid: int) -> dict[int, str]:
    """The child processes of ``pid`` by id, each with its ``process_start_time`` (``/proc``;
    without it, none)."""
    found = {}
    for child in _pids():
        fields = _stat(child)
        if fields and len(fields) > 19 and fields[1] == str(pid):
            found[child] = fields[19]
    return found


def kill_groups(processes: Mapping[int, str]) -> None:
    """SIGKILL the process group of each of ``processes`` (pid -> start time) that still runs as
    the process noted (the same start time: never a later process given its id)."""
    for pid, started in processes.items():
        if process_start_time(pid) == started:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _address(hexaddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp(6) writes it: hex of 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hexaddr)
    ip = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
    return ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip


def _host_addresses(host: str, port: int) -> set | None:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return None
    found = set()
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%")[0])
        found.add(ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip)
    return found


def listening_sockets(host: str, port: int) -> dict[int, int] | None:
    """The listening TCP sockets that serve ``host:port``, as inode -> owner uid: those bound to
    an address ``host`` resolves to or to the wildcard address (any, when ``host`` is itself a
    wildcard or does not resolve). None without ``/proc/net/tcp``."""
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not tables[0].exists():
        return None
    wanted = _host_addresses(host, port)
    anywhere = wanted is None or any(ip.is_unspecified for ip in wanted)
    found: dict[int, int] = {}
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != LISTEN:
                continue
            addr, _, hexport = cols[1].partition(":")
            if int(hexport, 16) != port:
                continue
            ip = _address(addr)
            if anywhere or ip.is_unspecified or ip in wanted:
                found[int(cols[9])] = int(cols[7])
    return found


def socket_holders(inodes: set[int], pids: list[int] | None = None) -> dict[int, int]:
    """inode -> the first of ``pids`` (default: every process) holding that socket open, where
    its ``/proc/PID/fd`` is readable (a process of another user's is not)."""
    links = {f"socket:[{inode}]": inode for inode in inodes}
    held: dict[int, int] = {}
    for pid in _pids() if pids is None else pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                inode = links.get(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
            if inode is not None and inode not in held:
                held[inode] = pid
        if len(held) == len(links):
            break
    return held


@dataclass(frozen=True)
class PortHolder:
    """A listening socket on the port: its inode, owner uid, and the process holding it (``pid``
    and ``command``; None when not readable, e.g. another user's process)."""

    inode: int
    uid: int
    pid: int | None
    command: str | None

    def describe(self) -> str:
        """``pid Q (command)``, or what is known without it."""
        if self.pid is None:
            return f"a process of uid {self.uid} (its pid is not readable here)"
        command = self.command if self.command is None or len(self.command) <= 200 else self.command[:197] + "..."
        return f"pid {self.pid}" + (f" ({command})" if command else "")


def port_holders(host: str, port: int, pgid: int | None = None) -> list[PortHolder] | None:
    """The listeners on ``host:port`` not held by a process of group ``pgid`` (every listener when
    ``pgid`` is None), each with its process where readable. None without ``/proc``: unknown.
    A listener must show up in two reads, so one closed between them does not count."""
    for _ in range(2):
        sockets = listening_sockets(host, port)
        if sockets is None:
            return None
        if pgid is not None and sockets:
            ours = socket_holders(set(sockets), group_members(pgid))
            sockets = {inode: uid for inode, uid in sockets.items() if inode not in ours}
        if not sockets:
            return []
    holders = socket_holders(set(sockets))
    return [PortHolder(inode, uid, holders.get(inode), command_line(holders[inode]) if inode in holders else None)
            for inode, uid in sorted(sockets.items())]


# ----------------------------------------------------------------------------- the reaper

# Run with `python -I -c` (standard library only, nothing of memsearch to import): argv is the
# server's pgid, its start time (or "-"), its log, and the seconds to wait after each signal.
_REAPER = r"""
import os, select, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
pgid, started, log, wait_s = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
parent = os.getppid()

def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None

def members():
    if not os.path.exists("/proc/self"):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for name in os.listdir("/proc"):
        f = stat(name) if name.isdigit() else None
        if f and f[2] == str(pgid) and f[0] != "Z":
            return True
    return False

def note(text):
    try:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} reaper (pid {os.getpid()}): {text}\n")
    except OSError:
        pass

while True:
    ready, _, _ = select.select([0], [], [], 1.0)
    if ready:
        data = os.read(0, 64)
        if b"q" in data:
            sys.exit(0)
        if not data:
            break
    if os.getppid() != parent:
        break
leader = stat(pgid)
if leader is not None and started != "-" and leader[19] != started:
    note(f"the run (pid {parent}) is gone; pid {pgid} is now another process: nothing to stop")
    sys.exit(0)
if not members():
    sys.exit(0)
note(f"the run (pid {parent}) is gone; stopping the server's process group {pgid} (SIGTERM, then SIGKILL)")
for sig in (signal.SIGTERM, signal.SIGKILL):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        break
    deadline = time.monotonic() + wait_s
    while members() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not members():
        break
note("the server's process group is gone" if not members() else "the server's process group outlived SIGKILL")
"""


@dataclass
class _Reaper:
    proc: subprocess.Popen
    write_fd: int

    def dismiss(self) -> None:
        """Tell the reaper the run stopped the server itself: it exits without signalling anything."""
        try:
            os.write(self.write_fd, b"q")
        except OSError:  # it is gone already
            pass
        os.close(self.write_fd)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


_REAPERS: dict[int, _Reaper] = {}


def start_reaper(pid: int, started: str | None, log: Path) -> None:
    """Start the reaper of the server ``pid`` (leader of its own process group, started at
    ``started``): it stops that group when this process dies without ``release_reaper(pid)``.
    Its notes go to the server's ``log``. The pipe's write end stays in this process only (not
    inheritable; servers are started with ``close_fds``)."""
    read_fd, write_fd = os.pipe()
    try:
        with open(log, "a", encoding="utf-8") as fh:
            proc = subprocess.Popen([sys.executable, "-I", "-c", _REAPER, str(pid), started or "-", str(log),
                                     str(STOP_WAIT_S)], stdin=read_fd, stdout=subprocess.DEVNULL, stderr=fh,
                                    start_new_session=True)  # so the terminal's Ctrl-C does not reach it
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    _REAPERS[pid] = _Reaper(proc, write_fd)


def release_reaper(pid: int) -> None:
    """End the reaper of server ``pid`` without it signalling anything (the run stopped the
    server itself); nothing when it has none."""
    reaper = _REAPERS.pop(pid, None)
    if reaper is not None:
        reaper.dismiss()


def reaper_pid(pid: int) -> int | None:
    """The reaper process of server ``pid``, while it has one (for tests and diagnostics)."""
    reaper = _REAPERS.get(pid)
    return None if reaper is None else reaper.proc.pid


# ----------------------------------------------------------------------------- orphans


@dataclass(frozen=True)
class Orphan:
    """A server a previous invocation recorded that still runs: ``name`` as recorded (``stage1
    seed-1`` for a per-seed entry), its pid (the leader of its process group), start time, URL
    and log."""

    name: str
    pid: int
    started: str
    url: str
    log: str


def _entries(services: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    found = []
    for name, entry in services.items():
        if not isinstance(entry, Mapping):
            continue
        if "pid" in entry:
            found.append((name, entry))
        else:  # per seed: {"seed-1": entry, ...}
            found += [(f"{name} {key}", sub) for key, sub in entry.items() if isinstance(sub, Mapping) and "pid" in sub]
    return found


def _group_serves(pgid: int, url: object) -> bool:
    """Whether a process of group ``pgid`` listens on ``url``'s port: with the leader gone, the
    only sign that the group (its id cannot be given again while it has members) is the
    recorded server's."""
    address = urlsplit(str(url or ""))
    members = group_members(pgid)
    if address.port is None or not members:
        return False
    sockets = listening_sockets(address.hostname or "127.0.0.1", address.port) or {}
    return bool(socket_holders(set(sockets), members)) if sockets else False


def recorded_orphans(services: Mapping[str, Any]) -> list[Orphan]:
    """The recorded servers of ``services`` still running: ``services`` maps a service name to
    its entry (a dict with at least ``pid``, ``started``: ``process_start_time`` when it was
    recorded, ``url``, ``log``), or to ``{"seed-N": entry}`` per seed, as a run record holds
    them. A server counts when its pid runs with the same start time, or when the leader is
    gone but a process of its process group still listens on its URL's port (a worker left
    serving; workers that serve no port are not found). An entry without
    ``started`` (an older record) cannot tell the server from a later process given its pid,
    and is never one. Nothing without ``/proc``."""
    if not Path("/proc/self").exists():
        return []
    orphans = []
    for name, entry in _entries(services):
        try:
            pid, started = int(entry["pid"]), entry.get("started")
        except (TypeError, ValueError):
            continue
        if not isinstance(started, str) or not started:
            continue
        now = process_start_time(pid)
        if now is not None and now != started:
            continue  # the id was given to another process
        if (now is not None and process_running(pid)) or (now is None and _group_serves(pid, entry.get("url"))):
            orphans.append(Orphan(name, pid, started, str(entry.get("url", "")), str(entry.get("log", ""))))
    return orphans


def stop_orphan(orphan: Orphan, echo=print) -> None:
    """Stop ``orphan`` (from ``recorded_orphans``) and its process group: SIGTERM, wait, then
    SIGKILL; then wait (bounded) until its port is free. ``InputError`` when it is not this
    user's to stop or outlives SIGKILL, naming the pid and its log."""
    echo(f"service {orphan.name}: pid {orphan.pid} from the previous invocation (started {orphan.started}, log "
         f"{orphan.log}) is still serving at {orphan.url}; stopping it")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process_start_time(orphan.pid) not in (None, orphan.started):
            return  # gone, and its id given to another process since
        try:
            os.killpg(orphan.pid, sig)
        except ProcessLookupError:
            break
        except PermissionError:
            raise InputError(f"service {orphan.name}: pid {orphan.pid} at {orphan.url} is not this user's to stop; "
                             f"stop it as its owner (its log: {orphan.log})") from None
        deadline = time.monotonic() + STOP_WAIT_S
        while group_members(orphan.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not group_members(orphan.pid):
            break
    else:
        raise InputError(f"service {orphan.name}: pid {orphan.pid} at {orphan.url} outlived SIGKILL (uninterruptible "
                         f"I/O?); stop it by hand before starting again (its log: {orphan.log})")
    address = urlsplit(orphan.url)
    if address.port is not None:
        deadline = time.monotonic() + PORT_FREE_WAIT_S
        while port_in_use(address.hostname or "127.0.0.1", address.port) and time.monotonic() < deadline:
            time.sleep(0.1)
