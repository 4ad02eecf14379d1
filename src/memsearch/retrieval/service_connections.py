"""Connections of the retrieval service: a cap below the open-file limit, and a listener that survives reaching it.

A client that opens connections and never completes a request must neither lock the other clients
out nor run the process out of file descriptors. Without this, at the descriptor limit normal
clients waited ~29 s and the log grew 70 MB a minute: CPython 3.11's asyncio logs a traceback for
every accept refused for want of descriptors, and retries every one. So the service
(``server.py``) caps its open connections (``connection_limits``: what the open-file limit leaves
room for, or ``--max-connections``); past the cap ``ConnectionGuard`` closes the oldest connection
that is not being answered (idle kept-alive, or still sending its request) and answers 503 only
when every connection is being answered. A connection younger than ``GRACE_S`` is closed only
when the cap is passed by more than a listen backlog: a flood of sockets that never finish a
request (slowloris) arrives in bursts larger than a small cap, and closing the oldest of a burst
closed the plain clients in it before they could send their request (measured: cap 50 and 300
such sockets reset 97 % of plain requests); given their grace, they are answered while the
flood's sockets, old by then, give way. And the listening socket (``listening_socket``) rests
for a moment after a refused accept instead of letting asyncio retry the whole burst. How long a
slow client may take is the HTTP layer's ``timeout_s`` (``server.py``), not this module's.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

from memsearch.errors import InputError

# Descriptors kept free below the open-file limit besides accept bursts (``connection_limits``):
# the index files, stdio, the runtime.
RESERVED_FDS = 64
LISTEN_BACKLOG = 128  # connections asyncio accepts at once; smaller under a low open-file limit
# How long a new connection has to send its request before it may be closed to make room for
# others (unless the cap is passed by more than a backlog): on loopback or a LAN a plain client's
# request arrives within milliseconds.
GRACE_S = 1.0


def connection_limits(configured: int | None) -> tuple[int, int]:
    """``(max_connections, listen backlog)`` in force under this process's open-file limit.

    asyncio accepts up to a backlog of connections at once, before the guard closes any, so the
    file descriptors kept free are twice the backlog (one burst, and the one being closed) plus
    ``RESERVED_FDS`` (index files, stdio, the runtime). ``configured`` (``None``: all the rest)
    above that is refused: the process would run out of descriptors under load."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = 1 << 16 if soft == resource.RLIM_INFINITY else soft
    backlog = min(LISTEN_BACKLOG, max(8, soft // 8))
    room = max(8, soft - RESERVED_FDS - 2 * backlog)
    if configured is not None and configured > room:
        raise InputError(f"--max-connections {configured}: the open-file limit ({soft}) leaves room for {room} "
                         "connections; raise it (ulimit -n) or lower --max-connections")
    return (room if configured is None else configured), backlog


class _Listener(socket.socket):
    """The listening socket. After an accept fails for want of file descriptors, the accepts left
    in the same burst answer "none waiting" for a moment: CPython 3.11's asyncio logs and schedules
    a retry for every one of them (up to the backlog each time), a storm that grows each second,
    keeps the event loop busy and wrote megabytes of tracebacks a second. It then retries once."""

    _resting_until = 0.0

    def accept(self):  # noqa: ANN201 - socket.socket's own signature
        if time.monotonic() < self._resting_until:
            raise BlockingIOError(errno.EAGAIN, "resting after running out of file descriptors")
        try:
            return super().accept()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self._resting_until = time.monotonic() + 0.5  # asyncio retries after 1 s
            raise


def listening_socket(host: str, port: int, backlog: int) -> socket.socket:
    """A bound, listening ``_Listener`` on the first address ``host`` resolves to."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = _Listener(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class ConnectionGuard:
    """The listening socket's protocol factory: at most ``limit`` open connections. Over the
    limit the oldest connections that are not being answered (idle kept-alive, or still sending
    their request) are closed, so a client holding many idle or slow connections can neither lock
    the others out nor run the process out of file descriptors (where asyncio would log a
    traceback per refused accept); when every connection is being answered, a new one gets 503.
    Connections younger than ``grace_s`` are spared until the count passes ``limit + burst``
    (``burst``: the listen backlog, whose descriptors ``connection_limits`` keeps free), and
    closed at the end of their grace if the count is still over the limit then."""

    def __init__(self, server: Any, limit: int, answering: set[Any], counts: collections.Counter[str],
                 burst: int = 0, grace_s: float = GRACE_S) -> None:
        # server: aiohttp's protocol factory; answering: the handlers whose request is being
        # answered (the service keeps it); counts: the service's counters.
        self._server, self._limit, self._answering, self._counts = server, limit, answering, counts
        self._burst, self._grace_s = burst, grace_s
        # Every connection from its accept to its end, oldest first, with its accept time. asyncio
        # accepts a whole burst before connecting any of them, so they count from the accept on.
        self.open: dict[Any, float] = {}
        self._closing: set[Any] = set()
        self._scheduled = False
        self._recheck: asyncio.TimerHandle | None = None

    def __call__(self) -> asyncio.BaseProtocol:
        if self._count() >= self._limit and not any(self._evictable()) and not any(self._unconnected()):
            self._counts["refused_connections"] += 1
            return _Refused(self._limit)
        handler = self._server()
        self.open[handler] = time.monotonic()
        if self._count() > self._limit and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._enforce)
        return _Tracked(handler, self)

    def _count(self) -> int:
        return len(self.open) - len(self._closing)

    def _unconnected(self) -> Iterator[Any]:
        return (c for c in self.open if c.transport is None and c not in self._closing)

    def _evictable(self) -> Iterator[Any]:
        answering = self._answering
        return (c for c in self.open if c.transport is not None and c not in answering and c not in self._closing)

    def _enforce(self, passes: int = 3) -> None:
        """Close the oldest evictable connections until the limit holds; runs again once the
        connections accepted in this burst are connected (closing one before would leak it), a
        bounded number of times (one that never connects must not keep the loop busy)."""
        self._scheduled = False
        young_after = time.monotonic() - self._grace_s
        spared = None  # the oldest connection spared for its grace
        while self._count() > self._limit:
            idle = next(self._evictable(), None)
            if idle is None:
                break
            if self.open[idle] > young_after and self._count() <= self._limit + self._burst:
                spared = idle  # the rest are younger still: they all keep their grace
                break
            self._counts["evicted_connections"] += 1
            self._closing.add(idle)
            idle.force_close()
        loop = asyncio.get_running_loop()
        if passes > 1 and self._count() > self._limit and any(self._unconnected()):
            self._scheduled = True
            loop.call_soon(self._enforce, passes - 1)
        elif spared is not None and self._recheck is None:
            # Still over the limit when the oldest spared connection's grace ends: look again then.
            self._recheck = loop.call_later(self.open[spared] - young_after + 0.01, self._grace_over)

    def _grace_over(self) -> None:
        self._recheck = None
        if not self._scheduled:
            self._enforce()

    def ended(self, handler: Any) -> None:
        self.open.pop(handler, None)
        self._closing.discard(handler)


class _Tracked(asyncio.Protocol):
    """An aiohttp connection handler that tells the guard when its connection ends."""

    def __init__(self, handler: Any, guard: ConnectionGuard) -> None:
        self._handler, self._guard = handler, guard

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received()

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._guard.ended(self._handler)
        self._handler.connection_lost(exc)


class _Refused(asyncio.Protocol):
    """A connection over the limit while every other one is being answered: 503, then closed."""

    def __init__(self, limit: int) -> None:
        self._body = json.dumps({"error": f"all {limit} connections (the service's max_connections) are being "
                                          "answered; retry"}).encode()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        head = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n" % len(self._body))
        transport.write(head + self._body)
        transport.close()

