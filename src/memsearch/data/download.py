"""Fetch a data file once, verifiably, and resume it when cut off.

``download(url, dest, sha256)`` writes ``dest.part`` while hashing the bytes, continues a cut-off
``.part`` with an HTTP ``Range`` request when the server honours it (206; a server that answers
200 instead restarts it), checks the SHA-256 against the configured one, writes the digest to
``dest.sha256`` and only then renames ``.part`` to ``dest``: a ``dest`` is always complete. A
``dest`` already there is reused without a request when its digest matches the configured one
(or, with none configured, the one its ``.sha256`` sidecar recorded), and refused, never
overwritten, when it does not. ``file://`` URLs and plain local paths are copied the same way.

``expect`` (``data_file_problem`` for the data sources) judges what came back before anything is
kept as complete: a server that answers 200 with an HTML error, login or proxy page, or bytes no
data file of that name can start with, is refused (``InputError`` with the content type and the
first bytes) and nothing of it is kept: not ``dest``, nor its ``.part``.

    got = download("https://host/hotpot_dev_distractor_v1.json", raw / "dev.json", sha256=None,
                   expect=data_file_problem)
    got.sha256, got.bytes, got.resumed, got.reused   # recorded in the data manifest
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memsearch.errors import InputError
from memsearch.io import sha256_file

CHUNK = 1 << 20
BACKOFF_S = (1.0, 2.0, 4.0, 8.0)  # waits between attempts (the last repeats): a few seconds, bounded
HEAD_BYTES = 512  # what ``expect`` sees of a file: enough for a BOM, white space and the first token
SHOWN_CHARS = 80  # how much of a refused body a message quotes

# ``expect(name, head, content_type)``: why a file called ``name`` whose bytes start with ``head``
# (None: not seen, a continued body) served as ``content_type`` (None: a local file) is not what
# was asked for, else None.
Expect = Callable[[str, "bytes | None", "str | None"], "str | None"]

_PARQUET, _GZIP, _BOM = b"PAR1", b"\x1f\x8b", b"\xef\xbb\xbf"
_HTML_TYPES = ("text/html", "application/xhtml+xml")


def _expected_form(name: str) -> tuple[str, tuple[str, ...]]:
    """What a data file called ``name`` must be (words for a message) and the forms of it the
    converters read (``data/source.py`` reads the bytes, not the name: parquet by its magic, gzip
    by its, else a JSON array or JSON lines)."""
    base = name.lower().removesuffix(".gz")
    if base.endswith(".parquet"):
        return "a parquet file (its bytes start with 'PAR1')", ("parquet",)
    if base.endswith((".jsonl", ".ndjson")):
        return "JSON lines (one JSON object per line: '{' first)", ("json", "gzip")
    if base.endswith(".json"):
        return "a JSON array of records ('[' first; JSON lines: '{' first)", ("json", "gzip")
    return "a JSON array, JSON lines or a parquet file, as the HotpotQA converter reads", ("json", "gzip", "parquet")


def came_back(head: bytes, content_type: str | None) -> str:
    """What a body was, for a message: its content type and its first ``SHOWN_CHARS`` characters."""
    kind = f"Content-Type {content_type or 'not given'}"
    if not head:
        return f"{kind}, no bytes at all"
    text = " ".join(head[:SHOWN_CHARS * 4].decode("utf-8", errors="replace").split())[:SHOWN_CHARS]
    return f"{kind}, starting {text!r}"


def data_file_problem(name: str, head: bytes | None, content_type: str | None = None) -> str | None:
    """Why bytes starting with ``head`` (served as ``content_type``) cannot be the data file
    ``name`` (a HotpotQA JSON array, JSON lines or parquet file), else ``None``. A cheap sniff of
    the first bytes, never a parse: an HTML page (by its Content-Type, or a body starting with
    ``<``: an error, login or proxy page answering 200), an empty body, or a first byte no form of
    that name starts with (after a UTF-8 BOM and white space). ``head`` None (the middle of a
    file): the content type alone."""
    expected, forms = _expected_form(name)
    ctype = (content_type or "").split(";")[0].strip().lower()
    if head is None:
        return f"got an HTML page (Content-Type {content_type}), expected {expected}" if ctype in _HTML_TYPES else None
    text = head.removeprefix(_BOM).lstrip(b" \t\r\n")
    if ctype in _HTML_TYPES or text.startswith(b"<"):
        return f"got an HTML page ({came_back(head, content_type)}), not the data file: expected {expected}"
    if ("parquet" in forms and head.startswith(_PARQUET)) or ("gzip" in forms and head.startswith(_GZIP)) or (
            "json" in forms and text[:1] in (b"[", b"{")):
        return None
    what = "an empty file" if not head else "other bytes"
    return f"got {what} ({came_back(head, content_type)}), expected {expected}"


def _head(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(HEAD_BYTES)


def _refused(url: str, problem: str) -> InputError:
    return InputError(f"{url}: {problem}; nothing of it was kept. Check the URL (a server answers an error, login "
                      "or proxy page with status 200 too), or download the file yourself and give its path")


@dataclass(frozen=True)
class Downloaded:
    """What ``download`` left at ``path``: its SHA-256 and size, whether bytes of an earlier cut-off
    attempt were kept (``resumed``) and whether an existing complete file was used as it was
    (``reused``)."""

    url: str
    path: Path
    sha256: str
    bytes: int
    resumed: bool
    reused: bool


class _Interrupted(Exception):
    """A transfer cut off after some bytes: worth another attempt from where it stopped."""


def _sidecar(dest: Path) -> Path:
    return dest.with_name(dest.name + ".sha256")


def _part(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def _recorded_sha(dest: Path) -> str | None:
    try:
        text = _sidecar(dest).read_text(encoding="utf-8").split()
    except OSError:
        return None
    return text[0].lower() if text else None


def _finish(url: str, dest: Path, part: Path, got: str, expected: str | None, resumed: bool) -> Downloaded:
    if expected is not None and got != expected:
        part.unlink(missing_ok=True)
        raise InputError(f"{url}: SHA-256 mismatch: expected {expected}, got {got}; the download was removed "
                         "(a changed or corrupted file at the source: check the URL and the configured sha256)")
    _sidecar(dest).write_text(f"{got}  {dest.name}\n", encoding="utf-8")
    size = part.stat().st_size
    os.replace(part, dest)
    return Downloaded(url, dest, got, size, resumed, False)


def _existing(url: str, dest: Path, expected: str | None, echo, expect: Expect | None = None) -> Downloaded | None:
    """The record of a complete ``dest`` that may be reused; ``InputError`` when it does not match
    (its digest, or ``expect``: a page kept by an earlier memsearch is no data file)."""
    if not dest.is_file():
        return None
    if expect is not None and (problem := expect(dest.name, _head(dest), None)) is not None:
        raise InputError(f"{dest}: exists but {problem}; it is left as it is: remove it to download {url} again")
    recorded = _recorded_sha(dest)
    got = sha256_file(dest)
    want = expected or recorded
    if want is not None and got != want:
        source = "the configured sha256" if expected else f"the digest recorded in {_sidecar(dest)}"
        raise InputError(f"{dest}: exists with SHA-256 {got}, not {want} ({source}); it is left as it is: remove it "
                         f"to download {url} again, or fix the configured sha256")
    if recorded != got:
        _sidecar(dest).write_text(f"{got}  {dest.name}\n", encoding="utf-8")
    echo(f"{dest}: already there (SHA-256 {got[:12]}...{'' if want else ', nothing to check it against'}); reused")
    return Downloaded(url, dest, got, dest.stat().st_size, False, True)


def local_source(url: str) -> Path | None:
    """The local file a ``file://`` URL or a plain path names; None for an http(s) URL."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return Path(urllib.request.url2pathname(parsed.path))
    if parsed.scheme in ("http", "https"):
        return None
    if parsed.scheme:
        raise InputError(f"{url}: expected an http(s):// or file:// URL or a local path")
    return Path(url)


def download(url: str, dest: Path, sha256: str | None = None, echo=print, timeout_s: float = 60,
             retries: int = 3, expect: Expect | None = None) -> Downloaded:
    """Put the file at ``url`` (http(s)://, file:// or a local path) at ``dest`` and return its
    record. Resumes a cut-off ``dest.part``; retries a transfer cut off or refused up to
    ``retries`` times (waits of 1, 2, 4, 8 s); ``timeout_s`` bounds each network read. Refuses
    (``InputError``) a digest other than ``sha256`` (the download removed), an unreachable host
    (with what to do instead), an HTTP error status, content that ``expect`` refuses (the body
    judged by its first bytes before it is written, the whole file again before it is complete;
    nothing of it kept), and an existing ``dest`` that does not match (left as it is)."""
    dest = Path(dest)
    expected = sha256.lower() if sha256 else None
    reused = _existing(url, dest, expected, echo, expect)
    if reused is not None:
        return reused
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = _part(dest)
    source = local_source(url)
    if source is not None:
        if not source.is_file():
            raise InputError(f"{url}: no such file to copy to {dest}")
        if expect is not None and (problem := expect(dest.name, _head(source), None)) is not None:
            raise _refused(url, problem)
        digest = hashlib.sha256()
        with open(source, "rb") as src, open(part, "wb") as out:
            for block in iter(lambda: src.read(CHUNK), b""):
                digest.update(block)
                out.write(block)
        got = _finish(url, dest, part, digest.hexdigest(), expected, False)
        echo(f"{dest}: copied from {source} ({got.bytes} bytes, SHA-256 {got.sha256[:12]}...)")
        return got
    host = urllib.parse.urlparse(url).netloc
    resumed = False
    for attempt in range(retries + 1):
        try:
            kept = _fetch(url, part, timeout_s, expect, dest.name)
            resumed = resumed or kept
            break
        except (_Interrupted, OSError, http.client.HTTPException) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            what = str(reason) if isinstance(reason, _Interrupted) else f"{type(reason).__name__}: {reason}"
            if isinstance(reason, socket.gaierror) or attempt == retries:
                tries = f"after {attempt + 1} attempt(s)"
                if isinstance(reason, _Interrupted):
                    have = part.stat().st_size if part.is_file() else 0
                    raise InputError(f"{url}: {what} ({tries}); {have} bytes kept in {part}: run again to continue "
                                     "from there") from None
                raise InputError(f"could not reach {host}: {what} ({tries}); download the file yourself and set the "
                                 "path") from None
            wait = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
            echo(f"{url}: {what}; retrying in {wait:g} s ({attempt + 1}/{retries})")
            time.sleep(wait)
    if expect is not None and (problem := expect(dest.name, _head(part), None)) is not None:
        part.unlink()  # e.g. a resumed transfer whose first bytes were of another answer
        raise _refused(url, problem)
    digest = hashlib.sha256()
    with open(part, "rb") as fh:  # the digest of the whole file, kept bytes included
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)
    got = _finish(url, dest, part, digest.hexdigest(), expected, resumed)
    echo(f"{dest}: downloaded {got.bytes} bytes{' (resumed)' if resumed else ''}, SHA-256 {got.sha256[:12]}...")
    return got


def _fetch(url: str, part: Path, timeout_s: float, expect: Expect | None = None, name: str = "") -> bool:
    """One attempt: continue ``part`` (Range) or write it anew until the body is complete.
    Returns whether earlier bytes were kept; raises ``_Interrupted`` on a body cut short and
    ``InputError`` on an HTTP error status or a body ``expect`` refuses (judged by its content
    type and first bytes before anything is written: a continued body by its content type)."""
    offset = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # the range starts past the file: the .part is not of this file
            part.unlink()
            return _fetch(url, part, timeout_s, expect, name)
        if exc.code >= 500:
            raise _Interrupted(f"HTTP {exc.code} {exc.reason}") from None
        raise InputError(f"{url}: HTTP {exc.code} {exc.reason}; check the URL") from None
    with response:
        keep = offset > 0 and response.status == 206 and _range_start(response) == offset
        length = response.headers.get("Content-Length")
        total = (offset if keep else 0) + int(length) if length and length.isdigit() else None
        first = b""
        if expect is not None:
            content_type = response.headers.get("Content-Type")
            try:  # the first bytes, before any is written: a page is refused with nothing kept
                first = b"" if keep else response.read(HEAD_BYTES)
            except (http.client.IncompleteRead, OSError) as exc:
                raise _Interrupted(f"connection lost at the start of the body ({type(exc).__name__})") from None
            # A continued body starts mid-file: only its content type is judged here.
            if (problem := expect(name, None if keep else first, content_type)) is not None:
                raise _refused(url, problem)
        from tqdm import tqdm

        with open(part, "ab" if keep else "wb") as out, tqdm(
            total=total, initial=offset if keep else 0, desc=f"download {part.name[: -len('.part')]}", unit="B",
            unit_scale=True, unit_divisor=1024, mininterval=0.5, leave=False, disable=None,
        ) as bar:
            try:
                if first:
                    out.write(first)
                    bar.update(len(first))
                for block in iter(lambda: response.read(CHUNK), b""):
                    out.write(block)
                    bar.update(len(block))
            except (http.client.IncompleteRead, OSError) as exc:
                raise _Interrupted(f"connection lost after {out.tell()} bytes ({type(exc).__name__})") from None
            done = out.tell()
    if total is not None and done < total:
        raise _Interrupted(f"connection closed after {done} of {total} bytes")
    return keep


def _range_start(response) -> int | None:
    value = response.headers.get("Content-Range", "")  # "bytes 100-999/1000"
    try:
        return int(value.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None

