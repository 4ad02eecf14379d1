"""Reading and writing files safely: JSON lines, hashes, and output folders that appear whole.

Outputs are written into a temporary sibling folder that is renamed into place only when
everything succeeded, so a crash or bad input never leaves a partial output behind, and an
existing folder is never overwritten.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import gzip
import hashlib
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
import zlib
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


def file_kind_problem(path: str | Path, expected: str = "a file", *, folder: bool = False) -> str | None:
    """Why ``path`` cannot be read as a regular file (``folder``: as a folder), worded for the
    user; ``None`` when it can.

    Asked before a file is opened: a named pipe would block the open and could be read only
    once, ``/dev/zero`` never ends, and ``/dev/null`` reads as empty, so each is named for what
    it is rather than reported as missing or read as data.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            return f"a symlink to {os.readlink(path)}, which does not exist; expected {expected}"
        return "no such folder" if folder else "no such file"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"a symlink loop (following its links never ends), expected {expected}"
        if exc.errno == errno.ENOTDIR:
            return f"a path under something that is not a folder, expected {expected}"
        return f"cannot be examined ({exc.strerror}), expected {expected}"
    if stat.S_ISDIR(mode):
        return None if folder else f"is a folder, expected {expected}"
    if stat.S_ISREG(mode):
        if folder:
            return f"is a file, expected {expected}"
        return None if os.access(path, os.R_OK) else f"not readable (permission denied), expected {expected}"
    kinds = {stat.S_ISFIFO: "a named pipe (FIFO), which can be read only once and has no size",
             stat.S_ISCHR: "a character device (such as /dev/null or /dev/zero), not a file with contents",
             stat.S_ISBLK: "a block device", stat.S_ISSOCK: "a socket"}
    what = next((text for test, text in kinds.items() if test(mode)), "not a regular file")
    return f"{what}; expected {expected}" + ("" if folder else " (save the data to a regular file first)")


def require_file(path: Path, expected: str = "a file") -> None:
    """``InputError`` unless ``path`` is a readable regular file, saying what it is instead
    (missing, a folder, a pipe, a device, a symlink loop...; see ``file_kind_problem``)."""
    problem = file_kind_problem(path, expected)
    if problem is not None:
        raise InputError(f"{path}: {problem}")


class NonFiniteNumberError(ValueError):
    """A record about to be written holds NaN or an infinity, which JSON has no spelling for
    (Python would write a bare ``NaN``, which no strict parser reads). ``where`` is the key path
    of the first such number (``events.3.logprobs.0``). Every record file is strict JSON: a
    non-finite number must be turned into something JSON can say (``None``, an error) before it
    reaches a writer, so reaching one is a bug of the code that built the record."""

    def __init__(self, where: str, value: float, path: str | Path | None = None) -> None:
        self.where = where
        target = f"{path}: " if path is not None else ""
        super().__init__(f"{target}{where or 'the record'} is {value!r}: a record file holds strict JSON only "
                         "(finite numbers); nothing was written")


def first_non_finite(obj: Any) -> tuple[str, float] | None:
    """``(key path, value)`` of the first NaN or infinity in ``obj`` (dicts, lists, tuples), else
    ``None``. Iterative, and each container is visited once: any depth, a cycle ends."""
    todo: list[tuple[str, Any]] = [("", obj)]
    seen: set[int] = set()
    while todo:
        where, value = todo.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                return where, value
            continue
        if isinstance(value, dict):
            items: list[tuple[Any, Any]] = list(value.items())
        elif isinstance(value, (list, tuple)):
            items = list(enumerate(value))
        else:
            continue
        if id(value) in seen:
            continue
        seen.add(id(value))
        todo.extend((f"{where}.{key}" if where else str(key), item) for key, item in reversed(items))
    return None


def strict_dumps(obj: Any, path: str | Path | None = None, **options: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False, allow_nan=False, **options)``: the one encoder of every
    record file. A NaN or infinity raises ``NonFiniteNumberError`` naming its key path (and
    ``path``, the file it was meant for) instead of writing a bare ``NaN``/``Infinity``."""
    try:
        return json.dumps(obj, ensure_ascii=False, allow_nan=False, **options)
    except ValueError as exc:
        found = first_non_finite(obj)
        if found is None:  # a ValueError of another kind (a circular reference): not ours to reword
            raise
        raise NonFiniteNumberError(found[0], found[1], path) from exc


def dumps_line(record: Any) -> str:
    """One canonical JSON line: keys in declared order, UTF-8 kept as is, no spaces to vary;
    strict JSON (``strict_dumps``: a NaN or infinity is refused, never written)."""
    return strict_dumps(record, separators=(",", ":"))


def write_jsonl(path: str | Path, records: Iterable[Any]) -> int:
    """Write records as JSON lines (strict JSON: ``dumps_line``); returns the number of lines."""
    n = 0
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for record in records:
            try:
                fh.write(dumps_line(record))
            except NonFiniteNumberError as exc:
                raise NonFiniteNumberError(f"line {n + 1}: {exc.where}", first_non_finite(record)[1], path) from None
            fh.write("\n")
            n += 1
    return n


def dumps_pretty(obj: Any, path: str | Path | None = None) -> str:
    """Pretty JSON with sorted keys and a final newline (stable bytes for hashing); strict JSON
    (``strict_dumps``). What ``write_json`` and a run folder's records write."""
    return strict_dumps(obj, path, indent=2, sort_keys=True) + "\n"


def write_json(path: str | Path, obj: Any) -> None:
    """Pretty JSON with sorted keys and a final newline (``dumps_pretty``). Encoded before the
    file is opened: a record that cannot be written as strict JSON leaves the old file as it was."""
    text = dumps_pretty(obj, path)
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)


# ----------------------------------------------------------------------------- reading records

# A record (a JSON line, or one element of a JSON list) larger than this is refused: a file with
# no newline (a compressed stream of zeros) or an unclosed string must not take all the memory.
MAX_RECORD_BYTES = 256 << 20
# How much of a source is read and decoded at a time: memory stays bounded by this plus the
# record being decoded, whatever the file's size.
READ_BLOCK = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"
_BOM = "\ufeff"
# Compressed or archive formats a source may arrive in that are not read (gzip is).
_OTHER_FORMATS = {b"PK\x03\x04": "a zip archive", b"BZh": "a bzip2 file", b"\xfd7zXZ\x00": "an xz file",
                  b"\x28\xb5\x2f\xfd": "a zstd file", b"7z\xbc\xaf\x27\x1c": "a 7z archive"}
_JSON_SPACE = re.compile(r"[ \t\r\n]*")
# A "\ud800"-style escape: the only way a lone surrogate gets into decoded JSON text (raw
# surrogate bytes are not UTF-8 and fail decoding first), so only such text is walked.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_field(obj: Any) -> tuple[str, str] | None:
    """``(field path, the surrogate as an escape)`` of the first string (value or key) of a
    decoded JSON value that holds a lone UTF-16 surrogate, or ``None``.

    Every reader of JSON records applies this one policy: such a string is not text (it cannot
    be written as UTF-8 or validated as a record), so the record is refused where it is read,
    naming the field, instead of failing later at a write or inside a schema check.
    """
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:  # iterative: a deeply nested record must not hit the recursion limit here
        where, value = stack.pop()
        if isinstance(value, str):
            found = _SURROGATE.search(value)
            if found:
                return where or "record", f"\\u{ord(found.group()):04x}"
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                path = f"{where}.{key}" if where else str(key)
                found = _SURROGATE.search(key)
                if found:
                    return f"{path} (the key)", f"\\u{ord(found.group()):04x}"
                stack.append((path, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in reversed(list(enumerate(value))))
    return None


def _surrogate_problem(path: Path, line: int, prefix: str, obj: Any) -> InputError | None:
    found = lone_surrogate_field(obj)
    if found is None:
        return None
    field, escape = found
    return InputError([Problem(str(path), line, prefix + field,
                               f"lone surrogate escape '{escape}' (half of a UTF-16 pair, not a character), expected "
                               "valid Unicode text: the character itself, or both halves of its pair")])


def _decode_failure(exc: BaseException) -> str | None:
    """What a failed decode of one record means, for the errors that are not a JSON syntax
    error: Python's limit on integer digits, and nesting deeper than the decoder recurses."""
    if isinstance(exc, RecursionError):
        return "nested deeper than can be decoded, expected a record of ordinary depth"
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        limit = sys.get_int_max_str_digits()
        return f"a number with more than {limit} digits, expected a JSON number of ordinary size"
    return None


def _open_source(path: Path) -> tuple[Any, Any]:
    """``(reader of the file's bytes, the file itself)``: the reader goes through gzip when the
    bytes start with its magic (whatever the name: a ``.gz`` suffix is neither needed nor
    trusted); other compressed formats are refused by name. The file's position says how much of
    it was read; close both with ``_close``."""
    with open(path, "rb") as probe:
        head = probe.read(8)
    what = next((name for magic, name in _OTHER_FORMATS.items() if head.startswith(magic)), None)
    if what is not None:
        raise InputError([Problem(str(path), None, "file", f"{what}, expected JSON or JSON lines (plain or "
                                  "gzip-compressed; parquet for the converters)")])
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller (through the gzip file when there is one)
    return (gzip.GzipFile(fileobj=raw, mode="rb") if head.startswith(GZIP_MAGIC) else raw), raw


def _close(fh: Any, raw: Any) -> None:
    fh.close()
    raw.close()


def _gzip_problem(path: Path, line: int | None, exc: BaseException) -> InputError:
    return InputError([Problem(str(path), line, "file", f"damaged or truncated gzip data ({exc}), expected a "
                               "complete gzip file")])


_GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


def iter_jsonl(
    path: str | Path, progress: Callable[[int], None] | None = None, *, index_fields: bool = False
) -> Iterator[tuple[int, Any]]:
    """``(line_number, object)`` for each non-blank line; a bad line raises ``InputError``
    naming the file and line. Gzip-compressed files are read through gzip (docs/results
    publishes per-question metrics compressed). Lines are read one at a time, so memory does not
    grow with the file; ``progress``, when given, is called with the source bytes read so far.
    ``index_fields``: a field is named after its record's index (``[3].question``), as the
    converters name fields of source records."""
    path = Path(path)
    require_file(path)
    fh, raw_file = _open_source(path)
    lineno, reported, index = 0, 0, 0
    try:
        while True:
            try:
                raw = fh.readline(MAX_RECORD_BYTES + 1)
            except _GZIP_ERRORS as exc:
                raise _gzip_problem(path, lineno + 1, exc) from None
            if not raw:
                break
            lineno += 1
            if len(raw) > MAX_RECORD_BYTES and not raw.endswith(b"\n"):
                raise InputError([Problem(str(path), lineno, "json", f"a line longer than {MAX_RECORD_BYTES >> 20} "
                                          "MiB, expected one JSON object per line")])
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError([Problem(str(path), lineno, "encoding", f"not UTF-8 text ({exc.reason} at offset "
                                          f"{exc.start} of the line), expected a JSON or JSON-lines file")]) from None
            if lineno == 1 and line.startswith(_BOM):  # Windows editors write one; not part of the record
                line = line[1:]
            if progress is not None and (offset := raw_file.tell()) - reported >= READ_BLOCK:
                progress(offset)
                reported = offset
            if not line.strip():
                continue
            yield lineno, _decode_line(path, lineno, line.rstrip("\r\n"), f"[{index}]." if index_fields else "")
            index += 1
        if progress is not None:
            progress(raw_file.tell())
    finally:
        _close(fh, raw_file)


def _decode_line(path: Path, lineno: int, text: str, field_prefix: str) -> Any:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError([Problem(str(path), lineno, "json", f"invalid JSON ({exc.msg}, column {exc.colno}), "
                                  "expected one JSON object per line")]) from None
    except (ValueError, RecursionError) as exc:
        what = _decode_failure(exc)
        if what is None:
            raise
        raise InputError([Problem(str(path), lineno, "json", what)]) from None
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        problem = _surrogate_problem(path, lineno, field_prefix, obj)
        if problem is not None:
            raise problem
    return obj


class _TextBlocks:
    """The decoded text of a source file, read a block at a time, with line numbers kept as the
    reader moves on: each character is counted once (counting from the start of the file for
    every record made conversion quadratic in the records)."""

    def __init__(self, path: Path, progress: Callable[[int], None] | None) -> None:
        self.path, self.progress = path, progress
        self.fh, self.raw_file = _open_source(path)
        self.decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self.text = ""
        self.eof = False
        self.bytes_read = 0
        self.mark = 0  # a position in ``text`` whose line and column are known:
        self.mark_line = 1
        self.base_col = 0  # column (0-based) of text[0] on its line
        self.started = False

    def line_at(self, pos: int) -> int:
        """Line number of ``text[pos]``, counted from the last position asked (the reader moves
        forward, so each character is counted about once)."""
        if pos >= self.mark:
            self.mark_line += self.text.count("\n", self.mark, pos)
        else:
            self.mark_line -= self.text.count("\n", pos, self.mark)
        self.mark = pos
        return self.mark_line

    def drop_before(self, pos: int) -> int:
        """Forget the text before ``pos`` (already decoded); returns ``pos``'s new index (0)."""
        if pos == 0:
            return 0
        line = self.line_at(pos)
        newline = self.text.rfind("\n", 0, pos)
        self.base_col = pos - newline - 1 if newline >= 0 else self.base_col + pos
        self.text = self.text[pos:]
        self.mark, self.mark_line = 0, line
        return 0

    def read_more(self, at_least: int = 0) -> bool:
        """Append at least ``at_least`` (and a block) more bytes' worth of text; False at the end
        of the file."""
        if self.eof:
            return False
        wanted, parts = max(at_least, READ_BLOCK), []
        while wanted > 0:
            try:
                block = self.fh.read(READ_BLOCK)
            except _GZIP_ERRORS as exc:
                raise _gzip_problem(self.path, self.line_at(len(self.text)), exc) from None
            final = not block
            try:
                parts.append(self.decoder.decode(block, final=final))
            except UnicodeDecodeError as exc:
                valid = exc.object[: exc.start].decode("utf-8", "replace")
                line = self.line_at(len(self.text)) + "".join(parts).count("\n") + valid.count("\n")
                offset = self.bytes_read + len(block) - len(exc.object) + exc.start
                raise InputError([Problem(str(self.path), line, "encoding", f"not UTF-8 text ({exc.reason} at offset "
                                          f"{offset}), expected a JSON or JSON-lines file")]) from None
            self.bytes_read += len(block)
            wanted -= len(block)
            if final:
                self.eof = True
                break
        new = "".join(parts)
        if not self.started and new:
            self.started = True
            new = new.removeprefix(_BOM)  # Windows editors write one; not part of the JSON
        self.text += new
        if self.progress is not None:
            self.progress(self.raw_file.tell())
        return True

    def close(self) -> None:
        _close(self.fh, self.raw_file)


def iter_json_records(
    path: str | Path, progress: Callable[[int], None] | None = None
) -> Iterator[tuple[int, int, Any]]:
    """``(line_number, index, record)`` for each record of a JSON list or a JSON-lines file
    (either of them plain or gzip-compressed).

    A JSON list is decoded element by element, a block of the file at a time, so each record's
    problems can name the line it starts on (``json.load`` would only say that the whole file
    is bad), time grows linearly with the file and memory stays bounded by the largest record.
    ``progress``, when given, is called with the source bytes read so far.
    """
    path = Path(path)
    require_file(path)
    blocks = _TextBlocks(path, progress)
    try:
        pos = _skip_space(blocks, 0)
        if pos >= len(blocks.text):
            raise InputError(
                [Problem(str(path), None, "file", "empty file, expected a JSON list of records or JSON lines")]
            )
        if blocks.text[pos] != "[":
            first = blocks.text[pos]
            start = " ".join(blocks.text[pos:pos + 200].split())[:80]
            blocks.close()
            index = -1
            try:
                for index, (lineno, obj) in enumerate(iter_jsonl(path, progress, index_fields=True)):
                    yield lineno, index, obj
            except InputError as exc:
                # Not even its first record is JSON, and it does not start as JSON lines of records
                # do: the file is no JSON at all (an HTML page saved as data, ...). Say what the
                # reader expected of it, not only "one object per line".
                bad = exc.problems[0] if len(exc.problems) == 1 else None
                if index >= 0 or first == "{" or bad is None or bad.field != "json":
                    raise
                raise InputError([Problem(bad.file, bad.line, "json", f"not JSON (starts {start!r}), expected "
                                          f"{_records_form(path)}")]) from None
            return
        yield from _iter_list(blocks, pos + 1)
    finally:
        blocks.close()


def _records_form(path: Path) -> str:
    """What ``iter_json_records`` reads, worded for a file of this name: JSON lines for a
    ``.jsonl`` file, else a JSON array (``[`` first) or JSON lines."""
    if path.name.lower().removesuffix(".gz").endswith((".jsonl", ".ndjson")):
        return "JSON lines: one JSON object per line"
    return "a JSON array of records ('[' first) or JSON lines (one JSON object per line)"


def _skip_space(blocks: _TextBlocks, pos: int) -> int:
    """The first position at or after ``pos`` that is not JSON white space (``len(text)`` at the
    end of the file); text before ``pos`` may be dropped, so positions before it are stale."""
    while True:
        pos = _JSON_SPACE.match(blocks.text, pos).end()
        if pos < len(blocks.text):
            return pos
        pos = blocks.drop_before(pos)
        if not blocks.read_more():
            return pos


def _iter_list(blocks: _TextBlocks, pos: int) -> Iterator[tuple[int, int, Any]]:
    path = blocks.path
    decoder = json.JSONDecoder()
    index = 0

    def fail(at: int, what: str) -> InputError:
        return InputError([Problem(str(path), blocks.line_at(at), "json", what)])

    while True:
        pos = _skip_space(blocks, pos)
        text = blocks.text
        if pos >= len(text):
            raise fail(pos, "truncated JSON: the list is not closed, expected ']' or another record")
        if text[pos] == "]":
            pos = blocks.drop_before(pos)  # keep the ']' to name its line
            checked = 1
            while True:
                if blocks.text[checked:].strip():
                    raise fail(pos, "extra data after the closing ']', expected end of file")
                checked = len(blocks.text)
                if not blocks.read_more():
                    return
        if index > 0:
            if text[pos] != ",":
                raise fail(pos, f"unexpected {text[pos]!r} after record {index - 1}, expected ',' or ']'")
            pos = _skip_space(blocks, pos + 1)
        obj, pos, end = _decode_element(blocks, decoder, pos, index)
        line = blocks.line_at(pos)
        if blocks.text.find("\\u", pos, end) >= 0 and _SURROGATE_ESCAPE.search(blocks.text, pos, end):
            problem = _surrogate_problem(path, line, f"[{index}].", obj)
            if problem is not None:
                raise problem
        yield line, index, obj
        pos, index = end, index + 1


def _decode_element(blocks: _TextBlocks, decoder: json.JSONDecoder, pos: int, index: int) -> tuple[Any, int, int]:
    """Decode the list element at ``blocks.text[pos]``: ``(value, where it starts, where it
    ends)``. While it may be cut at the end of what was read, the text before it is dropped and
    more is read (each retry at least doubles the text held, so a large record is decoded a
    bounded number of times and the text held stays about the size of the record)."""
    path = blocks.path
    while True:
        text = blocks.text
        try:
            obj, end = decoder.raw_decode(text, pos)
            if end < len(text) or blocks.eof:
                return obj, pos, end
            # It ends exactly where the text read so far ends: a number may go on; read on.
        except json.JSONDecodeError as exc:
            # Near the end of what was read, the text may just stop inside this record.
            cut = exc.msg.startswith("Unterminated string") or exc.pos >= len(text) - 16
            if blocks.eof or not cut:
                truncated = blocks.eof and (exc.pos >= len(text.rstrip()) - 1 or exc.msg.startswith("Unterminated"))
                kind = "truncated JSON" if truncated else "invalid JSON"
                newline = text.rfind("\n", 0, exc.pos)
                column = exc.pos - newline if newline >= 0 else blocks.base_col + exc.pos + 1
                raise InputError([Problem(str(path), blocks.line_at(exc.pos), "json",
                                          f"{kind} in record {index} ({exc.msg}, column {column}), expected a "
                                          "complete JSON record")]) from None
        except (ValueError, RecursionError) as exc:
            what = _decode_failure(exc)
            if what is None:
                raise
            raise InputError([Problem(str(path), blocks.line_at(pos), "json", f"{what} (record {index})")]) from None
        if len(text) - pos > MAX_RECORD_BYTES:
            raise InputError([Problem(str(path), blocks.line_at(pos), "json", f"record {index} is larger than "
                                      f"{MAX_RECORD_BYTES >> 20} MiB, expected records of ordinary size")])
        pos = blocks.drop_before(pos)
        blocks.read_more(len(blocks.text))


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
