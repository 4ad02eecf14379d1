"""Output safety (issue 26 items 1-3, 18): a command writes only where it may.

`--resume` and a pipeline re-run write only into a folder that command made; `report view` and
`report plots` never replace an existing output without `--force`, nor write through a symlink;
an `--out` no command can create (a dangling symlink, a path under a regular file) is one error
line and exit status 2 in every command that takes one. Real CLI subprocesses against real
folders in tmp_path (stand-ins for a Hugging Face model folder, a data folder, a training run, a
matrix folder and the file system root); every file outside the command's own output is watched.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from memsearch.assets.samples import HOTPOT_DEV, HOTPOT_TRAIN, MUSIQUE_DEV, samples_dir
from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TRAIN_LOG = ROOT / "docs" / "results" / "cpu_grpo_train_log.jsonl"
MARKER = ".memsearch-folder.json"  # on-disk format: spelled out, as tests/eval/test_run_folder.py does
PIPELINES = {"memory-policy": ROOT / "configs" / "memory_policy_cpu.toml",
             "memagent": ROOT / "configs" / "memagent.toml"}


def _refused(result) -> bool:
    """Exit status 2 with an ``error:`` line and no traceback: what bad input must end in."""
    return result.returncode == 2 and "error: " in result.stderr and "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def made(tmp_path_factory, rel):
    """Folders real commands made, made once: an eval run and a matrix (rules backend, 2 tasks) on
    the dev sample, and an eval run on a train split (what `train export-sft` reads)."""
    root = tmp_path_factory.mktemp("made")
    dev, train = root / "dev", root / "train"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_DEV, split="dev", limit=5), dev)
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_TRAIN, split="train", limit=3), train)
    for command, data, out in (("eval", dev, root / "run"), ("matrix", dev, root / "matrix"),
                               ("eval", train, root / "train-run")):
        result = rel.run_cli(rel.cli_args(command, rel.RULES, data, out, 2, []))
        assert result.returncode == 0, result.stderr[-2000:]
    return root


def _victims(root: Path, made: Path) -> dict[str, Path]:
    """Folders no eval or pipeline command made, as a person has them on disk."""
    hf = root / "hf-model"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}) + "\n")
    (hf / "tokenizer.json").write_text('{"version": "1.0"}\n')
    (hf / "model.safetensors").write_bytes(b"\0" * 64)
    train_run = root / "train-run"
    (train_run / "adapter").mkdir(parents=True)
    (train_run / "config.json").write_text(json.dumps({"model": "embedded", "steps": 4}) + "\n")
    (train_run / "summary.json").write_text(json.dumps({"steps": 4, "adapter": "adapter"}) + "\n")
    (train_run / "train_log.jsonl").write_text('{"step": 1, "reward_mean": 0.2}\n')
    (train_run / "adapter" / "adapter_config.json").write_text("{}\n")
    fs_root = root / "fs-root"  # stands in for `/`: never the real one
    for sub in ("bin", "etc", "home/user"):
        (fs_root / sub).mkdir(parents=True)
    (fs_root / "etc" / "hostname").write_text("box\n")
    (root / "empty").mkdir()
    shutil.copytree(made / "dev", root / "data")
    shutil.copytree(made / "matrix", root / "matrix")
    return {p.name: p for p in (hf, train_run, fs_root, root / "empty", root / "data", root / "matrix")}


def test_resume_refuses_every_folder_the_command_did_not_make(made, tmp_path, rel):
    """`eval run --resume` / `eval matrix --resume` used to start a new run inside any folder (a
    model's config.json overwritten, exit 0)."""
    victims = _victims(tmp_path / "victims", made)
    cases = [("eval", name) for name in victims] + [("matrix", name) for name in victims if name != "matrix"]
    results = {}
    for command, name in cases:
        before = rel.tree_state(tmp_path)
        result = rel.run_cli(rel.cli_args(command, rel.RULES, made / "dev", victims[name], 2, [], resume=True))
        outside = rel.changed_paths(before, rel.tree_state(tmp_path))
        rel.LEDGER.record("--resume of a folder it did not make", wrong_exit=int(not _refused(result)),
                          outside=len(outside))
        results[(command, name)] = (result, outside)
    for (command, name), (result, outside) in results.items():
        assert _refused(result), (command, name, result.returncode, result.stderr[-1500:])
        assert outside == [], (command, name, outside)


def test_resume_still_continues_the_folders_the_command_made(made, tmp_path, rel):
    """The other half of the rule: a run or matrix folder of this command (made now, or by an earlier
    version without the marker) is still resumed."""
    for command in ("eval", "matrix"):
        for legacy in (False, True):
            out = tmp_path / f"{command}-{'legacy' if legacy else 'marked'}"
            shutil.copytree(made / ("run" if command == "eval" else "matrix"), out)
            runs = [out] if command == "eval" else sorted(p.parent for p in out.glob("*/run.json"))
            # as if killed: a run with one task of two, a matrix before its last group began
            trajectories = runs[0] / "trajectories.jsonl"
            trajectories.write_text(trajectories.read_text().splitlines(True)[0])
            if command == "matrix":
                shutil.rmtree(runs[-1])
            if legacy:  # as an earlier version left it: no marker anywhere
                for marker in out.rglob(MARKER):
                    marker.unlink()
            result = rel.run_cli(rel.cli_args(command, rel.RULES, made / "dev", out, 2, [], resume=True))
            counts = [rel.lost_and_duplicated(run, rel.task_ids(made / "dev", 2)) for run in runs]
            lost, dup = sum(c[0] for c in counts), sum(c[1] for c in counts)
            rel.LEDGER.record("--resume of its own folder", lost=lost, duplicated=dup,
                              wrong_exit=int(result.returncode != 0))
            assert result.returncode == 0, (command, legacy, result.stderr[-1500:])
            assert all((folder / MARKER).is_file() for folder in {out, *runs})
            assert (lost, dup) == (0, 0) and len(runs) >= (1 if command == "eval" else 2)


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_a_pipeline_refuses_an_existing_folder_it_did_not_make(pipeline, made, tmp_path, rel):
    """`memsearch pipeline ... --out` used to take any existing folder (`/` included) and write its
    invocation record, stages and report.md / report.json / curves.png there."""
    victims = _victims(tmp_path / "victims", made)
    results = {}
    for name, victim in victims.items():
        before = rel.tree_state(tmp_path)
        args = [str(rel.EXE), "pipeline", pipeline, "--config", str(PIPELINES[pipeline]), "--out", str(victim)]
        try:  # a refusal takes seconds; a pipeline that starts writing there trains for many minutes
            result = rel.run_cli(args, timeout=60)
        except subprocess.TimeoutExpired as exc:
            result = subprocess.CompletedProcess(args, None, "", f"still running after {exc.timeout} s")
        outside = rel.changed_paths(before, rel.tree_state(tmp_path))
        rel.LEDGER.record(f"pipeline {pipeline} into a folder it did not make",
                          wrong_exit=int(not _refused(result)), outside=len(outside))
        results[name] = (result, outside)
    for name, (result, outside) in results.items():
        assert _refused(result), (name, result.returncode, result.stderr[-1500:])
        assert outside == [], (name, outside)


def test_report_view_and_plots_never_replace_or_write_through_without_force(made, tmp_path, rel):
    """`report view --out` overwrote an existing file, also through a symlink; `report plots`
    overwrote PNGs and wrote into any folder (`/` included)."""
    victims = _victims(tmp_path / "victims", made)
    mine = tmp_path / "mine.html"
    mine.write_text("<p>my notes</p>\n")
    elsewhere = victims["fs-root"] / "etc" / "hostname"
    (tmp_path / "link.html").symlink_to(elsewhere)
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "reward-results.png").symlink_to(elsewhere)
    view = [str(rel.EXE), "report", "view", str(made / "run"), "--data", str(made / "dev"), "--out"]
    plot = [str(rel.EXE), "report", "plots", "--train-log", str(TRAIN_LOG), "--out"]
    refused = [[*view, str(mine)], [*view, str(tmp_path / "link.html")], [*view, "/"],
               [*plot, str(victims["fs-root"])], [*plot, str(victims["hf-model"])], [*plot, str(plots)]]
    for args in refused:
        before = rel.tree_state(tmp_path)
        result = rel.run_cli(args)
        outside = rel.changed_paths(before, rel.tree_state(tmp_path))
        rel.LEDGER.record("report output exists", wrong_exit=int(not _refused(result)), outside=len(outside))
        assert _refused(result), (args[2], args[-1], result.returncode, result.stderr[-1500:])
        assert outside == [], (args[-1], outside)
    # --force replaces the output itself: a symlink there is replaced, its target left alone.
    for args, output in (([*view, str(tmp_path / "link.html"), "--force"], tmp_path / "link.html"),
                         ([*plot, str(plots), "--force"], plots / "reward-results.png")):
        before = rel.tree_state(tmp_path)
        result = rel.run_cli(args)
        outside = [p for p in rel.changed_paths(before, rel.tree_state(tmp_path))
                   if tmp_path / p not in (output, output.parent)]
        rel.LEDGER.record("report output --force", wrong_exit=int(result.returncode != 0), outside=len(outside))
        assert result.returncode == 0, result.stderr[-1500:]
        assert outside == [] and elsewhere.read_text() == "box\n"
        assert not output.is_symlink() and output.stat().st_size > 1000


def _commands(made: Path, tmp_path: Path) -> dict[str, list[str]]:
    """Every command that takes ``--out`` (but `retrieval build`, issue 26's other part), with
    inputs that are otherwise valid; ``--out`` goes last."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}], "completion": "{}",
                                "source": {"split": "train"}}) + "\n")
    hotpot, musique = samples_dir() / HOTPOT_DEV, samples_dir() / MUSIQUE_DEV
    run, train_run, dev = made / "run", made / "train-run", made / "dev"
    return {
        "data prepare": ["data", "prepare", "--format", "hotpot", "--input", str(hotpot), "--split", "dev",
                         "--limit", "3"],
        "data prepare-hotpot": ["data", "prepare-hotpot", "--input", str(hotpot), "--split", "dev", "--limit", "3"],
        "data prepare-musique": ["data", "prepare-musique", "--input", str(musique), "--split", "dev", "--limit", "3"],
        "data prepare-ruler": ["data", "prepare-ruler", "--data", str(dev), "--docs", "10", "--limit", "2",
                               "--tokenizer", "lexical"],
        "eval run": ["eval", "run", "--config", str(ROOT / "configs" / "rules.toml"), "--data", str(dev),
                     "--limit", "2"],
        "eval run --resume": ["eval", "run", "--config", str(ROOT / "configs" / "rules.toml"), "--data", str(dev),
                              "--limit", "2", "--resume"],
        "eval matrix": ["eval", "matrix", "--config", str(ROOT / "configs" / "rules.toml"), "--data", str(dev),
                        "--limit", "2"],
        "train export-sft": ["train", "export-sft", "--trajectories", str(train_run / "trajectories.jsonl"),
                             "--metrics", str(train_run / "metrics.jsonl"), "--role", "memory"],
        "train sft": ["train", "sft", "--config", str(ROOT / "configs" / "train" / "sft_cpu.toml"),
                      "--set", f"data={json.dumps([str(rows)])}"],
        "train grpo": ["train", "grpo", "--config", str(ROOT / "configs" / "train" / "grpo_cpu.toml"),
                       "--set", f"data={json.dumps(str(made / 'train'))}"],
        "train merge-adapter": ["train", "merge-adapter", "--model", "embedded", "--adapter",
                                str(ROOT / "models" / "memory-policy-cpu")],
        "pipeline memagent": ["pipeline", "memagent", "--config", str(PIPELINES["memagent"])],
        "pipeline memory-policy": ["pipeline", "memory-policy", "--config", str(PIPELINES["memory-policy"])],
        "report view": ["report", "view", str(run), "--data", str(dev)],
        "report plots": ["report", "plots", "--train-log", str(TRAIN_LOG)],
        "verl export-data": ["verl", "export-data", "--data", str(dev)],
        "demo": ["demo", "--backend", "rules", "--limit", "1"],
        "walkthrough": ["walkthrough"],
    }


def test_an_out_no_command_can_create_is_one_error_line_in_every_command(made, tmp_path, rel):
    """A dangling symlink, or a path under a regular file, as `--out` ended in a traceback (or, for
    `report view`, a file written through the link) in most commands."""
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere" / "target")
    regular = tmp_path / "notes.txt"
    regular.write_text("mine\n")
    failures = []
    for name, args in _commands(made, tmp_path).items():
        for out in (dangling, dangling / "sub", regular / "sub"):
            before = rel.tree_state(tmp_path)
            result = rel.run_cli([str(rel.EXE), *args, "--out", str(out)], timeout=300)
            outside = rel.changed_paths(before, rel.tree_state(tmp_path))
            errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
            ok = _refused(result) and len(errors) == 1 and str(out) in errors[0]
            rel.LEDGER.record("unusable --out", wrong_exit=int(not ok), outside=len(outside))
            if not ok or outside:
                failures.append((name, out.relative_to(tmp_path), result.returncode, outside, result.stderr[-400:]))
    assert failures == []
