"""What the HTTP clients (the OpenAI backend, the retrieval service's client) share: a bounded
body read, the retry backoff and the keep-alive pool bound to its event loop.

Reading an answer no larger than a bound, compressed and inflated: a misbehaving server (or a
proxy in front of it) may answer with far more than was asked: 30 MB of text for 64 tokens, or a
1 MB gzip body that inflates to 1 GiB. ``read_bounded`` reads an aiohttp response's decoded body
chunk by chunk and stops as soon as it, or its compressed form, passes the bound: aiohttp
(>= 3.14, the floor in ``pyproject.toml``) inflates a compressed body a bounded piece at a time as
it is read, so stopping the read also stops the inflation (``backends/response_limits.py``
derives the OpenAI backend's bound from the request).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any


class BodyTooLarge(Exception):
    """An answer larger than its bound; its message names the bound and how far the read got."""


async def read_bounded(response: Any, limit: int, what: str) -> bytes:
    """The decoded body of an aiohttp ``response``; ``BodyTooLarge`` as soon as it (or its
    compressed form) passes ``limit`` bytes, or when its ``Content-Length`` announces more.
    ``what`` describes the bound in the message ("the 1,064,960-byte cap for this request")."""
    announced = response.content_length
    if announced is not None and announced > limit:
        raise BodyTooLarge(f"the server announced a {announced:,}-byte body, over {what}")
    chunks: list[bytes] = []
    size = 0
    stream = response.content
    async for chunk in stream.iter_any():
        size += len(chunk)
        compressed = getattr(stream, "total_compressed_bytes", None) or 0
        if size > limit or compressed > limit:
            encoding = response.headers.get("Content-Encoding", "identity")
            raise BodyTooLarge(f"the body passed {what} after {max(size, compressed):,} bytes "
                               f"(Content-Encoding: {encoding}); the rest was not read")
        chunks.append(chunk)
    return b"".join(chunks)


class Backoff:
    """Exponential backoff with full jitter, seeded: the wait before retry number ``retry``
    (1-based) is uniform in [0, min(max_s, base_s * 2**(retry-1))], so clients that failed
    together do not retry together. Shared by the HTTP clients (OpenAI backend, retrieval service)."""

    def __init__(self, base_s: float, max_s: float, seed: int | None = None) -> None:
        self.base_s = base_s
        self.max_s = max_s  # also caps a wait the server asks for (Retry-After)
        self._rng = random.Random(seed)

    def delay_s(self, retry: int) -> float:
        return self._rng.uniform(0.0, min(self.max_s, self.base_s * 2 ** (retry - 1)))


def abandon_session(session: Any) -> None:
    """Drop an aiohttp ``ClientSession`` whose event loop is gone without awaiting it (that loop
    cannot run the close). Its sockets went with that loop; detaching marks it closed so it is
    not reported as leaked. Shared by the HTTP clients (OpenAI backend, retrieval service)."""
    connector = session.connector
    session.detach()
    if connector is not None and not connector.closed:
        try:
            connector._close()  # the synchronous part of close(): forget pooled connections
        except Exception:  # noqa: BLE001 - best effort; at worst aiohttp warns of a leak
            pass


class LoopSession:
    """An aiohttp ``ClientSession`` (a keep-alive pool of ``limit`` connections) and a semaphore
    of ``limit`` requests in flight, bound to the event loop that uses them. Each new loop (every
    ``asyncio.run``: a GRPO step, a script's own loop) gets its own pair on first use; an earlier
    loop's session, unusable on this one, is abandoned. The caller bounds each attempt with
    ``asyncio.timeout`` (connect + send + full body), so the session has no timeout of its own.
    Shared by the HTTP clients (OpenAI backend, retrieval service).

    ``proxy``, when given, is called each time a session opens and its answer passed to aiohttp
    (None: no proxy), so the environment is read when the pool is made, not per request.
    """

    def __init__(self, limit: int, proxy: Callable[[], str | None] | None = None) -> None:
        self.limit = limit
        self.proxy = proxy
        self._session: Any = None
        self._semaphore: Any = None
        self._loop: Any = None

    def get(self) -> tuple[Any, Any]:
        """``(session, semaphore)`` for the running loop, opened on first use in that loop."""
        import asyncio

        import aiohttp

        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop:
            if self._session is not None:
                abandon_session(self._session)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.limit),
                timeout=aiohttp.ClientTimeout(total=None),
                proxy=self.proxy() if self.proxy is not None else None,
            )
            self._semaphore = asyncio.Semaphore(self.limit)
            self._loop = loop
        return self._session, self._semaphore

    async def aclose(self) -> None:
        """Close the pool (a later request opens a new one); one from a loop that is gone is
        abandoned, since only its own loop could await the close."""
        import asyncio

        session, loop = self._session, self._loop
        self._session = self._semaphore = self._loop = None
        if session is None:
            return
        if loop is asyncio.get_running_loop():
            await session.close()
        else:
            abandon_session(session)
