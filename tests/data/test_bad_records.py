"""Issue 54's data classes through the real CLI (typer's CliRunner, as tests/cli do): every bad
source record is refused with exit status 2, the file, line and field in the message and no
output folder; a record the converter accepts is one the loader and `data validate` accept.
Each class is checked on generated variants (hypothesis) of real records from the samples."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from memsearch.cli.app import app
from memsearch.data.dataset import load_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.data.validate import validate_data

ROOT = Path(__file__).resolve().parents[2]
HOTPOT = json.loads((ROOT / "data" / "samples" / "hotpotqa" / "dev_distractor_sample.json").read_text("utf-8"))[:4]
MUSIQUE = json.loads((ROOT / "data" / "samples" / "musique" / "musique_ans_dev_sample.json").read_text("utf-8"))[:4]
BLANKS = ["", " ", "\t\n", "\u200b", "\ufeff\u2060", "\u3000"]
HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


def prepare(kind: str, source: Path, out: Path):
    result = CliRunner().invoke(app, ["data", f"prepare-{kind}", "--input", str(source), "--split", "dev",
                                      "--out", str(out)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def write(path: Path, records: list, layout: str = "list") -> Path:
    """Records as the issue's reporter wrote them: ``json.dumps`` (ensure_ascii escapes a lone
    surrogate as "\\udXXX"), as a pretty JSON list or as JSON lines."""
    if layout == "list":
        path.write_text(json.dumps(records, indent=1), encoding="utf-8")
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def start_line(path: Path, index: int, layout: str) -> int:
    if layout == "lines":
        return index + 1
    lines = path.read_text("utf-8").split("\n")
    return [n for n, line in enumerate(lines, start=1) if line == " {"][index]


def assert_refused(result, out: Path, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.tmp-*")), "an output folder was left"


def assert_loadable(result, out: Path) -> None:
    """Accepted means usable: the loader and the validator accept what was written."""
    assert result.exit_code == 0, result.stderr
    load_dataset(out)
    assert validate_data(out) == []


# ----------------------------------------------------------------------------- 2. duplicate titles


@settings(max_examples=25, deadline=None, suppress_health_check=HEALTH)
@given(which=st.integers(0, 3), fact=st.integers(0, 9), decoy_len=st.integers(1, 8), first=st.booleans(),
       layout=st.sampled_from(["list", "lines"]))
def test_a_title_naming_two_paragraphs_is_refused(tmp_path_factory, which, fact, decoy_len, first, layout):
    """A decoy under a supporting fact's title, before or after the gold paragraph, shorter or
    longer than the fact's index: never silently gold, always the record, title and duplicate."""
    tmp = tmp_path_factory.mktemp("dup")
    records = copy.deepcopy(HOTPOT)
    rec = records[which]
    title, _ = rec["supporting_facts"][fact % len(rec["supporting_facts"])]
    decoy = [title, [f" Decoy sentence {k}." for k in range(decoy_len)]]
    rec["context"].insert(0 if first else len(rec["context"]), decoy)
    source, out = write(tmp / "dup.json", records, layout), tmp / "out"
    result = prepare("hotpot", source, out)
    gold = next(i for i, (t, s) in enumerate(rec["context"]) if t == title and s != decoy[1])
    decoy_at = 0 if first else len(rec["context"]) - 1
    positions = " and ".join(f"context[{i}]" for i in sorted((gold, decoy_at)))
    assert_refused(result, out, f"{source}:{start_line(source, which, layout)}: [{which}].supporting_facts[",
                   f"title {title!r} names 2 different paragraphs ({positions}: a duplicate title)")


def test_the_same_paragraph_twice_is_one_document(tmp_path):
    records = copy.deepcopy(HOTPOT)
    records[1]["context"].append(copy.deepcopy(records[1]["context"][0]))
    out = tmp_path / "out"
    result = prepare("hotpot", write(tmp_path / "same.json", records), out)
    assert_loadable(result, out)
    assert len(load_dataset(out).tasks[1].doc_ids) == len(records[1]["context"]) - 1


# ----------------------------------------------------------------------------- 3. never scorable


@pytest.mark.parametrize("blank", BLANKS)
@pytest.mark.parametrize("layout", ["list", "lines"])
def test_a_blank_gold_answer_is_refused(tmp_path, blank, layout):
    hot, mus = copy.deepcopy(HOTPOT), copy.deepcopy(MUSIQUE)
    hot[2]["answer"] = blank
    mus[1]["answer"] = blank
    mus[3]["answer_aliases"] = ["fine", blank]
    for kind, records, fields in (("hotpot", hot, [(2, "answer")]),
                                  ("musique", mus, [(1, "answer"), (3, "answer_aliases[1]")])):
        source, out = write(tmp_path / f"{kind}.json", records, layout), tmp_path / f"{kind}-out"
        result = prepare(kind, source, out)
        assert_refused(result, out, *(f"{source}:{start_line(source, i, layout)}: [{i}].{field}: got {blank!r}: "
                                      "no visible text, expected" for i, field in fields))


def test_unanswerable_musique_records_are_skipped_and_counted(tmp_path):
    records = copy.deepcopy(MUSIQUE)
    for rec in records[1:3]:
        rec["answerable"] = False
        rec["answer"] = ""  # unanswerable records of MuSiQue-Full carry no answer: not a problem, skipped
    records[0]["answerable"] = True
    out = tmp_path / "out"
    result = prepare("musique", write(tmp_path / "full.json", records), out)
    assert_loadable(result, out)
    assert result.stdout.strip().endswith("skipped 2 record(s) with answerable: false (no answer to score)")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["skipped"] == {"answerable: false": 2} and manifest["counts"]["tasks"] == 2
    assert {t.id for t in load_dataset(out).tasks} == {records[0]["id"], records[3]["id"]}

    for rec in records:
        rec["answerable"] = False
    source, out = write(tmp_path / "none.json", records), tmp_path / "none"
    assert_refused(prepare("musique", source, out), out,
                   f"{source}: file: no examples: 4 skipped (answerable: false), expected at least one record")
    records[2]["answerable"] = "no"
    source, out = write(tmp_path / "bad.json", records), tmp_path / "bad"
    assert_refused(prepare("musique", source, out), out, "[2].answerable: got 'no', expected true or false")


# ----------------------------------------------------------------------------- 4. lone surrogates


def _string_paths(obj, path=()):
    if isinstance(obj, str):
        yield path
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _string_paths(value, (*path, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _string_paths(value, (*path, i))


def _field_name(path) -> str:
    name = ""
    for part in path:
        name += (f".{part}" if name else part) if isinstance(part, str) else f"[{part}]"
    return name


@settings(max_examples=30, deadline=None, suppress_health_check=HEALTH)
@given(kind=st.sampled_from(["hotpot", "musique"]), which=st.integers(0, 3), pick=st.integers(0, 10**6),
       surrogate=st.integers(0xD800, 0xDFFF), layout=st.sampled_from(["list", "lines"]))
def test_a_lone_surrogate_in_any_text_field_is_refused(tmp_path_factory, kind, which, pick, surrogate, layout):
    tmp = tmp_path_factory.mktemp("sur")
    records = copy.deepcopy(HOTPOT if kind == "hotpot" else MUSIQUE)
    paths = list(_string_paths(records[which]))
    path = paths[pick % len(paths)]
    node = records[which]
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = node[path[-1]][:3] + chr(surrogate) + node[path[-1]][3:]
    source, out = write(tmp / "s.json", records, layout), tmp / "out"
    assert_refused(prepare(kind, source, out), out,
                   f"{source}:{start_line(source, which, layout)}: [{which}].{_field_name(path)}: lone surrogate "
                   f"escape '\\u{surrogate:04x}'")


def test_every_jsonl_reader_refuses_a_lone_surrogate(tmp_path):
    out = tmp_path / "out"
    assert prepare("hotpot", write(tmp_path / "ok.json", HOTPOT), out).exit_code == 0
    corpus = out / "corpus.jsonl"
    lines = corpus.read_text("utf-8").split("\n")
    lines[2] = lines[2].replace('"title":"', '"title":"\\udfff', 1)
    corpus.write_text("\n".join(lines), encoding="utf-8")
    result = CliRunner().invoke(app, ["data", "validate", "--data", str(out)])
    assert result.exit_code == 2 and f"{corpus}:3: title: lone surrogate escape '\\udfff'" in result.stderr


# ----------------------------------------------------------------------------- 5. written but unloadable

MUTATIONS = ["blank paragraph", "reversed context pair", "reversed fact pair", "fact on a blank sentence",
             "empty id", "blank sentence kept", "musique empty text", "musique blank text",
             "musique duplicate paragraph", "hf reversed lists"]


def _mutate(kind: str, rec: dict, mutation: str, k: int, blank: str) -> str | None:
    """Apply ``mutation``; the field the refusal must name (None: the record stays valid)."""
    if kind == "musique":
        i = k % len(rec["paragraphs"])
        if mutation == "musique duplicate paragraph":
            rec["paragraphs"].append(copy.deepcopy(rec["paragraphs"][i]))
            return None
        rec["paragraphs"][i]["paragraph_text"] = "" if mutation == "musique empty text" else blank
        return f"paragraphs[{i}].paragraph_text"
    i = k % len(rec["context"])
    title, sentences = rec["context"][i]
    if mutation == "blank paragraph":
        rec["context"][i][1] = [blank] * (1 + k % 3)
        return f"context[{i}].sentences"
    if mutation == "reversed context pair":
        rec["context"][i] = [sentences[0], title]
        return f"context[{i}].sentences" if isinstance(title, str) else f"context[{i}].title"
    if mutation == "reversed fact pair":
        j = k % len(rec["supporting_facts"])
        rec["supporting_facts"][j] = rec["supporting_facts"][j][::-1]
        return f"supporting_facts[{j}]"
    if mutation == "fact on a blank sentence":
        t, s = rec["supporting_facts"][0]
        para = next(p for p in rec["context"] if p[0] == t)
        para[1][s] = blank
        return "supporting_facts[0]" if any(x.strip("\u200b\ufeff\u2060 \t\n\u3000") for x in para[1]) \
            else f"context[{rec['context'].index(para)}].sentences"
    if mutation == "empty id":
        rec["_id"] = ""
        return "_id"
    if mutation == "blank sentence kept":  # one blank sentence among others is real HotpotQA: kept
        rec["context"][i][1] = [*sentences, blank]
        return None
    if mutation == "hf reversed lists":
        rec["context"] = {"title": [s for _, s in rec["context"]], "sentences": [t for t, _ in rec["context"]]}
        return "context[0].title"
    raise AssertionError(mutation)


@settings(max_examples=40, deadline=None, suppress_health_check=HEALTH)
@given(mutation=st.sampled_from(MUTATIONS), which=st.integers(0, 3), k=st.integers(0, 50),
       blank=st.sampled_from(BLANKS), layout=st.sampled_from(["list", "lines"]))
def test_what_the_converter_writes_the_loader_reads(tmp_path_factory, mutation, which, k, blank, layout):
    """Refused at conversion with file, line and field, or written and then loadable and valid:
    never a folder the loader rejects."""
    tmp = tmp_path_factory.mktemp("mut")
    kind = "musique" if mutation.startswith("musique") else "hotpot"
    records = copy.deepcopy(MUSIQUE if kind == "musique" else HOTPOT)
    field = _mutate(kind, records[which], mutation, k, blank)
    source, out = write(tmp / "m.json", records, layout), tmp / "out"
    result = prepare(kind, source, out)
    if field is None:
        assert_loadable(result, out)
    else:
        assert_refused(result, out, f"{source}:{start_line(source, which, layout)}: [{which}].{field}: ")


# ----------------------------------------------------------------------------- 6. what JSON decoding cannot take


@pytest.mark.parametrize("layout", ["list", "lines"])
@pytest.mark.parametrize("value, what", [("7" * 5_000, "more than 4300 digits"),
                                         ("[" * 5_000 + "]" * 5_000, "nested deeper than can be decoded")])
def test_huge_number_or_deep_nesting_in_a_source(tmp_path, layout, value, what):
    source, out = write(tmp_path / "h.json", HOTPOT, layout), tmp_path / "out"
    text = source.read_text("utf-8")
    at = text.index('"level"', text.index(HOTPOT[2]["_id"]))
    source.write_text(text[:at] + f'"extra": {value}, ' + text[at:], encoding="utf-8")
    line = start_line(source, 2, layout) if layout == "lines" else text[:at].count("\n") + 1
    assert_refused(prepare("hotpot", source, out), out, f"{source}:", what)
    if layout == "lines":
        assert f"{source}:{line}: json: " in prepare("hotpot", source, out).stderr


# ----------------------------------------------------------------------------- 7. file kinds and gzip


def test_gzip_sources_convert_as_the_plain_file(tmp_path):
    plain = write(tmp_path / "dev.json", HOTPOT)
    folders = {}
    for name, data in (("plain", plain.read_bytes()), ("dev.json.gz", gzip.compress(plain.read_bytes())),
                       ("renamed.json", gzip.compress(plain.read_bytes())),
                       ("lines.jsonl.gz", gzip.compress("".join(json.dumps(r) + "\n" for r in HOTPOT).encode()))):
        source = plain if name == "plain" else tmp_path / name
        source.write_bytes(data)
        out = tmp_path / f"out-{name}"
        assert prepare("hotpot", source, out).exit_code == 0
        folders[name] = {f: (out / f).read_bytes() for f in ("corpus.jsonl", "tasks.jsonl", "labels.jsonl")}
    assert all(files == folders["plain"] for files in folders.values())


@pytest.mark.parametrize("kind", ["fifo", "loop", "null", "zero", "dangling"])
@pytest.mark.parametrize("file", ["corpus.jsonl", "manifest.json"])
def test_a_data_file_that_is_not_a_regular_file_is_named(tmp_path, kind, file):
    import os

    out = tmp_path / "data"
    assert prepare("hotpot", write(tmp_path / "ok.json", HOTPOT), out).exit_code == 0
    target = out / file
    target.unlink()
    what = {"fifo": "a named pipe (FIFO)", "loop": "a symlink loop", "null": "a character device",
            "zero": "a character device", "dangling": "a symlink to"}[kind]
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to({"loop": target, "null": "/dev/null", "zero": "/dev/zero", "dangling": out / "gone"}[kind])
    for args in (["data", "validate", "--data", str(out)],
                 ["data", "prepare-ruler", "--data", str(out), "--docs", "10", "--out", str(tmp_path / "r"),
                  "--tokenizer", "none"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, (args, result.stderr)
        assert f"{target}: " in result.stderr and what in result.stderr and "no such file" not in result.stderr
    assert not (tmp_path / "r").exists()


def test_progress_bar_on_request_and_same_result(tmp_path, capsys):
    source = write(tmp_path / "dev.json", HOTPOT)
    quiet = convert_hotpot(source)
    assert capsys.readouterr().err == ""
    shown = convert_hotpot(source, show_progress=True)
    assert f"read {source.name}" in capsys.readouterr().err
    assert (shown.tasks, shown.labels, shown.documents) == (quiet.tasks, quiet.labels, quiet.documents)


@pytest.mark.parametrize("kind", ["fifo", "loop", "null", "file"])
def test_a_data_folder_that_is_not_a_folder_is_named(tmp_path, kind):
    import os

    data = tmp_path / "data"
    make = {"fifo": lambda: os.mkfifo(data), "loop": lambda: data.symlink_to(data),
            "null": lambda: data.symlink_to("/dev/null"), "file": lambda: data.write_text("{}")}
    make[kind]()
    what = {"fifo": "a named pipe (FIFO)", "loop": "a symlink loop", "null": "a character device",
            "file": "is a file"}[kind]
    for args in (["data", "validate", "--data", str(data)],
                 ["data", "prepare-ruler", "--data", str(data), "--docs", "10", "--out", str(tmp_path / "r"),
                  "--tokenizer", "none"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and f"{data}: " in result.stderr and what in result.stderr, result.stderr
        assert "expected a folder written by `memsearch prepare-*`" in result.stderr
    assert not (tmp_path / "r").exists()
