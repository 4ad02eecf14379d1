"""memsearch.io's readers of source records (issue 54): a JSON list is decoded a block at a time
with line numbers kept as it goes (bounded memory; linear time is bench/prepare_scale.py's to
measure, not a timed test's) and answers exactly as decoding
the whole text would, records and errors alike, wherever the blocks split it; gzip is read by its
bytes; lone surrogates, huge integers and deep nesting are refused with file and line; a pipe, a
device or a symlink loop is named for what it is before anything is read."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memsearch.io as io
from memsearch.errors import InputError, Problem
from memsearch.io import file_kind_problem, iter_json_records, iter_jsonl, lone_surrogate_field, require_file

EXE = Path(sys.executable).parent / "memsearch"


def _reference(path: Path) -> tuple[list[tuple[int, int, object]], str | None]:
    """What the reader must answer, from the whole text at once: the records with the line each
    starts on, then the error message (or None). The whole-text decoding of the previous
    implementation, kept here as the oracle for the block-by-block one, with the surrogate policy."""
    text = path.read_bytes().decode("utf-8").removeprefix("\ufeff")
    decoder, out = json.JSONDecoder(), []

    def line_of(offset: int) -> int:
        return text.count("\n", 0, offset) + 1

    def err(offset: int, what: str) -> str:
        return str(Problem(str(path), line_of(offset), "json", what))

    start = len(text) - len(text.lstrip())
    pos, index = start + 1, 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        if pos >= len(text):
            return out, err(pos, "truncated JSON: the list is not closed, expected ']' or another record")
        if text[pos] == "]":
            if text[pos + 1 :].strip():
                return out, err(pos + 1, "extra data after the closing ']', expected end of file")
            return out, None
        if index > 0:
            if text[pos] != ",":
                return out, err(pos, f"unexpected {text[pos]!r} after record {index - 1}, expected ',' or ']'")
            pos += 1
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            truncated = exc.pos >= len(text.rstrip()) - 1 or exc.msg.startswith("Unterminated string")
            kind = "truncated JSON" if truncated else "invalid JSON"
            return out, str(Problem(str(path), exc.lineno, "json", f"{kind} in record {index} ({exc.msg}, column "
                                    f"{exc.colno}), expected a complete JSON record"))
        # The readers' one policy for lone surrogates (io.lone_surrogate_field): a record holding
        # one is refused where it is read (e.g. a stray character inserted inside a "\ud800\udc00" pair).
        problem = io._surrogate_problem(path, line_of(pos), f"[{index}].", obj)
        if problem is not None:
            return out, str(problem)
        out.append((line_of(pos), index, obj))
        pos, index = end, index + 1


def _read(path: Path) -> tuple[list[tuple[int, int, object]], str | None]:
    out = []
    try:
        for item in iter_json_records(path):
            out.append(item)
    except InputError as exc:
        return out, str(exc)
    return out, None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
layouts = st.sampled_from([None, 0, 1, 2, 4])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(json_values, max_size=6), indent=layouts, block=st.integers(1, 40), cut=st.integers(0, 10**4),
       noise=st.sampled_from(["", "x", "]", ",", "{", '"', "\n", "[", "1"]),
       mode=st.sampled_from(["whole", "cut", "insert"]))
def test_block_reader_answers_as_whole_text_decoding(tmp_path, monkeypatch, records, indent, block, cut, noise, mode):
    """Any list, any layout, any block size (down to one byte: every record and token split
    across reads), whole, cut short or with a stray character: same records, same lines, same
    error message as decoding the whole text."""
    monkeypatch.setattr(io, "READ_BLOCK", block)
    text = json.dumps(records, indent=indent)
    if mode == "cut":
        text = text[: cut % (len(text) + 1)] or "["
    elif mode == "insert":
        at = 1 + cut % len(text)
        text = text[:at] + noise + text[at:]
    path = tmp_path / "records.json"
    path.write_text(text, encoding="utf-8")
    assert _read(path) == _reference(path)


@pytest.mark.parametrize("indent", [None, 2])
def test_one_line_array_of_many_records_keeps_columns(tmp_path, monkeypatch, indent):
    """The official file is one line: a bad record deep in it names line 1 and its true column."""
    monkeypatch.setattr(io, "READ_BLOCK", 64)
    records = [{"_id": f"r{i}", "q": "x" * (i % 7)} for i in range(300)]
    text = json.dumps(records, indent=indent)
    at = text.index('"r250"')
    path = tmp_path / "one.json"
    path.write_text(text[:at] + "tru" + text[at + 6 :], encoding="utf-8")
    got, error = _read(path)
    assert (got, error) == _reference(path)
    assert len(got) == 250 and "invalid JSON in record 250" in error


def test_gzip_is_read_by_its_bytes_whatever_the_name(tmp_path):
    records = [{"a": i, "t": "café"} for i in range(50)]
    listed = json.dumps(records, indent=2).encode()
    lines = "".join(json.dumps(r) + "\n" for r in records).encode()
    for name, data in (("l.json.gz", listed), ("l.json", listed), ("x.jsonl.gz", lines), ("x.data", lines)):
        path = tmp_path / name
        path.write_bytes(gzip.compress(data))
        plain = tmp_path / f"plain-{name}"
        plain.write_bytes(data)
        assert list(iter_json_records(path)) == list(iter_json_records(plain))
    assert list(iter_jsonl(tmp_path / "x.data")) == list(iter_jsonl(tmp_path / "plain-x.data"))
    named_gz = tmp_path / "plain.jsonl.gz"  # a .gz name on plain text is read as the text it is
    named_gz.write_bytes(lines)
    assert [obj for _, obj in iter_jsonl(named_gz)] == records


@pytest.mark.parametrize("keep", [10, 200])
def test_damaged_gzip_names_the_file(tmp_path, keep):
    path = tmp_path / "cut.json.gz"
    data = gzip.compress(json.dumps([{"a": os.urandom(40).hex()} for _ in range(200)]).encode())
    assert len(data) > 1000
    path.write_bytes(data[:keep])
    with pytest.raises(InputError, match="damaged or truncated gzip data .*expected a complete gzip file"):
        list(iter_json_records(path))


@pytest.mark.parametrize("magic, what", [(b"PK\x03\x04", "a zip archive"), (b"BZh91AY", "a bzip2 file"),
                                         (b"\xfd7zXZ\x00\x00", "an xz file"), (b"\x28\xb5\x2f\xfd", "a zstd file")])
def test_other_compressed_formats_are_named(tmp_path, magic, what):
    path = tmp_path / "data.json"
    path.write_bytes(magic + b"\0" * 40)
    for read in (iter_json_records, iter_jsonl):
        with pytest.raises(InputError) as info:
            list(read(path))
        assert str(info.value) == f"{path}: file: {what}, expected JSON or JSON lines (plain or gzip-compressed; " \
                                  "parquet for the converters)"


# ----------------------------------------------------------------------------- what a decoder cannot take

DEEP = 5_000


@pytest.mark.parametrize("layout", ["list", "lines"])
@pytest.mark.parametrize("value, what", [
    ("9" * 5_000, "a number with more than 4300 digits"),
    ("-" + "1" * 4_301, "a number with more than 4300 digits"),
    ("[" * DEEP + "]" * DEEP, "nested deeper than can be decoded"),
    ('{"a":' * DEEP + "1" + "}" * DEEP, "nested deeper than can be decoded"),
])
def test_huge_integer_and_deep_nesting_are_refused_with_the_line(tmp_path, layout, value, what):
    path = tmp_path / "bad.json"
    good = '{"a": 1}'
    body = f'{{"x": {value}}}'
    path.write_text(f"[\n{good},\n{good},\n{body}\n]\n" if layout == "list" else f"{good}\n{good}\n{body}\n")
    with pytest.raises(InputError) as info:
        list(iter_json_records(path))
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.field) == (str(path), 4 if layout == "list" else 3, "json")
    assert what in problem.message


# ----------------------------------------------------------------------------- lone surrogates

SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
FIELDS = st.lists(st.sampled_from(["question", "context", "title", "answer", "s"]) | st.integers(0, 2),
                  min_size=1, max_size=4).filter(lambda p: isinstance(p[0], str))


def _place(path: list, value: str) -> tuple[object, str]:
    """A record holding ``value`` at ``path`` (str: a key, int: a list index), and that field's name."""
    obj: object = value
    for part in reversed(path):
        obj = {part: obj} if isinstance(part, str) else [*([""] * part), obj]
    name = ""
    for part in path:
        name += (f".{part}" if name else part) if isinstance(part, str) else f"[{part}]"
    return obj, name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=FIELDS, surrogate=SURROGATES, before=st.text(max_size=4), layout=st.sampled_from(["list", "lines"]))
def test_lone_surrogate_is_refused_naming_file_line_and_field(tmp_path, path, surrogate, before, layout):
    record, field = _place(path, before + surrogate)
    file = tmp_path / "s.json"
    escaped = json.dumps(record)  # ensure_ascii: the surrogate becomes a "\udXXX" escape, as in the issue
    file.write_text(f'[\n{{"ok": 1}},\n{escaped}\n]' if layout == "list" else f'{{"ok": 1}}\n{escaped}\n')
    with pytest.raises(InputError) as info:
        list(iter_json_records(file))
    (problem,) = info.value.problems
    assert (problem.file, problem.line) == (str(file), 3 if layout == "list" else 2)
    assert problem.field == f"[1].{field}"  # named as the converters name a record's fields
    if layout == "lines":
        with pytest.raises(InputError) as info:
            list(iter_jsonl(file))  # a plain JSON-lines reader: the line says which record
        assert info.value.problems[0].field == field
    assert f"lone surrogate escape '\\u{ord(surrogate):04x}'" in problem.message


def test_surrogate_pairs_and_keys():
    assert lone_surrogate_field({"a": ["ok", "\U0001f600", {"b": "x\udc00"}]}) == ("a[2].b", "\\udc00")
    assert lone_surrogate_field({"k\ud83d": 1}) == ("k\ud83d (the key)", "\\ud83d")
    assert lone_surrogate_field(json.loads('["\\ud83d\\ude00"]')) is None  # an escaped pair is a character


# ----------------------------------------------------------------------------- file kinds


def test_file_kinds_are_named_before_reading(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "gone.json")
    expected = {
        fifo: "a named pipe (FIFO), which can be read only once and has no size; expected a file (save the data "
              "to a regular file first)",
        loop: "a symlink loop (following its links never ends), expected a file",
        dangling: f"a symlink to {tmp_path / 'gone.json'}, which does not exist; expected a file",
        Path("/dev/null"): "a character device (such as /dev/null or /dev/zero), not a file with contents; expected "
                           "a file (save the data to a regular file first)",
        tmp_path: "is a folder, expected a file",
        tmp_path / "missing.json": "no such file",
        tmp_path / "missing" / "x.json": "no such file",
    }
    for path, message in expected.items():
        assert file_kind_problem(path) == message
        for read in (iter_jsonl, iter_json_records):
            with pytest.raises(InputError) as info:
                list(read(path))  # returns at once: nothing is opened
            assert str(info.value) == f"{path}: {message}"
    assert file_kind_problem("/dev/zero").startswith("a character device")
    with pytest.raises(InputError, match="expected a TOML config file"):
        require_file(Path("/dev/zero"), "a TOML config file")


# ----------------------------------------------------------------------------- scale


def _array(path: Path, n: int) -> None:
    path.write_text(json.dumps([{"_id": f"r{i}", "text": "word " * 20} for i in range(n)]), encoding="utf-8")


def test_memory_stays_bounded_by_the_block_not_the_file(tmp_path, monkeypatch):
    """A 6 MB array and 6 MB of JSON lines are read in 64 KiB blocks with a peak of traced
    memory under 1 MB: what is held is a few blocks and one record, whatever the file's size."""
    monkeypatch.setattr(io, "READ_BLOCK", 64 << 10)
    listed, lines = tmp_path / "big.json", tmp_path / "big.jsonl"
    _array(listed, 50_000)
    lines.write_text("".join(json.dumps({"_id": f"r{i}", "text": "word " * 20}) + "\n" for i in range(50_000)))
    for path in (listed, lines):
        tracemalloc.start()
        n = sum(1 for _ in iter_json_records(path))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert n == 50_000
        assert path.stat().st_size > 6_000_000 and peak < 1_000_000, (path.name, peak)


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_cli_does_not_hang_on_a_pipe_or_dev_zero(tmp_path, kind):
    source = tmp_path / "pipe.json"
    if kind == "fifo":
        os.mkfifo(source)
    else:
        source.symlink_to("/dev/zero")
    out = tmp_path / "out"
    run = subprocess.run([str(EXE), "data", "prepare-hotpot", "--input", str(source), "--split", "dev", "--out",
                          str(out)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.startswith(f"error: {source}: a ")
    assert ("named pipe" if kind == "fifo" else "character device") in run.stderr
    assert not out.exists()


def test_folder_kinds_are_named(tmp_path):
    fifo, loop, file = tmp_path / "fifo", tmp_path / "loop", tmp_path / "file"
    os.mkfifo(fifo)
    loop.symlink_to(loop)
    file.write_text("x")
    want = "a data folder"
    assert file_kind_problem(tmp_path, want, folder=True) is None
    assert file_kind_problem(tmp_path / "nope", want, folder=True) == "no such folder"
    assert file_kind_problem(file, want, folder=True) == f"is a file, expected {want}"
    assert file_kind_problem(loop, want, folder=True) == f"a symlink loop (following its links never ends), " \
                                                         f"expected {want}"
    assert file_kind_problem(fifo, want, folder=True).startswith("a named pipe (FIFO)")
    assert file_kind_problem("/dev/null", want, folder=True).endswith(f"not a file with contents; expected {want}")
