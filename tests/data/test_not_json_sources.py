"""A data file that is not JSON at all (issue 62: an HTML page saved where a HotpotQA file was
expected) is named for what it is and what its reader expected of it: a JSON array or JSON lines
for a ``.json`` file, JSON lines for a ``.jsonl`` one, with file and line; through the converter
and the CLI (exit 2, one ``error:`` line, nothing written). A file that is JSON lines keeps its
line-level wording."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsearch.cli.app import app
from memsearch.data.hotpot import convert_hotpot
from memsearch.errors import InputError
from memsearch.io import iter_json_records

PAGE = "\n<!DOCTYPE html>\n<html><head><title>Sign in</title></head>\n<body>Please sign in</body></html>\n"
LINES = "JSON lines: one JSON object per line"
ARRAY_OR_LINES = "a JSON array of records ('[' first) or JSON lines (one JSON object per line)"


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("hotpot_dev.json", PAGE, f"2: json: not JSON (starts '<!DOCTYPE html> <html><head><title>Sign in</title></head> "
     f"<body>Please sign in</'), expected {ARRAY_OR_LINES}"),  # the first 80 characters
    ("dev.jsonl", "Not Found\n", f"1: json: not JSON (starts 'Not Found'), expected {LINES}"),
    ("dev.jsonl.gz", "oops {}\n", f"1: json: not JSON (starts 'oops {{}}'), expected {LINES}"),
    # JSON lines whose second line is bad: the line-level wording stays.
    ("dev.json", '{"a": 1}\n<html>\n', "2: json: invalid JSON (Expecting value, column 1), expected one JSON object "
     "per line"),
    # Its first record starts like one (an object) and is cut: a JSON-lines problem, said as such.
    ("dev.json", '{"a": \n', "1: json: invalid JSON (Expecting value, column 7), expected one JSON object per line"),
])
def test_a_file_that_is_not_json_says_what_its_reader_expected(tmp_path, name, text, expected):
    path = tmp_path / name
    data = text.encode()
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(InputError) as info:
        list(iter_json_records(path))
    assert str(info.value) == f"{path}:{expected}"


def test_the_converter_and_the_cli_name_the_file_and_line(tmp_path):
    path = tmp_path / "hotpot_dev_distractor_v1.json"
    path.write_text(PAGE, encoding="utf-8")
    with pytest.raises(InputError, match=rf"^{path}:2: json: not JSON \(starts '<!DOCTYPE html>"):
        convert_hotpot(path, split="dev")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["data", "prepare-hotpot", "--input", str(path), "--split", "dev", "--out",
                                      str(out)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: {path}:2: json: not JSON (starts '<!DOCTYPE html> <html><head><title>Sign in</title></head> "
        f"<body>Please sign in</'), expected {ARRAY_OR_LINES}"]
    assert not Path(out).exists()
