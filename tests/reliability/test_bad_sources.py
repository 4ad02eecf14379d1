"""Bad source files (issue 54) through real `memsearch data` processes: every one is refused with
exit status 2, one located ``error:`` line per problem naming the file and field, no traceback
and no output folder; a gzip source converts to the same bytes as the plain file. Variants of
each class are generated from the shipped samples; file kinds (a FIFO, a symlink loop,
/dev/null, /dev/zero) must be named for what they are and never block the command."""

from __future__ import annotations

import copy
import gzip
import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]
HOTPOT = json.loads((ROOT / "data" / "samples" / "hotpotqa" / "dev_distractor_sample.json").read_text("utf-8"))[:3]
MUSIQUE = json.loads((ROOT / "data" / "samples" / "musique" / "musique_ans_dev_sample.json").read_text("utf-8"))[:3]


def _prepare(rel, kind: str, source: Path, out: Path):
    return rel.run_cli([str(rel.EXE), "data", f"prepare-{kind}", "--input", str(source), "--split", "dev",
                        "--out", str(out)], timeout=60)


def _check(rel, scenario: str, proc, out: Path, expect_rc: int, *needles: str) -> None:
    """Record the run, then assert: the exit status, no traceback, the located message, and no
    folder (nor a temporary one) left behind by a refusal."""
    wrong = proc.returncode != expect_rc or "Traceback" in proc.stderr
    rel.LEDGER.record(scenario, runs=1, wrong_exit=int(wrong))
    assert proc.returncode == expect_rc, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr[-2000:])
    if expect_rc == 2:
        assert not out.exists() and not list(out.parent.glob(f".{out.name}.tmp-*"))


def _dump(path: Path, records: list, layout: str) -> Path:
    text = json.dumps(records, indent=1) if layout == "list" else "".join(json.dumps(r) + "\n" for r in records)
    path.write_text(text, encoding="utf-8")
    return path


def _variants() -> list[tuple[str, str, list, str]]:
    """(scenario, converter, records, the field the refusal names) for each class, two variants each."""
    out = []
    for first in (True, False):  # a decoy under a gold title, before or after the gold paragraph
        recs = copy.deepcopy(HOTPOT)
        title = recs[1]["supporting_facts"][0][0]
        recs[1]["context"].insert(0 if first else len(recs[1]["context"]), [title, [" A decoy."] * 6])
        out.append(("bad source: duplicate title", "hotpot", recs, "[1].supporting_facts[0]: title"))
    for blank in ("", " \u200b"):
        recs = copy.deepcopy(HOTPOT)
        recs[2]["answer"] = blank
        out.append(("bad source: blank gold answer", "hotpot", recs, "[2].answer: got"))
        recs = copy.deepcopy(MUSIQUE)
        recs[0]["answer_aliases"] = [blank]
        out.append(("bad source: blank gold answer", "musique", recs, "[0].answer_aliases[0]: got"))
    recs = copy.deepcopy(HOTPOT)
    recs[0]["context"][3][1][1] = "x\udbff"
    out.append(("bad source: lone surrogate", "hotpot", recs, "[0].context[3][1][1]: lone surrogate escape '\\udbff'"))
    recs = copy.deepcopy(MUSIQUE)
    recs[2]["question_decomposition"][0]["answer"] = "\udc80"
    out.append(("bad source: lone surrogate", "musique", recs,
                "[2].question_decomposition[0].answer: lone surrogate escape '\\udc80'"))
    recs = copy.deepcopy(HOTPOT)
    recs[1]["context"][2][1] = ["\u200b", " "]
    out.append(("bad source: paragraph the loader refuses", "hotpot", recs, "[1].context[2].sentences: every"))
    recs = copy.deepcopy(MUSIQUE)
    recs[1]["paragraphs"][4]["paragraph_text"] = ""
    out.append(("bad source: paragraph the loader refuses", "musique", recs, "[1].paragraphs[4].paragraph_text: got"))
    return out


@pytest.mark.parametrize("layout", ["list", "lines"])
@pytest.mark.parametrize("case", range(len(_variants())))
def test_bad_record_is_refused_with_file_and_field(rel, tmp_path, case, layout):
    scenario, kind, records, field = _variants()[case]
    source, out = _dump(tmp_path / "src.json", records, layout), tmp_path / "deep" / "out"
    proc = _prepare(rel, kind, source, out)
    _check(rel, scenario, proc, out, 2, f"error: {source}:", f": {field}")
    assert not (tmp_path / "deep").exists(), "a parent folder was made for a refused conversion"


@pytest.mark.parametrize("value", ["8" * 5_000, "[" * 5_000 + "]" * 5_000])
def test_huge_number_or_deep_nesting_is_refused(rel, tmp_path, value):
    source, out = tmp_path / "src.jsonl", tmp_path / "out"
    lines = [json.dumps(r) for r in HOTPOT]
    lines[1] = lines[1][:-1] + f', "extra": {value}}}'
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = _prepare(rel, "hotpot", source, out)
    _check(rel, "bad source: huge number or deep nesting", proc, out, 2, f"error: {source}:2: json: ")


@pytest.mark.parametrize("kind", ["fifo", "symlink loop", "/dev/null", "/dev/zero"])
def test_source_that_is_not_a_regular_file_is_named(rel, tmp_path, kind):
    source, out = tmp_path / "src.json", tmp_path / "out"
    if kind == "fifo":
        os.mkfifo(source)
    elif kind == "symlink loop":
        source.symlink_to(source)
    else:
        source.symlink_to(kind)
    proc = _prepare(rel, "hotpot", source, out)  # returns at once: the kind is asked before any open
    what = {"fifo": "a named pipe (FIFO)", "symlink loop": "a symlink loop"}.get(kind, "a character device")
    _check(rel, "bad source: not a regular file", proc, out, 2, f"error: {source}: {what}")
    assert "no such file" not in proc.stderr


def test_gzip_source_converts_to_the_same_bytes(rel, tmp_path):
    plain = _dump(tmp_path / "dev.json", HOTPOT, "list")
    folders = {}
    for name in ("dev.json", "dev.json.gz", "dev-renamed.json"):
        source = tmp_path / name
        if name != "dev.json":
            source.write_bytes(gzip.compress(plain.read_bytes()))
        out = tmp_path / f"out-{name}"
        _check(rel, "gzip source", _prepare(rel, "hotpot", source, out), out, 0)
        folders[name] = [(out / f).read_bytes() for f in ("corpus.jsonl", "tasks.jsonl", "labels.jsonl")]
    assert folders["dev.json.gz"] == folders["dev.json"] == folders["dev-renamed.json"]
