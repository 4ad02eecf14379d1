"""``memsearch retrieval serve``: one index answering many rollout workers over HTTP (aiohttp).

Search-R1 compatible: ``POST /retrieve {"queries": [...], "topk": k, "return_scores": bool}`` ->
``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`` (without scores each hit is
the document itself), plus memsearch fields: ``candidates`` (doc ids the search is restricted to:
one list for every query, or one list or null per query), ``exclude`` (doc ids never returned, same
shapes) and ``format = "memsearch"`` (hits are ``Passage`` records: sentences with evidence ids).
``GET /health`` answers ``{"status": "ok"}``; ``GET /info`` the index manifest, the method and the
service's settings and counters. A bad request gets 400 and ``{"error": reason}``.

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
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from memsearch.retrieval.base import passage_from_document

Key = tuple[str, int, tuple[str, ...] | None]
Hits = tuple[tuple[str, float], ...]  # (doc id, score), best first


@dataclass(frozen=True)
class ServiceSettings:
    """Batching, caching and request limits of the service."""

    max_batch: int = 64  # queries merged into one encode + search; 1 = every query on its own
    max_wait_ms: float = 5.0  # how long a batch waits for more queries once it has one
    cache_size: int = 10_000  # LRU entries (query, k, candidates); 0 = no cache
    max_queries: int = 1024  # queries in one request
    max_topk: int = 1000


class BadRequest(ValueError):
    """A request the service refuses with 400 and this message."""


class RetrievalService:
    """The batcher, cache and counters around one retriever; ``app()`` is the aiohttp application."""

    def __init__(
        self, retriever: Any, settings: ServiceSettings | None = None, info: dict[str, Any] | None = None
    ) -> None:
        self.retriever = retriever
        self.settings = settings or ServiceSettings()
        self._info = info or {}
        self._rows = {doc.doc_id: doc for doc in retriever.documents}
        self._cache: collections.OrderedDict[Key, Hits] = collections.OrderedDict()
        self._pending: dict[Key, asyncio.Future] = {}
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None
        # One thread: the BM25 analyzer is not thread-safe and torch already uses every core.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval")
        self.counts: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._batch_loop())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._executor.shutdown(wait=True)

    def app(self):
        """The aiohttp application (routes, start/stop hooks)."""
        from aiohttp import web

        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/retrieve", self._retrieve)
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
        futures = []
        for key in keys:
            self.counts["queries"] += 1
            if key in self._cache:
                self._cache.move_to_end(key)
                self.counts["cache_hits"] += 1
                done = loop.create_future()
                done.set_result(self._cache[key])
                futures.append(done)
            elif key in self._pending:
                self.counts["coalesced"] += 1
                futures.append(self._pending[key])
            else:
                future = self._pending[key] = loop.create_future()
                self._queue.put_nowait(key)
                futures.append(future)
        # shield: a client that disconnects must not cancel a search other requests share.
        return list(await asyncio.shield(asyncio.gather(*futures)))

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.settings.max_wait_ms / 1000
            while len(batch) < self.settings.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                    continue
                except asyncio.QueueEmpty:
                    pass
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), remaining))
                except TimeoutError:
                    break
            try:
                results = await loop.run_in_executor(self._executor, self._search_batch, batch)
            except Exception as exc:  # noqa: BLE001 - a failed batch fails its requests, not the service
                for key in batch:
                    future = self._pending.pop(key)
                    if not future.done():
                        future.set_exception(exc)
                continue
            for key, passages in zip(batch, results):
                self._remember(key, passages)
                future = self._pending.pop(key)
                if not future.done():
                    future.set_result(passages)

    def _search_batch(self, batch: list[Key]) -> list[Hits]:
        """One ``search_many`` for the whole batch (worker thread); each key cut to its own k."""
        self.counts["batches"] += 1
        self.counts["searched"] += len(batch)
        k = max(key[1] for key in batch)
        found = self.retriever.search_many([key[0] for key in batch], k, [key[2] for key in batch])
        # Only (doc id, score) pairs are kept and cached: a cached Passage list costs ~40 KB, which
        # made the RSS of a long load test grow by a third; passages are rebuilt when answering.
        return [tuple((p.doc_id, p.score) for p in hits[: key[1]]) for key, hits in zip(batch, found)]

    def _remember(self, key: Key, passages: Hits) -> None:
        if self.settings.cache_size <= 0:
            return
        self._cache[key] = passages
        if len(self._cache) > self.settings.cache_size:
            self._cache.popitem(last=False)

    # ------------------------------------------------------------------ HTTP

    async def _health(self, request):
        from aiohttp import web

        return web.json_response({"status": "ok"})

    def info(self) -> dict[str, Any]:
        """What ``GET /info`` answers."""
        return {**self._info, "settings": asdict(self.settings), "counts": dict(self.counts)}

    async def _info_handler(self, request):
        from aiohttp import web

        return web.json_response(self.info())

    async def _retrieve(self, request):
        from aiohttp import web

        started = time.perf_counter()
        self.counts["requests"] += 1
        try:
            raw = await request.read()
            body = parse_request(raw, self.settings, self._rows)
        except BadRequest as exc:
            self.counts["bad_requests"] += 1
            return web.json_response({"error": str(exc)}, status=400)
        queries, topk, cands, excl = body["queries"], body["topk"], body["candidates"], body["exclude"]
        keys = [(q, topk + len(x), c) for q, c, x in zip(queries, cands, excl)]
        try:
            found = await self.search(keys)
        except Exception as exc:  # noqa: BLE001 - the search failed: 500, the service stays up
            self.counts["server_errors"] += 1
            return web.json_response({"error": f"search failed: {type(exc).__name__}: {exc}"}, status=500)
        result = []
        for hits, exclude in zip(found, excl):
            kept = [(doc_id, score) for doc_id, score in hits if doc_id not in exclude][:topk]
            result.append(
                [
                    render_hit(
                        passage_from_document(self._rows[doc_id], score, rank), body["format"], body["return_scores"]
                    )
                    for rank, (doc_id, score) in enumerate(kept)
                ]
            )
        self.counts["answered"] += 1
        self.counts["latency_ms_total"] += int((time.perf_counter() - started) * 1000)
        return web.json_response({"result": result})


def render_hit(passage: Any, fmt: str, scores: bool) -> dict[str, Any]:
    """One hit as Search-R1 writes it, or as a memsearch ``Passage`` (sentences with evidence ids)."""
    if fmt == "memsearch":
        return passage.model_dump(mode="json")
    document = {"id": passage.doc_id, "contents": f"{passage.title}\n{passage.text}"}
    return {"document": document, "score": passage.score} if scores else document


def parse_request(raw: bytes, settings: ServiceSettings, documents: dict[str, Any]) -> dict[str, Any]:
    """The checked fields of a ``/retrieve`` body, or ``BadRequest`` saying what is wrong."""
    import json

    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object with a 'queries' list")
    unknown = sorted(set(body) - {"queries", "topk", "return_scores", "candidates", "exclude", "format"})
    if unknown:
        raise BadRequest(f"unknown fields {unknown}")
    queries = body.get("queries")
    if not isinstance(queries, list) or not queries or not all(isinstance(q, str) for q in queries):
        raise BadRequest("'queries' must be a non-empty list of strings")
    if len(queries) > settings.max_queries:
        raise BadRequest(f"{len(queries)} queries in one request; at most {settings.max_queries}")
    topk = body.get("topk", 3)  # Search-R1's default
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= settings.max_topk:
        raise BadRequest(f"'topk' must be an integer from 1 to {settings.max_topk}, got {topk!r}")
    scores = body.get("return_scores", False)
    if not isinstance(scores, bool):
        raise BadRequest("'return_scores' must be true or false")
    fmt = body.get("format", "search-r1")
    if fmt not in ("search-r1", "memsearch"):
        raise BadRequest(f"'format' must be 'search-r1' or 'memsearch', got {fmt!r}")
    cands = _per_query(body.get("candidates"), len(queries), "candidates", documents)
    excl = _per_query(body.get("exclude"), len(queries), "exclude", documents)
    return {
        "queries": queries,
        "topk": topk,
        "return_scores": scores,
        "format": fmt,
        "candidates": [None if c is None else tuple(sorted(set(c))) for c in cands],
        "exclude": [frozenset(x or ()) for x in excl],
    }


def _per_query(value: Any, n: int, name: str, documents: dict[str, Any]) -> list[list[str] | None]:
    """``None``, one id list for every query, or one list (or null) per query -> one entry per query."""
    if value is None:
        return [None] * n
    if not isinstance(value, list):
        raise BadRequest(f"'{name}' must be a list of doc ids or one list (or null) per query")
    if all(isinstance(v, str) for v in value):
        per = [value] * n
    elif len(value) == n and all(
        v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)) for v in value
    ):
        per = value
    else:
        raise BadRequest(f"'{name}' must be a list of doc ids or one list (or null) per query ({n} queries)")
    unknown = sorted({x for v in per if v for x in v if x not in documents})
    if unknown:
        raise BadRequest(
            f"'{name}': unknown doc ids {unknown[:10]}"
            + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        )
    return per


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

    runner = web.AppRunner(app if app is not None else service.app(), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    stop = stop or asyncio.Event()
    bound = runner.addresses[0][1]
    if ready is not None:
        ready(bound, stop)
    try:
        await stop.wait()
    finally:
        # Stop accepting, let requests in flight finish (bounded), then stop the batcher.
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
