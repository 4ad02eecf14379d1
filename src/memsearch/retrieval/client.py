"""``HttpRetriever``: the client of ``memsearch retrieval serve`` (or any Search-R1-compatible
service that understands ``format = "memsearch"``), used by the engine when ``retrieval.url`` is set.

    retriever = HttpRetriever("http://127.0.0.1:8000", max_concurrency=32)
    passages = await retriever.asearch("Who directed Ed Wood?", k=5, candidates=task.doc_ids)
    retriever.describe()      # the server's /info, recorded in run.json
    await retriever.aclose()

Like the OpenAI backend: a bounded pool of connections, a timeout on every attempt, retries with
exponential backoff and full jitter on 5xx, connection errors, timeouts and malformed bodies (a
4xx is the request's fault and is not retried). A search that still fails raises
``RetrievalRequestError``, which the engine records in the trajectory as a request error; it never
ends a run. An answer larger than the request can hold (``response_limit``: a floor plus
``BYTES_PER_HIT`` for each of queries x k hits), compressed or inflated, is read no further and not
retried (``memsearch.http_client``).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import Counter
from collections.abc import Sequence
from typing import Any

from memsearch.http_client import Backoff, BodyTooLarge, LoopSession, read_bounded
from memsearch.retrieval.base import Passage


class RetrievalRequestError(RuntimeError):
    """A search that failed after every retry (the message says why and how many attempts)."""


# An answer's bound: the envelope, and per hit a passage (a paragraph of sentences with evidence ids
# and a score, JSON-escaped); a paragraph of 64 KiB is far beyond any corpus' (HotpotQA's: ~1 KB).
RESPONSE_FLOOR_BYTES = 1 << 20
BYTES_PER_HIT = 64 << 10
INFO_MAX_BYTES = 4 << 20  # GET /info: a manifest, settings and counters


def response_limit(queries: int, k: int) -> int:
    """The most bytes an answer to ``queries`` queries of ``k`` hits each may have."""
    return RESPONSE_FLOOR_BYTES + max(1, queries) * max(1, k) * BYTES_PER_HIT


class HttpRetriever:
    """A ``Retriever`` whose index lives in a retrieval service. Use ``asearch`` inside an event
    loop; ``search`` / ``search_many`` run their own loop (scripts, not the engine)."""

    name = "http"

    def __init__(self, url: str, max_concurrency: int = 32, timeout_s: float = 30.0, max_retries: int = 3,
                 backoff_base_s: float = 0.2, backoff_max_s: float = 5.0, seed: int | None = None) -> None:
        self.url = url.rstrip("/")
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._backoff = Backoff(backoff_base_s, backoff_max_s, seed)
        self._pool = LoopSession(max_concurrency)
        self._counts: Counter[str] = Counter()
        self._info: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"HttpRetriever({self.url!r})"

    # ------------------------------------------------------------------ what the run records

    def info(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The server's ``GET /info`` (index manifest, method, batching settings); raises
        ``RetrievalRequestError`` when the server does not answer."""
        try:
            with urllib.request.urlopen(self.url + "/info", timeout=timeout_s) as response:
                raw = response.read(INFO_MAX_BYTES + 1)
            if len(raw) > INFO_MAX_BYTES:
                raise ValueError(f"the answer is larger than {INFO_MAX_BYTES:,} bytes")
            self._info = json.loads(raw)
        except (OSError, ValueError) as exc:
            raise RetrievalRequestError(f"{self.url}/info: {type(exc).__name__}: {exc}") from None
        return self._info

    def describe(self) -> dict[str, Any]:
        """What ``run.json`` records: the url and the server's ``/info``, or why it gave none."""
        try:
            return {"method": "http", "url": self.url, "info": self._info or self.info()}
        except RetrievalRequestError as exc:
            return {"method": "http", "url": self.url, "info": None, "error": str(exc)}

    def stats(self) -> dict[str, int]:
        """Searches, attempts, retries and failures of this client so far."""
        return dict(self._counts)

    # ------------------------------------------------------------------ searching

    async def asearch(self, query: str, k: int = 5, candidates: Sequence[str] | None = None) -> list[Passage]:
        """Top-``k`` passages for one query from the service."""
        return (await self.asearch_many([query], k, None if candidates is None else [candidates]))[0]

    async def asearch_many(self, queries: Sequence[str], k: int = 5,
                           candidates: Sequence[Sequence[str] | None] | None = None) -> list[list[Passage]]:
        """One request for many queries (the service answers them in one batch)."""
        body: dict[str, Any] = {"queries": list(queries), "topk": k, "return_scores": True, "format": "memsearch"}
        if candidates is not None:
            body["candidates"] = [None if c is None else list(c) for c in candidates]
        raw = await self._post("/retrieve", json.dumps(body).encode(), response_limit(len(queries), k))
        try:
            result = json.loads(raw)["result"]
            return [[Passage.model_validate(p) for p in hits] for hits in result]
        except (ValueError, KeyError, TypeError) as exc:  # retried in _post; here only a wrong shape
            raise RetrievalRequestError(f"malformed response from {self.url}: {exc}") from None

    def search(self, query: str, k: int = 5, candidates: Sequence[str] | None = None) -> list[Passage]:
        """``asearch`` from synchronous code (not from inside a running event loop)."""
        return self.search_many([query], k, None if candidates is None else [candidates])[0]

    def search_many(self, queries: Sequence[str], k: int = 5,
                    candidates: Sequence[Sequence[str] | None] | None = None) -> list[list[Passage]]:
        """``asearch_many`` from synchronous code."""
        async def run() -> list[list[Passage]]:
            try:
                return await self.asearch_many(queries, k, candidates)
            finally:
                await self.aclose()

        return asyncio.run(run())

    async def aclose(self) -> None:
        """Close the connection pool (a later search opens a new one)."""
        await self._pool.aclose()

    async def _post(self, path: str, payload: bytes, limit: int) -> bytes:
        import aiohttp

        what = f"the {limit:,}-byte bound of this request"

        session, semaphore = self._pool.get()
        self._counts["searches"] += 1
        reason = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self._counts["retries"] += 1
                await asyncio.sleep(self._backoff.delay_s(attempt))
            self._counts["attempts"] += 1
            try:
                async with semaphore, asyncio.timeout(self.timeout_s):
                    async with session.post(self.url + path, data=payload,
                                            headers={"Content-Type": "application/json"}) as response:
                        code, raw = response.status, await read_bounded(response, limit, what)
                if code == 200:
                    json.loads(raw)  # a torn body is retried like a connection error
                    return raw
                reason = f"HTTP {code}: {raw[:200].decode('utf-8', 'replace')}"
                if code < 500:
                    self._counts["failed"] += 1
                    raise RetrievalRequestError(f"{reason} (not retried)")
            except BodyTooLarge as exc:  # a server that sends too much will do so again
                self._counts["failed"] += 1
                raise RetrievalRequestError(f"response too large: {exc} (not retried)") from None
            except TimeoutError:
                reason = f"timeout after {self.timeout_s:g}s"
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                reason = f"connection error: {type(exc).__name__}: {exc}"
        self._counts["failed"] += 1
        raise RetrievalRequestError(f"{reason} after {self.max_retries + 1} attempts")
