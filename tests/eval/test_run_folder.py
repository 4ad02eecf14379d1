"""Run folders a person can trust after anything goes wrong (issue 11 items 9, 12-15): nothing is
created before every input is checked, one writer at a time, a full disk ends in one line and
a --resume that finishes the run, and the records name the model that answered."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.errors import InputError, StorageError
from memsearch.eval.matrix import run_matrix
from memsearch.eval.run_folder import RunFolderLock, claim_run_folder, write_record
from memsearch.eval.runner import run_eval
from memsearch.io import iter_jsonl, sha256_file
from memsearch.testing.agent_server import AgentServer

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"
API = ROOT / "configs" / "api.toml"
# The marker's file name is part of the on-disk format (folders made before a rename must still
# resume), so it is spelled out here rather than imported (``test_the_marker_names_its_command``).
MARKER = ".memsearch-folder.json"


def _lines(path: Path) -> list[dict]:
    return [obj for _, obj in iter_jsonl(path)]


def _api(url: str, *extra: str) -> list[str]:
    return [
        'tokenizer="lexical"',
        *[f'backends.{r}.base_url="{url}"' for r in ("memory", "controller", "reader")],
        *extra,
    ]


# ------------------------------------------------------------------ nothing made before checks


@pytest.mark.parametrize(
    "overrides, message",
    [
        (['tokenizer="no/such/tokenizer"'], "tokenizer: 'no/such/tokenizer': no such folder"),
        (['backends.reader.kind="openai"'], "backend kind 'openai' needs base_url"),
        (['backends.memory.kind="oracle"'], "oracle backend refuses a 'dev' split"),
        (['backends.memory.kind="hf"', 'backends.memory.model="no/such/model"'], "no such model folder"),
    ],
)
def test_a_bad_setting_leaves_no_folder_and_the_corrected_command_runs(overrides, message, hotpot_dev_dir, tmp_path):
    out = tmp_path / "run"
    with pytest.raises((InputError, ValueError), match=message):
        run_eval(load_config(RULES, ["limit=2", *overrides]), hotpot_dev_dir, out, show_progress=False)
    assert not out.exists()
    assert run_eval(load_config(RULES, ["limit=2"]), hotpot_dev_dir, out, show_progress=False).complete


def test_matrix_with_bad_data_or_nothing_to_resume_leaves_no_folder(tmp_path):
    out = tmp_path / "matrix"
    with pytest.raises(InputError, match="no such file"):
        run_matrix(load_config(RULES, ["limit=2"]), tmp_path / "no-data", out, show_progress=False)
    assert not out.exists()
    with pytest.raises(InputError, match=r"nothing to resume \(no such folder\)"):
        run_matrix(load_config(RULES, ["limit=2"]), tmp_path / "no-data", out, resume=True, show_progress=False)
    assert not out.exists()


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda out: (out / "run.json").unlink(), "run.json missing"),
        (lambda out: (out / "run.json").write_text(""), "run.json unreadable"),
        (lambda out: (out / "config.json").write_text('{"tokenizer": '), "config.json unreadable"),
    ],
)
def test_resume_of_a_half_made_folder_says_what_is_missing(damage, problem, hotpot_dev_dir, tmp_path):
    out = tmp_path / "run"
    cfg = load_config(RULES, ["limit=2"])
    run_eval(cfg, hotpot_dev_dir, out, show_progress=False)
    damage(out)
    with pytest.raises(InputError) as exc:
        run_eval(cfg, hotpot_dev_dir, out, resume=True, show_progress=False)
    assert str(exc.value).startswith(f"{out}: incomplete run folder ({out}/{problem.split()[0]} {problem.split()[1]}")
    assert str(exc.value).endswith("delete it and start again")


def test_a_folder_killed_before_its_records_were_written_is_started_afresh_by_resume(hotpot_dev_dir, tmp_path):
    """A kill between the mkdir (and its marker) and the records, or between the two records,
    leaves a folder with no trajectory: --resume starts the run there instead of calling the
    folder broken."""
    cfg = load_config(RULES, ["limit=2"])
    straight = run_eval(cfg, hotpot_dev_dir, tmp_path / "straight", show_progress=False)
    for name, leftovers in (("bare", [MARKER]), ("half", [MARKER, "config.json"])):
        out = tmp_path / name
        out.mkdir()
        (out / ".lock").write_text("")
        for record in leftovers:
            shutil.copy(tmp_path / "straight" / record, out / record)
        summary = run_eval(cfg, hotpot_dev_dir, out, resume=True, show_progress=False)
        assert summary.complete and summary.metrics["f1"] == straight.metrics["f1"]
        assert summary.tasks == straight.tasks


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _foreign_folders(root: Path) -> list[Path]:
    """Folders eval did not make (issue 26 item 1): a model (only the config.json that the
    killed-run rule used to take for a half-made run), a training run, an empty folder, another
    tool's folder that happens to hold a config.json and a run.json, and one holding only a
    trajectories.jsonl."""
    model, train_run, empty = root / "model", root / "train-run", root / "empty"
    lookalike, lines = root / "lookalike", root / "lines"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}\n')
    (model / "model.safetensors").write_bytes(b"\0" * 16)
    train_run.mkdir()
    (train_run / "config.json").write_text('{"steps": 4}\n')
    (train_run / "summary.json").write_text('{"adapter": "adapter"}\n')
    empty.mkdir()
    lookalike.mkdir()
    (lookalike / "config.json").write_text('{"lr": 0.1}\n')
    (lookalike / "run.json").write_text('{"id": 3, "status": "done"}\n')
    lines.mkdir()
    (lines / "trajectories.jsonl").write_text('{"task_id": "t1"}\n')
    return [model, train_run, empty, lookalike, lines]


def test_resume_writes_only_into_a_folder_eval_made(hotpot_dev_dir, tmp_path):
    cfg = load_config(RULES, ["limit=2"])
    for folder in _foreign_folders(tmp_path / "foreign"):
        before = _snapshot(folder)
        with pytest.raises(InputError, match=rf"^{folder}: not a folder made by `memsearch eval run`"):
            run_eval(cfg, hotpot_dev_dir, folder, resume=True, show_progress=False)
        assert _snapshot(folder) == before and sorted(p.name for p in folder.iterdir()) == sorted(before)
    matrix = tmp_path / "matrix"
    run_matrix(load_config(RULES, ["limit=1", 'matrix.groups=["A"]']), hotpot_dev_dir, matrix, show_progress=False)
    before = _snapshot(matrix)
    with pytest.raises(InputError, match=r"made by `memsearch eval matrix`, not `memsearch eval run`"):
        run_eval(cfg, hotpot_dev_dir, matrix, resume=True, show_progress=False)
    assert _snapshot(matrix) == before


def test_matrix_resume_writes_only_into_a_folder_matrix_made(hotpot_dev_dir, tmp_path):
    cfg = load_config(RULES, ["limit=1", 'matrix.groups=["A", "B"]'])
    for folder in [*_foreign_folders(tmp_path / "foreign"), hotpot_dev_dir]:
        before = _snapshot(folder)
        with pytest.raises(InputError, match=rf"^{folder}: not a folder made by `memsearch eval matrix`"):
            run_matrix(cfg, hotpot_dev_dir, folder, resume=True, show_progress=False)
        assert _snapshot(folder) == before
    run = tmp_path / "run"
    run_eval(cfg, hotpot_dev_dir, run, show_progress=False)
    with pytest.raises(InputError, match=r"made by `memsearch eval run`, not `memsearch eval matrix`"):
        run_matrix(cfg, hotpot_dev_dir, run, resume=True, show_progress=False)


def test_folders_of_earlier_versions_without_a_marker_still_resume(hotpot_dev_dir, tmp_path):
    """An eval run folder with both records of this very run, and a matrix folder whose group
    folders are such runs, are unambiguous: they resume, and get their marker."""
    cfg = load_config(RULES, ["limit=2", 'matrix.groups=["A", "B"]'])
    run, matrix = tmp_path / "run", tmp_path / "matrix"
    run_eval(cfg, hotpot_dev_dir, run, show_progress=False)
    run_matrix(cfg, hotpot_dev_dir, matrix, show_progress=False)
    shutil.rmtree(matrix / "B")  # the matrix was killed before group B began
    for marker in [*run.rglob(MARKER), *matrix.rglob(MARKER)]:
        marker.unlink()
    (run / "trajectories.jsonl").write_text((run / "trajectories.jsonl").read_text().splitlines(True)[0])
    assert run_eval(cfg, hotpot_dev_dir, run, resume=True, show_progress=False).tasks.scored == 2
    assert run_matrix(cfg, hotpot_dev_dir, matrix, resume=True, show_progress=False)["groups"]["B"]["complete"]
    assert all((folder / MARKER).is_file() for folder in (run, matrix, matrix / "A", matrix / "B"))


def test_the_marker_names_its_command(hotpot_dev_dir, tmp_path):
    from memsearch.eval import run_folder

    run_eval(load_config(RULES, ["limit=1"]), hotpot_dev_dir, tmp_path / "run", show_progress=False)
    assert run_folder.MARKER == MARKER
    assert json.loads((tmp_path / "run" / MARKER).read_text()) == {"made_by": "eval run"}


def test_a_refused_new_matrix_leaves_no_folder(tmp_path, hotpot_dev_dir):
    out = tmp_path / "matrix"
    cfg = load_config(RULES, ["limit=1", 'backends.reader.kind="hf"', 'backends.reader.model="no/such/model"'])
    with pytest.raises(InputError, match="no such model folder"):  # refused by group A's run, inside the matrix
        run_matrix(cfg, hotpot_dev_dir, out, show_progress=False)
    assert not out.exists()


def test_records_are_replaced_whole(tmp_path):
    path = tmp_path / "record.json"
    write_record(path, {"a": 1})
    with pytest.raises(TypeError):
        write_record(path, {"a": object()})  # fails half-way through the dump
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]  # no temporary left behind


# ------------------------------------------------------------------ one writer at a time


def test_a_folder_in_use_is_refused_and_a_racing_create_loses_cleanly(hotpot_dev_dir, tmp_path):
    out = tmp_path / "run"
    cfg = load_config(RULES, ["limit=3"])
    run_eval(cfg, hotpot_dev_dir, out, show_progress=False)
    held = RunFolderLock(out)  # another writer (flock locks are per open file, so this models one)
    try:
        with pytest.raises(InputError, match=r"another memsearch process \(pid \d+\) is writing this run folder"):
            run_eval(cfg, hotpot_dev_dir, out, resume=True, show_progress=False)
    finally:
        held.release()
    assert run_eval(cfg, hotpot_dev_dir, out, resume=True, show_progress=False).complete
    # Created by someone else between the check and the mkdir: a message, not a FileExistsError.
    with pytest.raises(InputError, match="another process just created it"):
        claim_run_folder(out, False, {}, {})


def test_duplicate_task_lines_are_reported_not_taken_silently(hotpot_dev_dir, tmp_path):
    out = tmp_path / "run"
    cfg = load_config(RULES, ["limit=3"])
    run_eval(cfg, hotpot_dev_dir, out, show_progress=False)
    traj = out / "trajectories.jsonl"
    lines = traj.read_text().splitlines(keepends=True)
    traj.write_text("".join(lines + lines[:1]))
    with pytest.raises(InputError, match=rf"{traj}:4: task_id: an identical copy of task .* \(first on line 1\): a "
                       "task has one line; remove line 4 "):
        run_eval(cfg, hotpot_dev_dir, out, resume=True, show_progress=False)


# ------------------------------------------------------------------ a full disk (the run itself: tests/reliability)


def test_a_storage_error_is_one_line_naming_the_file():
    from memsearch.eval.run_folder import storage_error

    error = storage_error(OSError(28, "No space left on device"), Path("runs/x/trajectories.jsonl"), 7, 30)
    assert isinstance(error, StorageError)
    assert str(error) == (
        "runs/x/trajectories.jsonl: No space left on device; 7 of 30 task(s) are saved in runs/x; "
        "free space or fix permissions, then run the same command with --resume to continue"
    )
    assert storage_error(OSError(2, "No such file or directory"), Path("x"), 0, 1) is None  # a bug, not the disk


# ------------------------------------------------------------------ records


def test_backend_retry_statistics_reach_the_summary(hotpot_dev_dir, tmp_path):
    with AgentServer(delay_s=0.0, fail_every=5) as server:
        cfg = load_config(
            API,
            _api(
                server.base_url, "limit=6", *[f"backends.{r}.max_retries=3" for r in ("memory", "controller", "reader")]
            ),
        )
        summary = run_eval(cfg, hotpot_dev_dir, tmp_path / "run", show_progress=False)
    (entry,) = summary.backend_stats  # the three roles share one backend
    assert entry["roles"] == ["memory", "controller", "reader"] and entry["name"] == "openai"
    stats = entry["stats"]
    calls = sum(r["policy_calls"] for r in _lines(tmp_path / "run" / "metrics.jsonl"))
    assert stats["requests"] == calls and stats["retries"] > 0
    assert stats["attempts"] == stats["requests"] + stats["retries"]
    assert stats["errors"]["http_5xx"] == stats["retries"] + stats["failed"]


def test_run_json_names_the_model_by_content_and_resume_refuses_another(hotpot_dev_dir, tiny_model_dir, tmp_path):
    from memsearch.assets.embedded import gguf_path

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    overrides = [
        "limit=1",
        'backends.reader.kind="hf"',
        f"backends.reader.model={json.dumps(str(model))}",
        "budgets.answer_tokens=4",
    ]
    cfg = load_config(RULES, overrides)
    out = tmp_path / "run"
    run_eval(cfg, hotpot_dev_dir, out, show_progress=False)
    models = json.loads((out / "run.json").read_text())["models"]
    weights = next(p for p in model.iterdir() if p.suffix == ".safetensors")
    assert models["reader"]["model_files"][weights.name] == sha256_file(weights)
    assert models["memory"] == {"kind": "rules"} and models["tokenizer"] == {"name": cfg.tokenizer}
    embedded = load_config(RULES, ["limit=1", 'backends.memory.kind="hf"'])
    from memsearch.eval.run_folder import model_identity

    assert model_identity(embedded)["memory"]["model_files"] == {gguf_path().name: sha256_file(gguf_path())}
    # Same folder, other weights: the resume is refused instead of mixing two models in one run.
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(weights))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1.0
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(InputError, match="the model identity of reader differs from the run being resumed"):
        run_eval(cfg, hotpot_dev_dir, out, resume=True, show_progress=False)
