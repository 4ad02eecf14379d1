"""Reading and writing files safely: JSON lines, hashes, and output folders that appear whole.

Outputs are written into a temporary sibling folder that is renamed into place only when
everything succeeded, so a crash or bad input never leaves a partial output behind, and an
existing folder is never overwritten.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from memsearch.errors import InputError, Problem


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def require_file(path: Path) -> None:
    """``InputError`` unless ``path`` is a file, saying whether it is missing or a folder."""
    if path.is_dir():
        raise InputError(f"{path}: is a folder, expected a file")
    if not path.is_file():
        raise InputError(f"{path}: no such file")


def dumps_line(record: Any) -> str:
    """One canonical JSON line: keys in declared order, UTF-8 kept as is, no spaces to vary."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def write_jsonl(path: str | Path, records: Iterable[Any]) -> int:
    """Write records as JSON lines; returns the number of lines."""
    n = 0
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for record in records:
            fh.write(dumps_line(record))
            fh.write("\n")
            n += 1
    return n


def write_json(path: str | Path, obj: Any) -> None:
    """Pretty JSON with sorted keys and a final newline (stable bytes for hashing)."""
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=2, sort_keys=True)
        fh.write("\n")


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """``(line_number, object)`` for each non-blank line; a bad line raises ``InputError``
    naming the file and line. A path ending in ``.gz`` is read through gzip (docs/results
    publishes per-question metrics compressed)."""
    path = Path(path)
    require_file(path)
    # utf-8-sig: a byte-order mark (Windows editors write one) is not part of the first record.
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                raise InputError(
                    [
                        Problem(
                            str(path),
                            lineno,
                            "json",
                            f"invalid JSON ({exc.msg}, column {exc.colno}), expected one JSON object per line",
                        )
                    ]
                ) from None


def iter_json_records(path: str | Path) -> Iterator[tuple[int, int, Any]]:
    """``(line_number, index, record)`` for each record of a JSON list or a JSON-lines file.

    A JSON list is decoded element by element so each record's problems can name the line it
    starts on (``json.load`` would only say that the whole file is bad).
    """
    path = Path(path)
    require_file(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            [Problem(str(path), None, "encoding", f"not UTF-8 text ({exc.reason}), expected a JSON or JSON-lines file")]
        ) from None
    start = len(text) - len(text.lstrip())
    if start == len(text):
        raise InputError(
            [Problem(str(path), None, "file", "empty file, expected a JSON list of records or JSON lines")]
        )
    if text[start] != "[":
        for index, (lineno, obj) in enumerate(iter_jsonl(path)):
            yield lineno, index, obj
        return
    decoder = json.JSONDecoder()
    pos, index = start + 1, 0

    def line_of(offset: int) -> int:
        return text.count("\n", 0, offset) + 1

    def fail(offset: int, what: str) -> InputError:
        return InputError([Problem(str(path), line_of(offset), "json", what)])

    while True:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        if pos >= len(text):
            raise fail(pos, "truncated JSON: the list is not closed, expected ']' or another record")
        if text[pos] == "]":
            rest = text[pos + 1 :].strip()
            if rest:
                raise fail(pos + 1, "extra data after the closing ']', expected end of file")
            return
        if index > 0:
            if text[pos] != ",":
                raise fail(pos, f"unexpected {text[pos]!r} after record {index - 1}, expected ',' or ']'")
            pos += 1
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            # The text ran out inside this record (an unterminated string reports where the
            # string starts, so test whether the rest of the file holds any end of the record).
            truncated = exc.pos >= len(text.rstrip()) - 1 or exc.msg.startswith("Unterminated string")
            kind = "truncated JSON" if truncated else "invalid JSON"
            raise InputError(
                [
                    Problem(
                        str(path),
                        exc.lineno,
                        "json",
                        f"{kind} in record {index} ({exc.msg}, column {exc.colno}), expected a complete JSON record",
                    )
                ]
            ) from None
        yield line_of(pos), index, obj
        pos, index = end, index + 1


@contextlib.contextmanager
def atomic_output_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder that becomes ``path`` only if the block succeeds.

    Refuses (``InputError``) when ``path`` already exists, so nothing is ever overwritten.
    """
    path = Path(path)
    if path.exists():
        raise InputError(f"{path}: output folder already exists; choose a new folder (nothing was written)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            raise InputError(f"{path}: output folder appeared while writing; nothing was written")
        tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
