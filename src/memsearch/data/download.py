"""Fetch a data file once, verifiably, and resume it when cut off.

``download(url, dest, sha256)`` writes ``dest.part`` while hashing the bytes, continues a cut-off
``.part`` with an HTTP ``Range`` request when the server honours it (206; a server that answers
200 instead restarts it), checks the SHA-256 against the configured one, writes the digest to
``dest.sha256`` and only then renames ``.part`` to ``dest``: a ``dest`` is always complete. A
``dest`` already there is reused without a request when its digest matches the configured one
(or, with none configured, the one its ``.sha256`` sidecar recorded), and refused, never
overwritten, when it does not. ``file://`` URLs and plain local paths are copied the same way.

    got = download("https://host/hotpot_dev_distractor_v1.json", raw / "dev.json", sha256=None)
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
from dataclasses import dataclass
from pathlib import Path

from memsearch.errors import InputError
from memsearch.io import sha256_file

CHUNK = 1 << 20
BACKOFF_S = (1.0, 2.0, 4.0, 8.0)  # waits between attempts (the last repeats): a few seconds, bounded


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


def _existing(url: str, dest: Path, expected: str | None, echo) -> Downloaded | None:
    """The record of a complete ``dest`` that may be reused; ``InputError`` when it does not match."""
    if not dest.is_file():
        return None
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


def _local_source(url: str) -> Path | None:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return Path(urllib.request.url2pathname(parsed.path))
    if parsed.scheme in ("http", "https"):
        return None
    if parsed.scheme:
        raise InputError(f"{url}: expected an http(s):// or file:// URL or a local path")
    return Path(url)


def download(url: str, dest: Path, sha256: str | None = None, echo=print, timeout_s: float = 60,
             retries: int = 3) -> Downloaded:
    """Put the file at ``url`` (http(s)://, file:// or a local path) at ``dest`` and return its
    record. Resumes a cut-off ``dest.part``; retries a transfer cut off or refused up to
    ``retries`` times (waits of 1, 2, 4, 8 s); ``timeout_s`` bounds each network read. Refuses
    (``InputError``) a digest other than ``sha256`` (the download removed), an unreachable host
    (with what to do instead), an HTTP error status, and an existing ``dest`` that does not
    match (left as it is)."""
    dest = Path(dest)
    expected = sha256.lower() if sha256 else None
    reused = _existing(url, dest, expected, echo)
    if reused is not None:
        return reused
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = _part(dest)
    source = _local_source(url)
    if source is not None:
        if not source.is_file():
            raise InputError(f"{url}: no such file to copy to {dest}")
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
            kept = _fetch(url, part, timeout_s)
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
    digest = hashlib.sha256()
    with open(part, "rb") as fh:  # the digest of the whole file, kept bytes included
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)
    got = _finish(url, dest, part, digest.hexdigest(), expected, resumed)
    echo(f"{dest}: downloaded {got.bytes} bytes{' (resumed)' if resumed else ''}, SHA-256 {got.sha256[:12]}...")
    return got


def _fetch(url: str, part: Path, timeout_s: float) -> bool:
    """One attempt: continue ``part`` (Range) or write it anew until the body is complete.
    Returns whether earlier bytes were kept; raises ``_Interrupted`` on a body cut short and
    ``InputError`` on an HTTP error status."""
    offset = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # the range starts past the file: the .part is not of this file
            part.unlink()
            return _fetch(url, part, timeout_s)
        if exc.code >= 500:
            raise _Interrupted(f"HTTP {exc.code} {exc.reason}") from None
        raise InputError(f"{url}: HTTP {exc.code} {exc.reason}; check the URL") from None
    with response:
        keep = offset > 0 and response.status == 206 and _range_start(response) == offset
        length = response.headers.get("Content-Length")
        total = (offset if keep else 0) + int(length) if length and length.isdigit() else None
        from tqdm import tqdm

        with open(part, "ab" if keep else "wb") as out, tqdm(
            total=total, initial=offset if keep else 0, desc=f"download {part.name[: -len('.part')]}", unit="B",
            unit_scale=True, unit_divisor=1024, mininterval=0.5, leave=False, disable=None,
        ) as bar:
            try:
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

