"""The data commands through the real CLI: data prepare-* -> data validate, error lines and exit
statuses, and a `memsearch --help` that does not import the heavy libraries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsearch.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
HOTPOT_DEV = ROOT / "data" / "samples" / "hotpotqa" / "dev_distractor_sample.json"
HOTPOT_TRAIN = ROOT / "data" / "samples" / "hotpotqa" / "train_sample.json"
MUSIQUE_DEV = ROOT / "data" / "samples" / "musique" / "musique_ans_dev_sample.json"
SCRIPT = Path(sys.executable).parent / "memsearch"
COMMANDS = ("demo", "walkthrough", "data", "retrieval", "eval", "train", "pipeline", "report", "verl")


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def dev20(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "dev20"
    result = invoke("data", "prepare-hotpot", "--input", HOTPOT_DEV, "--split", "dev", "--out", out, "--limit", "20")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote {out}: 20 tasks, 199 documents (hotpotqa dev)\n"
    assert result.stderr == ""
    return out


def test_prepare_hotpot_then_validate(dev20):
    result = invoke("data", "validate", "--data", dev20)
    assert (result.exit_code, result.stdout, result.stderr) == (0, f"{dev20}: valid\n", "")


def test_data_prepare_format_is_each_registered_converter_and_the_old_commands_its_aliases(dev20, tmp_path):
    # `data prepare --format hotpot` writes byte for byte the folder `data prepare-hotpot` wrote
    out = tmp_path / "dev20"
    result = invoke("data", "prepare", "--format", "hotpot", "--input", HOTPOT_DEV, "--split", "dev", "--out", out,
                    "--limit", "20")
    assert (result.exit_code, result.stdout, result.stderr) == (
        0, f"wrote {out}: 20 tasks, 199 documents (hotpotqa dev)\n", "")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in dev20.iterdir()}
    musique = tmp_path / "mq"
    assert invoke("data", "prepare", "--format", "musique", "--input", MUSIQUE_DEV, "--split", "dev", "--out", musique,
                  "--limit", "3").exit_code == 0
    assert json.loads((musique / "manifest.json").read_text())["kind"] == "musique"
    # an unregistered format: one error line naming the registered ones, nothing written
    bad = invoke("data", "prepare", "--format", "squad", "--input", HOTPOT_DEV, "--split", "dev", "--out",
                 tmp_path / "sq")
    assert bad.exit_code == 2 and "'squad'" in bad.stderr and "hotpot" in bad.stderr and "musique" in bad.stderr
    assert not (tmp_path / "sq").exists()
    # the help lists the registered formats with what each reads; the old commands name the new spelling
    assert "Formats: hotpot: HotpotQA" in invoke("data", "prepare", "--help").stdout
    assert "data prepare --format hotpot" in invoke("data", "prepare-hotpot", "--help").stdout


def test_prepare_musique_then_validate(tmp_path):
    out = tmp_path / "mq"
    result = invoke("data", "prepare-musique", "--input", MUSIQUE_DEV, "--split", "dev", "--out", out, "--limit", "10")
    assert result.exit_code == 0, result.output
    n_docs = json.loads((out / "manifest.json").read_text())["counts"]["documents"]
    assert result.stdout == f"wrote {out}: 10 tasks, {n_docs} documents (musique dev)\n"
    assert invoke("data", "validate", "--data", out).exit_code == 0


def test_prepare_ruler_then_validate(dev20, tmp_path):
    out = tmp_path / "ruler"
    result = invoke(
        "data",
        "prepare-ruler",
        "--data",
        dev20,
        "--docs",
        "20,40",
        "--out",
        out,
        "--tokenizer",
        "lexical",
        "--limit",
        "4",
    )
    assert result.exit_code == 0, result.output
    out_lines = result.stdout.splitlines()
    assert len(out_lines) == 2
    for n, line in zip((20, 40), out_lines):
        manifest = json.loads((out / f"docs{n}" / "manifest.json").read_text())
        stats = manifest["context_tokens"]
        assert line == (
            f"{out / f'docs{n}'}: 4 tasks, {manifest['counts']['documents']} documents, context tokens mean "
            f"{stats['mean']} (min {stats['min']}, max {stats['max']}, lexical-v1)"
        )
        assert invoke("data", "validate", "--data", out / f"docs{n}").exit_code == 0


def test_prepare_ruler_bad_docs_and_too_big(dev20, tmp_path):
    result = invoke(
        "data", "prepare-ruler", "--data", dev20, "--docs", "20,x", "--out", tmp_path / "r", "--tokenizer", "none"
    )
    assert (result.exit_code, result.stderr) == (
        2,
        "error: --docs '20,x': expected comma-separated integers, e.g. 50,200,800\n",
    )
    result = invoke(
        "data", "prepare-ruler", "--data", dev20, "--docs", "500", "--out", tmp_path / "r", "--tokenizer", "none"
    )
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: --docs [500]: larger than the dev pool of 199 distinct paragraphs in {dev20}; "
        "prepare more dev examples or choose a smaller N\n"
    )
    assert not (tmp_path / "r").exists()


def test_validate_corrupted_folder_exits_2_with_problem_lines(dev20, tmp_path):
    import shutil

    bad = Path(shutil.copytree(dev20, tmp_path / "bad"))
    tasks = bad / "tasks.jsonl"
    lines = tasks.read_text().splitlines()
    obj = json.loads(lines[2])
    obj["answer"] = "Animorphs"
    lines[2] = json.dumps(obj)
    tasks.write_text("\n".join(lines) + "\n")
    (bad / "corpus.jsonl").write_text((bad / "corpus.jsonl").read_text() + "{oops\n")
    result = invoke("data", "validate", "--data", bad)
    assert result.exit_code == 2
    assert result.stdout == ""
    err = result.stderr.splitlines()
    assert (
        err[0]
        == f"{bad / 'corpus.jsonl'}:200: json: invalid JSON (Expecting property name enclosed in double quotes, "
        "column 2), expected one JSON object per line"
    )
    assert err[1] == (
        f"{tasks}:3: answer: label field in a task, expected tasks to carry only id, question and doc_ids "
        "(labels belong in labels.jsonl)"
    )
    assert err[2].startswith(f"{bad / 'manifest.json'}: files.corpus.jsonl: SHA-256 ")
    assert err[3].startswith(f"{bad / 'manifest.json'}: files.tasks.jsonl: SHA-256 ")
    assert err[4:] == [f"4 problem(s) in {bad}"]


def test_validate_against_overlapping_folder(dev20, tmp_path):
    result = invoke("data", "validate", "--data", dev20, "--against", dev20)
    assert result.exit_code == 2
    err = result.stderr.splitlines()
    assert len(err) == 41 and err[-1] == f"40 problem(s) in {dev20}"
    assert (
        err[0]
        == f"{dev20 / 'tasks.jsonl'}:1: id: '5a8b57f25542995d1e6f1371' also in {dev20 / 'tasks.jsonl'}:1, "
        "expected no id shared between splits"
    )

    train = tmp_path / "train"
    assert invoke("data", "prepare-hotpot", "--input", HOTPOT_TRAIN, "--out", train, "--split", "train").exit_code == 0
    result = invoke("data", "validate", "--data", dev20, "--against", train)
    assert (result.exit_code, result.stdout) == (0, f"{dev20}: valid, no overlap with {train}\n")


def test_validate_missing_folder(tmp_path):
    result = invoke("data", "validate", "--data", tmp_path / "nope")
    assert result.exit_code == 2
    assert result.stderr == (
        f"{tmp_path / 'nope'}: folder: no such folder, expected a folder written by `memsearch prepare-*`\n"
        f"1 problem(s) in {tmp_path / 'nope'}\n"
    )


def test_prepare_into_existing_folder_exits_2(dev20):
    before = {p.name: p.read_bytes() for p in dev20.iterdir()}
    result = invoke("data", "prepare-hotpot", "--input", HOTPOT_DEV, "--split", "dev", "--out", dev20, "--limit", "3")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"error: {dev20}: output folder already exists; choose a new folder (nothing was written)\n"
    assert {p.name: p.read_bytes() for p in dev20.iterdir()} == before
    assert sorted(p.name for p in dev20.parent.iterdir()) == ["dev20"]


def test_prepare_bad_input_exits_2_and_writes_nothing(tmp_path):
    src = tmp_path / "in.json"
    src.write_text(
        '[\n  {"_id": "a", "question": "q?", "answer": "x", "context": [], "supporting_facts": []}\n', encoding="utf-8"
    )
    out = tmp_path / "out"
    result = invoke("data", "prepare-hotpot", "--input", src, "--split", "dev", "--out", out)
    assert result.exit_code == 2
    assert (
        result.stderr
        == f"error: {src}:3: json: truncated JSON: the list is not closed, expected ']' or another record\n"
    )
    src.write_text(
        '[\n  {"_id": "a", "question": "q?", "answer": "x", "context": [], "supporting_facts": []}\n]\n',
        encoding="utf-8",
    )
    result = invoke("data", "prepare-hotpot", "--input", src, "--split", "dev", "--out", out)
    assert (result.exit_code, result.stderr) == (
        2,
        f"error: {src}:2: [0].context: empty, expected at least one paragraph\n",
    )
    result = invoke("data", "prepare-musique", "--input", tmp_path / "missing.json", "--split", "dev", "--out", out)
    assert (result.exit_code, result.stderr) == (2, f"error: {tmp_path / 'missing.json'}: no such file\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.json"]


# --------------------------------------------------------------------------- real processes


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


@pytest.mark.slow  # three interpreter starts: ~3 s idle, more on a busy machine
def test_console_script_prepare_and_validate(tmp_path):
    out = tmp_path / "dev5"
    run = subprocess.run(
        [
            str(SCRIPT),
            "data",
            "prepare-hotpot",
            "--input",
            str(HOTPOT_DEV),
            "--split",
            "dev",
            "--out",
            str(out),
            "--limit",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"wrote {out}: 5 tasks, 50 documents (hotpotqa dev)\n"
    run = subprocess.run(
        [str(SCRIPT), "data", "validate", "--data", str(out)], capture_output=True, text=True, timeout=120, env=_env()
    )
    assert (run.returncode, run.stdout) == (0, f"{out}: valid\n")
    run = subprocess.run(
        [str(SCRIPT), "data", "prepare-hotpot", "--input", str(HOTPOT_DEV), "--split", "dev", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert run.returncode == 2
    assert run.stderr == f"error: {out}: output folder already exists; choose a new folder (nothing was written)\n"
    assert "Traceback" not in run.stderr


def test_console_script_help_lists_commands():
    run = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60, env=_env())
    assert run.returncode == 0, run.stderr
    for command in COMMANDS:
        assert command in run.stdout
    assert "memsearch: data, retrieval and memory for budgeted multi-hop QA agents." in run.stdout


def test_help_does_not_import_heavy_libraries():
    snippet = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "import memsearch.cli.app\n"
        "result = CliRunner().invoke(memsearch.cli.app.app, ['--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "assert 'data' in result.stdout\n"
        "for cmd in ('prepare-hotpot', 'prepare-ruler', 'validate'):\n"
        "    assert CliRunner().invoke(memsearch.cli.app.app, ['data', cmd, '--help']).exit_code == 0\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'bm25s') if m in sys.modules)\n"
        "print('heavy:', heavy)\n"
    )
    run = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60, env=_env())
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "heavy: []"


def test_help_importtime_has_no_heavy_modules():
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import memsearch.cli.app"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert run.returncode == 0, run.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "memsearch.cli.app" in imported
    assert not {m for m in imported if m.split(".")[0] in ("torch", "transformers", "bm25s")}


def test_prepare_needs_a_split_and_refuses_one_the_file_name_contradicts(tmp_path):
    """Converting the official train file without `--split train` used to label it dev, and
    every dev-only safeguard downstream trusts that label."""
    out = tmp_path / "out"
    result = invoke("data", "prepare-hotpot", "--input", HOTPOT_TRAIN, "--out", out)
    assert result.exit_code == 2 and "Missing option '--split'" in result.output
    result = invoke("data", "prepare-hotpot", "--input", HOTPOT_TRAIN, "--split", "dev", "--out", out)
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {HOTPOT_TRAIN}: the file name says 'train' but --split is 'dev'; "
        "expected --split train (or rename the file if the name is wrong)\n"
    )
    result = invoke("data", "prepare-musique", "--input", MUSIQUE_DEV, "--split", "train", "--out", out)
    assert result.exit_code == 2 and "the file name says 'dev' but --split is 'train'" in result.stderr
    assert not out.exists()
    result = invoke("data", "prepare-hotpot", "--input", HOTPOT_TRAIN, "--split", "train", "--out", out, "--limit", "3")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "manifest.json").read_text())["split"] == "train"


# --------------------------------------------------------------------------- Hugging Face layouts

SAMPLES = ROOT / "data" / "samples"


@pytest.mark.slow  # every shipped sample, three layouts each (~20 s)
@pytest.mark.parametrize(
    ("command", "sample", "split"),
    [
        ("prepare-hotpot", SAMPLES / "hotpotqa" / "dev_distractor_sample.json", "dev"),
        ("prepare-hotpot", SAMPLES / "hotpotqa" / "train_extended.json", "train"),
        ("prepare-musique", SAMPLES / "musique" / "musique_ans_dev_sample.json", "dev"),
        ("prepare-musique", SAMPLES / "musique" / "musique_ans_train_sample.json", "train"),
    ],
)
def test_every_shipped_sample_prepares_alike_from_its_hugging_face_layouts(tmp_path, command, sample, split):
    """Each sample rewritten as the Hub stores it (parquet) and as ``Dataset.to_json`` exports it
    (JSON lines) prepares, through the CLI, exactly the data the original file does."""
    from tests.support.hf_layout import (
        hotpot_schema,
        hotpot_to_hf,
        prepared_differences,
        write_json_lines,
        write_parquet,
    )

    records = json.loads(sample.read_text(encoding="utf-8"))
    hotpot = command == "prepare-hotpot"
    rows = [hotpot_to_hf(ex) for ex in records] if hotpot else records
    shard = "validation" if split == "dev" else "train"
    sources = [write_parquet(tmp_path / "hf" / f"{shard}-00000-of-00001.parquet", rows,
                             hotpot_schema() if hotpot else None, row_group_size=100),
               write_json_lines(tmp_path / "hf" / f"{shard}.jsonl", rows)]
    outs = []
    for i, src in enumerate([sample, *sources]):
        outs.append(tmp_path / f"out{i}")
        result = invoke("data", command, "--input", src, "--split", split, "--out", outs[-1])
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith(f"wrote {outs[-1]}: {len(records)} tasks, ")
    for out in outs[1:]:
        assert prepared_differences(out, outs[0]) == []
        assert invoke("data", "validate", "--data", out).exit_code == 0


def test_prepare_from_malformed_parquet_exits_2_naming_file_row_and_field(tmp_path):
    from tests.support.hf_layout import hotpot_schema, hotpot_to_hf, write_parquet

    rows = [hotpot_to_hf(ex) for ex in json.loads(HOTPOT_DEV.read_text(encoding="utf-8"))[:3]]
    rows[2]["question"] = None
    src = write_parquet(tmp_path / "validation-00000-of-00001.parquet", rows, hotpot_schema())
    out = tmp_path / "out"
    result = invoke("data", "prepare-hotpot", "--input", src, "--split", "dev", "--out", out)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == f"error: {src}: [row 2].question: got NoneType None, expected the question string\n"
    assert not out.exists()
