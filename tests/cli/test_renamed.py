"""The command tree: `memsearch --help` lists the entry commands and the groups in the order a
user meets them, and every old (now hidden) command name still runs exactly as before, after
one stderr line that says what replaced it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsearch.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
HOTPOT_DEV = ROOT / "data" / "samples" / "hotpotqa" / "dev_distractor_sample.json"
HOTPOT_TRAIN = ROOT / "data" / "samples" / "hotpotqa" / "train_sample.json"
RULES = ROOT / "configs" / "rules.toml"

# old command words -> the command that replaced them
RENAMED = [
    (("prepare-hotpot",), ("data", "prepare-hotpot")),
    (("prepare-musique",), ("data", "prepare-musique")),
    (("prepare-ruler",), ("data", "prepare-ruler")),
    (("validate-data",), ("data", "validate")),
    (("search",), ("retrieval", "search")),
    (("index", "build"), ("retrieval", "build", "--method", "bm25")),
    (("matrix",), ("eval", "matrix")),
    (("export-sft",), ("train", "export-sft")),
    (("merge-adapter",), ("train", "merge-adapter")),
]
GROUPS = {
    "data": ["prepare", "prepare-hotpot", "prepare-musique", "prepare-ruler", "validate"],
    "retrieval": ["build", "search", "serve"],
    "eval": ["run", "matrix"],
    "train": ["export-sft", "sft", "grpo", "merge-adapter"],
    "pipeline": ["memagent", "memory-policy"],
    "experiment": ["run"],
    "report": ["view", "plots"],
    "verl": ["export-data", "config"],
}


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def notice(old: tuple[str, ...], new: tuple[str, ...]) -> str:
    return f"`memsearch {' '.join(old)}` is now `memsearch {' '.join(new)}`\n"


def listed_commands(help_text: str) -> list[str]:
    """The command names of a help page's Commands section, in order."""
    section = help_text.split("Commands:\n", 1)[1]
    return [line.split()[0] for line in section.splitlines() if line.startswith("  ") and not line.startswith("   ")]


def test_root_help_lists_entry_commands_then_groups_in_order():
    result = invoke("--help")
    assert result.exit_code == 0, result.output
    assert listed_commands(result.stdout) == ["demo", "walkthrough", "devices", *GROUPS]


@pytest.mark.parametrize("group", list(GROUPS))
def test_each_group_lists_its_verbs(group):
    result = invoke(group, "--help")
    assert result.exit_code == 0, result.output
    assert listed_commands(result.stdout) == GROUPS[group]


@pytest.mark.parametrize(("old", "new"), RENAMED, ids=[" ".join(o) for o, _ in RENAMED])
def test_old_name_help_says_what_replaced_it(old, new):
    result = invoke(*old, "--help")
    assert result.exit_code == 0, result.output
    assert result.stderr == notice(old, new)
    if old != ("index", "build"):  # the others are the same command: same help page but for the usage line
        replaced = invoke(*new, "--help")
        assert result.stdout.splitlines()[1:] == replaced.stdout.splitlines()[1:]


def _same_output(old_result, new_result, old_path: Path, new_path: Path) -> None:
    assert old_result.exit_code == new_result.exit_code
    assert old_result.stdout.replace(str(old_path), str(new_path)) == new_result.stdout


def _same_files(a: Path, b: Path) -> None:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for name in files:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The same three dev questions prepared by the old and the new command name."""
    base = tmp_path_factory.mktemp("renamed")
    args = ("--input", HOTPOT_DEV, "--split", "dev", "--limit", "3")
    old = invoke("prepare-hotpot", *args, "--out", base / "old")
    new = invoke("data", "prepare-hotpot", *args, "--out", base / "new")
    return base, old, new


def test_prepare_hotpot_and_validate_data_run_as_before(prepared, tmp_path):
    base, old, new = prepared
    assert new.exit_code == 0 and old.stderr == notice(("prepare-hotpot",), ("data", "prepare-hotpot"))
    _same_output(old, new, base / "old", base / "new")
    _same_files(base / "old", base / "new")
    for folder, code in ((base / "new", 0), (tmp_path / "missing", 2)):
        old_check, new_check = invoke("validate-data", "--data", folder), invoke("data", "validate", "--data", folder)
        assert (old_check.exit_code, new_check.exit_code) == (code, code)
        assert old_check.stdout == new_check.stdout
        assert old_check.stderr == notice(("validate-data",), ("data", "validate")) + new_check.stderr


def test_prepare_ruler_and_musique_refusals_are_unchanged(prepared, tmp_path):
    base, _, _ = prepared
    args = (base / "new", "--docs", "20,x", "--out", tmp_path / "r", "--tokenizer", "none")
    old, new = invoke("prepare-ruler", "--input", *args), invoke("data", "prepare-ruler", "--data", *args)
    assert (old.exit_code, new.exit_code) == (2, 2)
    assert new.stderr == "error: --docs '20,x': expected comma-separated integers, e.g. 50,200,800\n"
    assert old.stderr == (notice(("prepare-ruler",), ("data", "prepare-ruler"))
                          + "`--input` of `memsearch data prepare-ruler` is now `--data`\n" + new.stderr)
    args = ("--input", tmp_path / "missing.json", "--split", "dev", "--out", tmp_path / "m")
    old, new = invoke("prepare-musique", *args), invoke("data", "prepare-musique", *args)
    assert (old.exit_code, new.exit_code) == (2, 2)
    assert old.stderr == notice(("prepare-musique",), ("data", "prepare-musique")) + new.stderr


def test_index_build_makes_the_folder_retrieval_build_makes(prepared, tmp_path):
    base, _, _ = prepared
    old = invoke("index", "build", "--data", base / "new", "--out", tmp_path / "old")
    new = invoke("retrieval", "build", "--data", base / "new", "--method", "bm25", "--out", tmp_path / "new")
    assert (old.exit_code, new.exit_code) == (0, 0), old.output + new.output
    assert old.stderr.startswith(notice(("index", "build"), ("retrieval", "build", "--method", "bm25")))
    assert old.stdout.startswith(f"wrote {tmp_path / 'old'}: 30 documents in ")
    assert new.stdout.startswith(f"wrote {tmp_path / 'new'}: bm25 index of 30 documents in ")
    _same_files(tmp_path / "old", tmp_path / "new")

    query = ("Which magazine was started first?", "--index", tmp_path / "new", "-k", "3")
    old, new = invoke("search", *query), invoke("retrieval", "search", *query)
    assert old.exit_code == new.exit_code == 0
    assert old.stdout == new.stdout and new.stdout.startswith("#1  ")
    assert old.stderr == notice(("search",), ("retrieval", "search"))


def test_eval_and_matrix_run_as_before(prepared, tmp_path):
    base, _, _ = prepared
    args = ("--config", RULES, "--data", base / "new", "--limit", "2")
    old = invoke("eval", *args, "--out", tmp_path / "old")
    new = invoke("eval", "run", *args, "--out", tmp_path / "new")
    assert new.exit_code == 0, new.output
    assert old.stderr.startswith(notice(("eval",), ("eval", "run")))
    _same_output(old, new, tmp_path / "old", tmp_path / "new")
    old = invoke("matrix", *args, "--out", tmp_path / "old-m")
    new = invoke("eval", "matrix", *args, "--out", tmp_path / "new-m")
    assert new.exit_code == 0, new.output
    assert old.stderr.startswith(notice(("matrix",), ("eval", "matrix")))
    _same_output(old, new, tmp_path / "old-m", tmp_path / "new-m")


def test_old_eval_keeps_its_usage_errors():
    result = invoke("eval", "--config", RULES)
    assert result.exit_code == 2
    assert result.stderr.startswith(notice(("eval",), ("eval", "run")))
    assert "Missing option '--data'" in result.stderr


def test_export_sft_and_merge_adapter_run_as_before(tmp_path):
    data, run = tmp_path / "train", tmp_path / "run"
    prepare = invoke("data", "prepare-hotpot", "--input", HOTPOT_TRAIN, "--split", "train", "--out", data, "--limit", 3)
    assert prepare.exit_code == 0, prepare.output
    assert invoke("eval", "run", "--config", RULES, "--data", data, "--out", run, "--limit", "2").exit_code == 0
    args = ("--trajectories", run / "trajectories.jsonl", "--metrics", run / "metrics.jsonl", "--role", "memory")
    old = invoke("export-sft", *args, "--out", tmp_path / "old.jsonl")
    new = invoke("train", "export-sft", *args, "--out", tmp_path / "new.jsonl")
    assert new.exit_code == 0, new.output
    assert old.stderr == notice(("export-sft",), ("train", "export-sft"))
    _same_output(old, new, tmp_path / "old.jsonl", tmp_path / "new.jsonl")
    assert (tmp_path / "old.jsonl").read_bytes() == (tmp_path / "new.jsonl").read_bytes()

    args = ("--model", "embedded", "--adapter", tmp_path / "no-adapter", "--out", tmp_path / "merged")
    old, new = invoke("merge-adapter", *args), invoke("train", "merge-adapter", *args)
    assert (old.exit_code, new.exit_code) == (2, 2)
    assert new.stderr == f"error: {tmp_path / 'no-adapter'}: not a LoRA adapter folder (no adapter_config.json)\n"
    assert old.stderr == notice(("merge-adapter",), ("train", "merge-adapter")) + new.stderr


def test_prepare_ruler_takes_its_old_input_flag(prepared, tmp_path):
    base, _, _ = prepared
    args = ("--docs", "20", "--out", tmp_path / "{}", "--tokenizer", "lexical")
    old = invoke("data", "prepare-ruler", "--input", base / "new", *[str(a).format("old") for a in args])
    new = invoke("data", "prepare-ruler", "--data", base / "new", *[str(a).format("new") for a in args])
    assert new.exit_code == 0, new.output
    # then the progress bar
    assert old.stderr.startswith("`--input` of `memsearch data prepare-ruler` is now `--data`\n")
    _same_output(old, new, tmp_path / "old", tmp_path / "new")
    _same_files(tmp_path / "old", tmp_path / "new")
