"""What a ``/retrieve`` request may ask of the retrieval service, and how its answer is written.

``ServiceSettings`` holds the limits (and the batching and caching settings) of ``memsearch
retrieval serve``; ``parse_request`` checks a body against them and refuses it (``BadRequest``,
400, naming the field or the limit and the value sent) before any search is queued. Each limit
bounds what one client's request can cost the others: a 15 MB query kept every other search
waiting for ~47 s, and 1,024 queries x topk 1,000 (each within its own limit) returned 384 MB and
held /health for 16 s (measured). The check is stricter than Search-R1's own server (a pydantic
model): that one reads a null or 0 ``topk`` as its ``--topk``, ``"3"`` as 3, and ignores unknown
fields; here each is a 400 naming the field, since a typo must not silently run another search.

``render_hit`` writes one hit as Search-R1 does (optionally with its corpus' quoted titles) or as
a memsearch ``Passage``. Kept apart from the HTTP service (``server.py``) so the rules a request
must follow are read, and tested, in one place.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memsearch.errors import InputValueError

Key = tuple[str, int, tuple[str, ...] | None]  # (query, k, candidates): one search
Hits = tuple[tuple[str, float], ...]  # (doc id, score), best first


@dataclass(frozen=True)
class ServiceSettings:
    """Batching, caching and request limits of the service (``memsearch retrieval serve`` has an
    option for each; docs/results/retrieval_service.md "Limits").

    Each limit bounds what one request can cost the other clients; a request over one is refused
    before any search, with 400 (413 for the body) and an error naming the limit. A well-formed
    request within every limit costs at most ``max_hits`` hits and ``max_queries`` x
    ``max_query_chars`` characters of queries."""

    max_batch: int = 64  # queries merged into one encode + search; 1 = every query on its own
    max_wait_ms: float = 5.0  # how long a batch waits for more queries once it has one
    cache_size: int = 10_000  # LRU entries (query, k, candidates); 0 = no cache
    cache_mb: float = 64.0  # and at most this many MiB of cached hits (approximate); 0 = no cache
    max_queries: int = 1024  # queries in one request
    max_topk: int = 1000
    max_hits: int = 16_384  # queries x topk in one request: bounds its search, answer and rendering
    max_query_chars: int = 4096  # characters of one query (BM25 scores every term of it)
    max_body_mb: float = 16.0  # request body
    # A client must send a complete request head (also on an idle kept-alive connection) and then
    # its body within this many seconds each, and read its answer within it: else it is closed.
    timeout_s: float = 30.0
    max_connections: int | None = None  # open connections; None: what the open-file limit leaves room for
    quote_titles: bool = False  # Search-R1 "contents": '"Title"\ntext', as its wiki corpus writes it

    def __post_init__(self) -> None:
        def refuse(name: str, wanted: str) -> None:
            # Named as the serve option is, the way a researcher sets it.
            raise InputValueError(f"--{name.replace('_', '-')} {getattr(self, name)!r}: must be {wanted}")

        for name in ("max_batch", "cache_size", "max_queries", "max_topk", "max_hits", "max_query_chars",
                     "max_connections"):
            value, low = getattr(self, name), 0 if name == "cache_size" else 1
            if not (name == "max_connections" and value is None) and (
                not isinstance(value, int) or isinstance(value, bool) or value < low
            ):
                refuse(name, f"an integer >= {low}")
        for name in ("max_wait_ms", "cache_mb", "max_body_mb", "timeout_s"):
            value, zero_ok = getattr(self, name), name in ("max_wait_ms", "cache_mb")
            # Finite: an infinite size overflows int() when it is used, an infinite timeout is none.
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or not (
                value >= 0 if zero_ok else value > 0
            ):
                refuse(name, "a finite number >= 0" if zero_ok else "a finite number > 0")
        if not isinstance(self.quote_titles, bool):
            refuse("quote_titles", "true or false")

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)

    @property
    def cache_bytes(self) -> int:
        return int(self.cache_mb * 1024 * 1024)


class BadRequest(ValueError):
    """A request the service refuses with 400 and this message."""


def check_port(port: Any) -> None:
    """``InputValueError`` unless ``port`` is a TCP port number (0: any free port)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InputValueError(f"--port {port!r}: must be an integer from 0 to 65535 (0: any free port)")


def render_hit(passage: Any, fmt: str, scores: bool, quote_titles: bool = False) -> dict[str, Any]:
    """One hit as Search-R1 writes it, or as a memsearch ``Passage`` (sentences with evidence ids).

    ``quote_titles``: Search-R1's wiki corpus writes ``contents`` as ``'"' + title + '"\\n' + text``
    and its agent shows ``Doc 1(Title: <first line>) ...``, so a model trained there saw quoted
    titles; with it the service writes them the same way (``memsearch`` format unchanged)."""
    if fmt == "memsearch":
        return passage.model_dump(mode="json")
    title = f'"{passage.title}"' if quote_titles else passage.title
    document = {"id": passage.doc_id, "contents": f"{title}\n{passage.text}"}
    return {"document": document, "score": passage.score} if scores else document


def parse_request(raw: bytes, settings: ServiceSettings, documents: dict[str, Any]) -> dict[str, Any]:
    """The checked fields of a ``/retrieve`` body and its search ``keys``, or ``BadRequest`` saying
    what is wrong; a request over one of ``settings``' limits is refused naming it, before any
    search (each limit bounds what the request costs the other clients)."""
    try:
        body = json.loads(raw)
    except RecursionError:  # the decoder recurses once per nesting level
        raise BadRequest("body is not JSON the service reads: it nests too deeply") from None
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
        raise BadRequest(f"{len(queries)} queries in one request; at most {settings.max_queries} (the service's "
                         "max_queries)")
    topk = body.get("topk", 3)  # Search-R1's default
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= settings.max_topk:
        raise BadRequest(f"'topk' must be an integer from 1 to {settings.max_topk}, got {topk!r}")
    if len(queries) * topk > settings.max_hits:
        raise BadRequest(_too_many_hits(len(queries), topk, len(queries) * topk, settings))
    for i, query in enumerate(queries):
        if len(query) > settings.max_query_chars:
            raise BadRequest(f"query {i} has {len(query)} characters; at most {settings.max_query_chars} (the "
                             "service's max_query_chars)")
        if not query.isascii():
            try:
                query.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate, which the dense encoder cannot take
                raise BadRequest(f"query {i} is not valid Unicode (it holds a lone surrogate)") from None
    scores = body.get("return_scores", False)
    if not isinstance(scores, bool):
        raise BadRequest("'return_scores' must be true or false")
    fmt = body.get("format", "search-r1")
    if fmt not in ("search-r1", "memsearch"):
        raise BadRequest(f"'format' must be 'search-r1' or 'memsearch', got {fmt!r}")
    cands = _each_once(_per_query(body.get("candidates"), len(queries), "candidates", documents),
                       lambda c: tuple(sorted(set(c))))
    excl = [x or frozenset() for x in _each_once(_per_query(body.get("exclude"), len(queries), "exclude",
                                                            documents), frozenset)]
    # Each query is searched for topk + its excluded ids (they are dropped after the search).
    keys = [(q, topk + len(x), c) for q, c, x in zip(queries, cands, excl)]
    hits = sum(key[1] for key in keys)
    if hits > settings.max_hits:
        raise BadRequest(_too_many_hits(len(queries), topk, hits, settings))
    return {"keys": keys, "queries": queries, "topk": topk, "return_scores": scores, "format": fmt,
            "candidates": cands, "exclude": excl}


def _too_many_hits(queries: int, topk: int, hits: int, settings: ServiceSettings) -> str:
    excluded = f" + {hits - queries * topk} excluded ids" if hits > queries * topk else ""
    return (f"{queries} queries x topk {topk}{excluded} = {hits} hits in one request; at most "
            f"{settings.max_hits} (the service's max_hits): send fewer queries per request")


def _each_once(per: list[Any], convert: Callable[[Any], Any]) -> list[Any]:
    """``convert`` of each entry (``None`` stays), once per distinct list: a list given for every
    query is one object ``n`` times, and converting it ``n`` times would cost n x its length."""
    done: dict[int, Any] = {}
    out = []
    for value in per:
        if value is not None and id(value) not in done:
            done[id(value)] = convert(value)
        out.append(None if value is None else done[id(value)])
    return out


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
    distinct = {id(v): v for v in per if v}.values()
    unknown = sorted({x for v in distinct for x in v if x not in documents})
    if unknown:
        raise BadRequest(
            f"'{name}': unknown doc ids {unknown[:10]}"
            + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        )
    return per

