"""``memsearch retrieval serve``: one index answering many rollout workers over HTTP (aiohttp).

Search-R1 compatible: ``POST /retrieve {"queries": [...], "topk": k, "return_scores": bool}`` ->
``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`` (without scores each hit is
the document itself), plus memsearch fields: ``candidates`` (doc ids the search is restricted to:
one list for every query, or one list or null per query), ``exclude`` (doc ids never returned, same
shapes) and ``format = "memsearch"`` (hits are ``Passage`` records: sentences with evidence ids).
``GET /health`` answers ``{"status": "ok"}``; ``GET /info`` the index manifest, the method and the
service's settings and counters. A bad request gets 400 and ``{"error": reason}``; every other
error (unknown path or method, unparsable request, unsupported ``Content-Encoding``: 415) is
answered in the same JSON (``service_errors``).

Whatever one client sends, the others keep being answered in bounded memory (``ServiceSettings``,
docs/results/retrieval_service.md "Limits"): a request over a limit (query length, queries,
queries x topk, body size) is refused with 400 or 413 naming the limit before any search; the
batcher takes one query from each waiting request in turn, so a large request cannot make a small
one wait for all of it; the cache is bounded in bytes and keyed by digests, never by query text;
a client must send its request, and read its answer, within ``timeout_s``; connections are capped
below the open-file limit, a new one closing the oldest connection that is not being answered;
repeated log lines are rate-limited (``RepeatLimiter``). Each of those is a module of its own,
read and tested apart from this one, which only puts them together: ``service_requests`` (the
limits, the request check and the hit's JSON), ``service_cache`` (the byte-bounded cache),
``service_connections`` (the connection cap and the listener) and ``service_log``; their public
names are importable from here too.

Why it is fast under concurrency (docs/design.md §8): query encoding dominates dense search, so
queries from all concurrent requests are merged by a micro-batcher (up to ``max_batch`` queries,
waiting at most ``max_wait_ms`` for more) into one encode + search, run on one worker thread so the
event loop only parses and answers; identical queries in flight share one search, and an LRU cache
answers repeats (a GRPO group sends the same query n times). SIGTERM / SIGINT stop accepting,
finish the requests in flight and exit 0.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from memsearch.errors import InputError
from memsearch.retrieval.base import passage_from_document
from memsearch.retrieval.service_cache import Digest, HitCache, digest, entry_bytes
from memsearch.retrieval.service_connections import ConnectionGuard, connection_limits, listening_socket
from memsearch.retrieval.service_errors import expect_handler, json_errors, with_json_errors
from memsearch.retrieval.service_log import RepeatLimiter, install_log_limits
from memsearch.retrieval.service_requests import (
    BadRequest,
    Hits,
    Key,
    ServiceSettings,
    check_port,
    parse_request,
    render_hit,
)

# Importable from here, as before the service was split into modules (the CLI, tests, benchmarks).
__all__ = [
    "BadRequest", "RepeatLimiter", "RetrievalService", "ServiceSettings", "cache_entry_bytes", "check_port",
    "install_log_limits", "load_service", "parse_request", "render_hit", "running_service", "serve",
]
cache_entry_bytes = entry_bytes


class RetrievalService:
    """The batcher, cache and counters around one retriever; ``app()`` is the aiohttp application."""

    def __init__(
        self, retriever: Any, settings: ServiceSettings | None = None, info: dict[str, Any] | None = None
    ) -> None:
        self.retriever = retriever
        self.settings = settings or ServiceSettings()
        self._info = info or {}
        self._rows = {doc.doc_id: doc for doc in retriever.documents}
        self.cache = HitCache(self.settings.cache_size, self.settings.cache_bytes)
        self._pending: dict[Digest, asyncio.Future] = {}
        # The keys still to search, one deque per request, served round robin (``_take``).
        self._waiting: collections.deque[collections.deque[tuple[Digest, Key]]] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        # One thread: the BM25 analyzer is not thread-safe and torch already uses every core.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval")
        # Parsing bodies and rendering answers (up to max_body_mb / max_hits) run here, so the event
        # loop keeps answering /health and other clients meanwhile.
        self._http = ThreadPoolExecutor(max_workers=2, thread_name_prefix="retrieval-http")
        self.answering: set[Any] = set()  # connections (aiohttp protocols) whose request is being answered
        self.max_connections: int | None = None  # the limit in force while serving (``_serve``)
        self.counts: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._worker = asyncio.create_task(self._batch_loop())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._executor.shutdown(wait=True)
        self._http.shutdown(wait=True)

    def app(self):
        """The aiohttp application (routes, start/stop hooks)."""
        from aiohttp import web

        # aiohttp refuses a larger body with 413 while reading it; _retrieve words the answer.
        app = web.Application(client_max_size=self.settings.max_body_bytes,
                              middlewares=[json_errors(self.counts)])
        app.router.add_post("/retrieve", self._retrieve, expect_handler=expect_handler)
        app.router.add_get("/health", self._health)
        app.router.add_get("/info", self._info_handler)

        async def on_startup(_):
            await self.start()

        async def on_cleanup(_):
            await self.stop()

        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        return app

    # ------------------------------------------------------------------ searching

    async def search(self, keys: list[Key]) -> list[Hits]:
        """``(doc id, score)`` hits for each ``(query, k, candidates)``: from the cache, a search in
        flight, or the batcher."""
        loop = asyncio.get_running_loop()
        futures, fresh, memo = [], collections.deque(), {}
        for key in keys:
            self.counts["queries"] += 1
            key_digest = digest(key, memo)
            cached = self.cache.get(key_digest)
            if cached is not None:
                self.counts["cache_hits"] += 1
                done = loop.create_future()
                done.set_result(cached)
                futures.append(done)
            elif key_digest in self._pending:
                self.counts["coalesced"] += 1
                futures.append(self._pending[key_digest])
            else:
                future = self._pending[key_digest] = loop.create_future()
                fresh.append((key_digest, key))
                futures.append(future)
        if fresh:
            self._waiting.append(fresh)
            self._wakeup.set()
        # shield: a client that disconnects must not cancel a search other requests share.
        return list(await asyncio.shield(asyncio.gather(*futures)))

    def _queued(self) -> int:
        return sum(len(keys) for keys in self._waiting)

    def _take(self, n: int) -> list[tuple[Digest, Key]]:
        """Up to ``n`` waiting keys, one from each waiting request in turn: a request of a thousand
        queries shares every batch with the requests that came after it instead of making them
        wait for all of its batches."""
        batch = []
        while self._waiting and len(batch) < n:
            keys = self._waiting.popleft()
            batch.append(keys.popleft())
            if keys:
                self._waiting.append(keys)
        return batch

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
            deadline = loop.time() + self.settings.max_wait_ms / 1000
            while self._queued() < self.settings.max_batch and (remaining := deadline - loop.time()) > 0:
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
            await self._settle(self._take(self.settings.max_batch))

    async def _settle(self, batch: list[tuple[Digest, Key]]) -> None:
        """Search ``batch`` and hand each key's hits (or the error) to the requests waiting on it."""
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self._executor, self._search_batch, [key for _, key in batch])
        except Exception as exc:  # noqa: BLE001 - a failed batch fails its requests, not the service
            if len(batch) > 1:
                # One query the retriever cannot take must fail only the requests that sent it,
                # not the other clients' queries that shared its batch: search each on its own.
                self.counts["split_batches"] += 1
                for item in batch:
                    await self._settle([item])
                return
            future = self._pending.pop(batch[0][0])
            if not future.done():
                future.set_exception(exc)
            return
        for (key_digest, _), hits in zip(batch, results):
            self.cache.put(key_digest, hits)
            future = self._pending.pop(key_digest)
            if not future.done():
                future.set_result(hits)

    def _search_batch(self, batch: list[Key]) -> list[Hits]:
        """One ``search_many`` for the whole batch (worker thread); each key cut to its own k."""
        self.counts["batches"] += 1
        self.counts["searched"] += len(batch)
        k = max(key[1] for key in batch)
        found = self.retriever.search_many([key[0] for key in batch], k, [key[2] for key in batch])
        # Only (doc id, score) pairs are kept and cached: a cached Passage list costs ~40 KB, which
        # made the RSS of a long load test grow by a third; passages are rebuilt when answering.
        return [tuple((p.doc_id, p.score) for p in hits[: key[1]]) for key, hits in zip(batch, found)]

    # ------------------------------------------------------------------ HTTP

    async def _health(self, request):
        from aiohttp import web

        return web.json_response({"status": "ok"})

    def info(self) -> dict[str, Any]:
        """What ``GET /info`` answers: the index, the settings, the counters, the cache's size and
        the connection limit in force."""
        return {**self._info, "settings": asdict(self.settings), "counts": dict(self.counts),
                "cache": {"entries": len(self.cache), "bytes": self.cache.bytes},
                "max_connections": self.max_connections}

    async def _info_handler(self, request):
        from aiohttp import web

        return web.json_response(self.info())

    async def _retrieve(self, request):
        from aiohttp import web
        from aiohttp.web_protocol import RequestPayloadError

        started = time.perf_counter()
        self.counts["requests"] += 1
        limits = self.settings
        try:
            async with asyncio.timeout(limits.timeout_s):
                raw = await request.read()
        except TimeoutError:
            self.counts["timeouts"] += 1
            return await self._answer(request, 408, {
                "error": f"the request body did not arrive within the service's timeout_s = {limits.timeout_s:g} s"
            }, close=True)
        except web.HTTPRequestEntityTooLarge:
            self.counts["bad_requests"] += 1
            return await self._answer(request, 413, {
                "error": f"the body is larger than the service's max_body_mb = {limits.max_body_mb:g} MiB "
                         f"({limits.max_body_bytes} bytes)"
            }, close=True)
        except RequestPayloadError as exc:  # e.g. a gzip body that does not inflate
            self.counts["bad_requests"] += 1
            reason = " ".join(str(exc.__cause__ or exc).split()).removeprefix("400, message: ")
            return await self._answer(request, 400, {"error": f"the body could not be read: {reason}"}, close=True)
        except (ConnectionError, RuntimeError):
            # The client went away mid-body, or the connection was closed to make room for others
            # (aiohttp raises RuntimeError "Connection closed."): nobody reads an answer.
            self.counts["disconnects"] += 1
            return web.Response(status=400)
        loop = asyncio.get_running_loop()
        self.answering.add(request.protocol)
        try:
            try:
                body = await loop.run_in_executor(self._http, parse_request, raw, limits, self._rows)
            except BadRequest as exc:
                self.counts["bad_requests"] += 1
                return await self._answer(request, 400, {"error": str(exc)})
            del raw
            try:
                found = await self.search(body["keys"])
            except Exception as exc:  # noqa: BLE001 - the search failed: 500, the service stays up
                self.counts["server_errors"] += 1
                return await self._answer(request, 500, {"error": f"search failed: {type(exc).__name__}: {exc}"})
            payload = await loop.run_in_executor(self._http, self._render, found, body)
            self.counts["answered"] += 1
            self.counts["latency_ms_total"] += int((time.perf_counter() - started) * 1000)
            return await self._answer(request, 200, payload)
        finally:
            self.answering.discard(request.protocol)

    def _render(self, found: list[Hits], body: dict[str, Any]) -> bytes:
        """The answer's JSON: each query's hits without its excluded ids, cut to ``topk``."""
        result = []
        for hits, exclude in zip(found, body["exclude"]):
            kept = [(doc_id, score) for doc_id, score in hits if doc_id not in exclude][: body["topk"]]
            result.append(
                [
                    render_hit(passage_from_document(self._rows[doc_id], score, rank), body["format"],
                               body["return_scores"], self.settings.quote_titles)
                    for rank, (doc_id, score) in enumerate(kept)
                ]
            )
        return json.dumps({"result": result}).encode()

    async def _answer(self, request, status: int, answer: dict[str, Any] | bytes, close: bool = False):
        """Send ``answer`` (JSON) within ``timeout_s``: a client that does not read its answer
        would otherwise hold it, and its connection, for as long as it likes."""
        from aiohttp import web

        payload = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        response = web.Response(body=payload, status=status, content_type="application/json")
        if close:
            response.force_close()
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                await response.prepare(request)
                await response.write_eof()
        except TimeoutError:
            self.counts["timeouts"] += 1
            if request.transport is not None:
                request.transport.abort()  # drops the unsent answer from memory
        except ConnectionError:
            self.counts["disconnects"] += 1
        return response


def load_service(index: str, method: str | None = None, settings: ServiceSettings | None = None) -> RetrievalService:
    """A service over a built index folder; ``/info`` carries its manifest."""
    from memsearch.retrieval.dense import read_manifest
    from memsearch.retrieval.index import describe, open_index

    retriever = open_index(index, method)
    info = {**describe(retriever), "manifest": read_manifest(index), "index": str(index)}
    return RetrievalService(retriever, settings, info)


async def _serve(
    service: RetrievalService, host: str, port: int, ready=None, stop: asyncio.Event | None = None, app: Any = None
) -> None:
    from aiohttp import web

    check_port(port)
    limit, backlog = connection_limits(service.settings.max_connections)
    install_log_limits()
    # keepalive_timeout: aiohttp closes a connection that has not sent a complete request head
    # this long after it connected or after its last answer (idle and slow clients alike).
    runner = web.AppRunner(app if app is not None else service.app(), handle_signals=False,
                           keepalive_timeout=service.settings.timeout_s)
    await runner.setup()
    service.max_connections = limit
    loop = asyncio.get_running_loop()
    try:
        guard = ConnectionGuard(lambda: with_json_errors(runner.server()), limit, service.answering, service.counts,
                                burst=backlog)
        listener = await loop.create_server(guard, sock=listening_socket(host, port, backlog), backlog=backlog)
    except (OSError, OverflowError) as exc:
        await runner.cleanup()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(f"cannot listen on {host}:{port}: {reason}") from None
    stop = stop or asyncio.Event()
    if ready is not None:
        ready(listener.sockets[0].getsockname()[1], stop)
    try:
        await stop.wait()
    finally:
        # Stop accepting, let requests in flight finish (bounded), then stop the batcher.
        listener.close()
        await runner.cleanup()


def serve(service: RetrievalService, host: str = "127.0.0.1", port: int = 8000, announce=None) -> None:
    """Run the service until SIGTERM or SIGINT (then shut down gracefully); ``announce`` gets the
    "serving on URL" line once the port is bound."""
    announce = announce or (lambda line: print(line, flush=True))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await _serve(service, host, port, lambda bound, _: announce(f"serving on http://{host}:{bound}"), stop)

    asyncio.run(main())


@contextlib.contextmanager
def running_service(service: RetrievalService, host: str = "127.0.0.1", app: Any = None) -> Iterator[str]:
    """The service on an ephemeral loopback port in a background thread; yields its base url
    (tests and benchmarks). ``app``: the service's application with routes added (tests)."""
    started = threading.Event()
    state: dict[str, Any] = {}

    def ready(port, stop):
        state.update(port=port, stop=stop, loop=asyncio.get_running_loop())
        started.set()

    def run():
        try:
            asyncio.run(_serve(service, host, 0, ready, app=app))
        except BaseException as exc:  # noqa: BLE001 - surfaced to the caller below
            state["error"] = exc
            started.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(60)
    if "error" in state or "port" not in state:
        raise RuntimeError(f"retrieval service did not start: {state.get('error')}")
    try:
        yield f"http://{host}:{state['port']}"
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(30)
