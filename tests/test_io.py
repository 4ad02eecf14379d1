"""memsearch.io: reading source records with the line each starts on, writing canonical JSON
lines, and output folders that appear whole or not at all."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from memsearch.data.source import iter_source
from memsearch.errors import InputError, Problem
from memsearch.io import (
    atomic_output_dir,
    dumps_line,
    iter_json_records,
    iter_jsonl,
    sha256_file,
    write_json,
    write_jsonl,
)

ROOT = Path(__file__).resolve().parents[1]
TRAIN_SAMPLE = ROOT / "data" / "samples" / "hotpotqa" / "train_sample.json"


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _error(path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        list(iter_json_records(path))
    return info.value


# --------------------------------------------------------------------------- JSON lists


def test_real_pretty_printed_list_gives_each_record_with_its_start_line():
    """The shipped train sample is a JSON list indented by 4: each record starts at a line
    that reads exactly '    {'."""
    text = TRAIN_SAMPLE.read_text(encoding="utf-8")
    starts = [n for n, line in enumerate(text.split("\n"), start=1) if line == "    {"]
    got = list(iter_json_records(TRAIN_SAMPLE))
    assert [line for line, _, _ in got] == starts
    assert [line for line, _, _ in got][:5] == [2, 122, 231, 391, 513]
    assert [index for _, index, _ in got] == list(range(100))
    assert [record for _, _, record in got] == json.loads(text)


def test_small_pretty_list_line_numbers(tmp_path):
    records = [{"id": "a", "x": [1, 2]}, {"id": "b"}, {"id": "c", "nested": {"k": ["v", "w"]}}]
    path = _write(tmp_path / "list.json", json.dumps(records, indent=2))
    # [ / { / "id" / "x": [ / 1, / 2 / ] / }, / { ... : record 1 starts on line 9
    assert list(iter_json_records(path)) == [(2, 0, records[0]), (9, 1, records[1]), (12, 2, records[2])]


def test_compact_list_all_on_line_one_and_leading_whitespace(tmp_path):
    path = _write(tmp_path / "list.json", '\n\n  [{"a":1},{"a":2} ,\n {"a":3}]\n\n')
    assert list(iter_json_records(path)) == [(3, 0, {"a": 1}), (3, 1, {"a": 2}), (4, 2, {"a": 3})]


def test_empty_list_gives_no_records(tmp_path):
    assert list(iter_json_records(_write(tmp_path / "e.json", "[ ]\n"))) == []


def test_non_object_json_values_are_yielded_as_is(tmp_path):
    """io does not judge record types; the converters do (see iter_source below)."""
    path = _write(tmp_path / "mixed.json", '[1, "two", null, [3], {"a": 4}]')
    assert list(iter_json_records(path)) == [(1, 0, 1), (1, 1, "two"), (1, 2, None), (1, 3, [3]), (1, 4, {"a": 4})]
    scalar = _write(tmp_path / "scalar.json", "42\n")  # not a list: read as JSON lines
    assert list(iter_json_records(scalar)) == [(1, 0, 42)]


def test_iter_source_reports_non_object_records_with_their_line(tmp_path):
    path = _write(tmp_path / "mixed.json", '[\n  1,\n  {"a": 4},\n  "x"\n]\n')
    problems: list[Problem] = []
    records = list(iter_source(path, None, problems))
    assert [(r.line, r.index, r.obj) for r in records] == [(3, 1, {"a": 4})]
    assert [str(p) for p in problems] == [
        f"{path}:2: [0]: got int, expected a JSON object per example",
        f"{path}:4: [2]: got str, expected a JSON object per example",
    ]


def test_iter_source_limit_counts_objects_only(tmp_path):
    path = _write(tmp_path / "l.json", json.dumps([{"i": i} for i in range(5)]))
    problems: list[Problem] = []
    assert [r.obj for r in iter_source(path, 2, problems)] == [{"i": 0}, {"i": 1}]
    assert problems == []
    with pytest.raises(InputError) as info:
        list(iter_source(path, 0, problems))
    assert str(info.value) == "--limit 0: expected a positive number of examples"


# --------------------------------------------------------------------------- JSON lines


def test_jsonl_records_with_line_numbers_and_blank_lines(tmp_path):
    path = _write(tmp_path / "r.jsonl", '{"a": 1}\n\n  \n{"a": 2}\n{"a": [3]}\n')
    assert list(iter_json_records(path)) == [(1, 0, {"a": 1}), (4, 1, {"a": 2}), (5, 2, {"a": [3]})]
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (4, {"a": 2}), (5, {"a": [3]})]


def test_jsonl_bad_line_names_file_and_line(tmp_path):
    path = _write(tmp_path / "r.jsonl", '{"a": 1}\n{"a": tru}\n{"a": 3}\n')
    err = _error(path)
    assert str(err) == f"{path}:2: json: invalid JSON (Expecting value, column 7), expected one JSON object per line"
    assert err.problems == [
        Problem(str(path), 2, "json", "invalid JSON (Expecting value, column 7), expected one JSON object per line")
    ]


def test_jsonl_truncated_last_line_without_newline(tmp_path):
    path = _write(tmp_path / "r.jsonl", '{"a": 1}\n{"a": 2')
    assert (
        str(_error(path))
        == f"{path}:2: json: invalid JSON (Expecting ',' delimiter, column 8), expected one JSON object per line"
    )


def test_jsonl_truncated_line_reports_column_at_end_of_line(tmp_path):
    path = _write(tmp_path / "r.jsonl", '{"a": 1}\n{"a": 2\n{"a": 3}\n')
    assert (
        str(_error(path))
        == f"{path}:2: json: invalid JSON (Expecting ',' delimiter, column 8), expected one JSON object per line"
    )


# --------------------------------------------------------------------------- broken files


@pytest.mark.parametrize("text", ["", "   \n\n\t"])
def test_empty_file(tmp_path, text):
    path = _write(tmp_path / "empty.json", text)
    err = _error(path)
    assert str(err) == f"{path}: file: empty file, expected a JSON list of records or JSON lines"
    assert err.problems[0].line is None


def test_missing_file(tmp_path):
    assert str(_error(tmp_path / "nope.json")) == f"{tmp_path / 'nope.json'}: no such file"


def test_not_utf8(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes('[{"a": "caf\u00e9"}]'.encode("latin-1"))
    assert (
        str(_error(path))
        == f"{path}:1: encoding: not UTF-8 text (invalid continuation byte at offset 11), expected a JSON or "
        "JSON-lines file"
    )


def test_truncated_list_not_closed(tmp_path):
    text = json.dumps([{"a": 1}, {"b": 2}], indent=2)  # 8 lines, ']' on line 8
    path = _write(tmp_path / "t.json", text[: text.rindex("]")])
    assert (
        str(_error(path)) == f"{path}:8: json: truncated JSON: the list is not closed, expected ']' or another record"
    )
    # records before the cut are yielded before the error
    with pytest.raises(InputError):
        seen = []
        for item in iter_json_records(path):
            seen.append(item)
    assert seen == [(2, 0, {"a": 1}), (5, 1, {"b": 2})]


def test_truncated_after_comma(tmp_path):
    text = json.dumps([{"a": 1}, {"b": 2}], indent=2)
    path = _write(tmp_path / "t.json", text[: text.index("{", 5)])  # '[\n  {\n    "a": 1\n  },\n  '
    assert (
        str(_error(path))
        == f"{path}:5: json: truncated JSON in record 1 (Expecting value, column 3), expected a complete JSON record"
    )


def test_truncated_inside_a_record_between_tokens(tmp_path):
    text = json.dumps([{"a": 1}, {"b": 2, "c": 3}], indent=2)
    path = _write(tmp_path / "t.json", text[: text.index('"c"')])  # cut after '"b": 2,\n    '
    assert str(_error(path)) == (
        f"{path}:7: json: truncated JSON in record 1 (Expecting property name enclosed in double quotes, column 5), "
        "expected a complete JSON record"
    )


def test_truncated_inside_a_string_is_called_truncated(tmp_path):
    text = json.dumps([{"a": "first"}, {"b": "a long string value"}], indent=2)
    path = _write(tmp_path / "t.json", text[: text.index("long")])  # cut mid-string in record 1
    assert str(_error(path)) == (
        f"{path}:6: json: truncated JSON in record 1 (Unterminated string starting at, column 10), expected a complete "
        "JSON record"
    )


def test_missing_comma_between_records(tmp_path):
    path = _write(tmp_path / "t.json", '[\n{"a": 1}\n{"b": 2}\n]\n')
    assert str(_error(path)) == f"{path}:3: json: unexpected '{{' after record 0, expected ',' or ']'"


def test_invalid_record(tmp_path):
    path = _write(tmp_path / "t.json", '[\n{"a": 1},\n{"b": tru},\n{"c": 3}\n]\n')
    assert (
        str(_error(path))
        == f"{path}:3: json: invalid JSON in record 1 (Expecting value, column 7), expected a complete JSON record"
    )


@pytest.mark.parametrize(
    "text, line",
    [
        ('[{"a": 1}] x', 1),
        ('[{"a": 1}][{"b": 2}]\n', 1),
        ('[\n  {"a": 1}\n]{"b": 2}\n', 3),
    ],
)
def test_extra_data_after_closing_bracket(tmp_path, text, line):
    path = _write(tmp_path / "t.json", text)
    assert str(_error(path)) == f"{path}:{line}: json: extra data after the closing ']', expected end of file"


def test_trailing_whitespace_after_list_is_fine(tmp_path):
    path = _write(tmp_path / "t.json", '[{"a": 1}]\n\n   \n')
    assert list(iter_json_records(path)) == [(1, 0, {"a": 1})]


# --------------------------------------------------------------------------- output folders


def test_atomic_output_dir_refuses_existing_folder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(InputError) as info:
        with atomic_output_dir(out):
            pytest.fail("the block must not run")
    assert str(info.value) == f"{out}: output folder already exists; choose a new folder (nothing was written)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "mine"


def test_atomic_output_dir_refuses_existing_file(tmp_path):
    out = tmp_path / "out"
    out.write_text("x")
    with pytest.raises(InputError):
        with atomic_output_dir(out):
            pass
    assert out.read_text() == "x"


def test_atomic_output_dir_leaves_nothing_when_block_raises(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_output_dir(out) as tmp:
            assert tmp.parent == tmp_path and tmp.name.startswith(".out.tmp-") and tmp.is_dir()
            (tmp / "part.jsonl").write_text("half")
            (tmp / "sub").mkdir()
            raise RuntimeError("boom")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_output_dir_publishes_whole_folder(tmp_path):
    out = tmp_path / "a" / "b" / "out"  # parents are created
    with atomic_output_dir(out) as tmp:
        (tmp / "f.txt").write_text("done")
        assert not out.exists()
    assert (out / "f.txt").read_text() == "done"
    assert [p.name for p in out.parent.iterdir()] == ["out"]


# --------------------------------------------------------------------------- writing


def test_write_jsonl_canonical_bytes(tmp_path):
    path = tmp_path / "r.jsonl"
    records = [{"b": 1, "a": "caf\u00e9 \u201cq\u201d"}, [1, 2.5, None, True], "line\nbreak", {"k": {"z": [], "y": {}}}]
    assert write_jsonl(path, iter(records)) == 4
    assert path.read_bytes() == (
        b'{"b":1,"a":"caf\xc3\xa9 \xe2\x80\x9cq\xe2\x80\x9d"}\n'
        b"[1,2.5,null,true]\n"
        b'"line\\nbreak"\n'
        b'{"k":{"z":[],"y":{}}}\n'
    )
    assert [obj for _, obj in iter_jsonl(path)] == records
    assert write_jsonl(tmp_path / "none.jsonl", []) == 0
    assert (tmp_path / "none.jsonl").read_bytes() == b""


def test_dumps_line_keeps_key_order_and_unicode():
    assert dumps_line({"z": "\u00fc", "a": [1, {"y": 2, "x": 1}]}) == '{"z":"\u00fc","a":[1,{"y":2,"x":1}]}'


def test_write_json_sorted_pretty_with_final_newline(tmp_path):
    path = tmp_path / "m.json"
    write_json(path, {"b": {"d": 1, "c": "\u00e9"}, "a": [1]})
    assert path.read_bytes() == b'{\n  "a": [\n    1\n  ],\n  "b": {\n    "c": "\xc3\xa9",\n    "d": 1\n  }\n}\n'


def test_sha256_file(tmp_path):
    path = tmp_path / "x.bin"
    data = bytes(range(256)) * 5000  # 1.28 MB: read in two 1 MiB blocks
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_a_byte_order_mark_is_not_part_of_the_first_record(tmp_path):
    """Windows editors write a UTF-8 BOM; it used to make a JSON list "not one object per line"."""
    listed, lines = tmp_path / "list.json", tmp_path / "lines.jsonl"
    listed.write_bytes('\ufeff[\n  {"a": 1},\n  {"a": 2}\n]\n'.encode())
    lines.write_bytes('\ufeff{"a": 1}\n{"a": 2}\n'.encode())
    assert list(iter_json_records(listed)) == [(2, 0, {"a": 1}), (3, 1, {"a": 2})]
    assert list(iter_json_records(lines)) == [(1, 0, {"a": 1}), (2, 1, {"a": 2})]
    assert list(iter_jsonl(lines)) == [(1, {"a": 1}), (2, {"a": 2})]


def test_a_folder_given_as_a_file_is_named_as_a_folder(tmp_path):
    for read in (iter_jsonl, iter_json_records):
        with pytest.raises(InputError, match=r": is a folder, expected a file$"):
            list(read(tmp_path))
    with pytest.raises(InputError, match=r": no such file$"):
        list(iter_jsonl(tmp_path / "missing.jsonl"))


def test_a_byte_order_mark_is_accepted_in_manifests_and_configs(hotpot_dev_dir, tmp_path):
    import shutil

    from memsearch.config import load_config
    from memsearch.data.dataset import load_dataset

    data = tmp_path / "data"
    shutil.copytree(hotpot_dev_dir, data)
    manifest = data / "manifest.json"
    manifest.write_bytes(b"\xef\xbb\xbf" + manifest.read_bytes())
    assert len(load_dataset(data).tasks) == 40
    config = tmp_path / "rules.toml"
    config.write_bytes(b"\xef\xbb\xbf" + (Path(__file__).resolve().parents[1] / "configs" / "rules.toml").read_bytes())
    assert load_config(config).agent.memory == "decision"


def test_backoff_is_seeded_full_jitter_under_a_doubling_cap():
    from memsearch.http_client import Backoff

    a, b = Backoff(0.5, 3.0, seed=7), Backoff(0.5, 3.0, seed=7)
    waits = [a.delay_s(retry) for retry in range(1, 7)]
    assert waits == [b.delay_s(retry) for retry in range(1, 7)]  # same seed, same waits
    caps = [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]  # base * 2**(retry-1), capped at max_s
    assert all(0.0 <= w <= cap for w, cap in zip(waits, caps, strict=True))


def test_loop_session_opens_one_pool_per_event_loop():
    import asyncio

    from memsearch.http_client import LoopSession

    pool = LoopSession(4)

    async def use():
        first = pool.get()
        assert pool.get() == first  # the same pool within one loop
        return first[0]

    old = asyncio.run(use())
    new = asyncio.run(use())  # a new loop: the old loop's session is abandoned, a new one opened
    assert new is not old and old.closed and not new.closed
    asyncio.run(pool.aclose())  # from yet another loop: abandoned, not awaited
    assert new.closed
