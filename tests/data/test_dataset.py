"""Loading a prepared folder refuses what would make a run's numbers wrong (issue 11 items 1, 3):
a data file edited after prepare (the run's data fingerprint is built from the manifest's
hashes, so an edited file would be scored under the old fingerprint), a repeated task id (scored
twice in every mean) and a task without a label (a crash after a partial run)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.data.dataset import load_dataset
from memsearch.errors import InputError
from memsearch.eval.runner import run_eval
from memsearch.io import iter_jsonl, write_jsonl

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture()
def folder(hotpot_dev_dir, tmp_path):
    out = tmp_path / "data"
    shutil.copytree(hotpot_dev_dir, out)
    return out


def _records(path):
    return [obj for _, obj in iter_jsonl(path)]


def _message(exc: pytest.ExceptionInfo) -> str:
    return str(exc.value)


def test_edited_labels_are_refused_with_validate_datas_message(folder):
    labels = _records(folder / "labels.jsonl")
    for lab in labels:
        lab["answers"] = ["yes"]
    write_jsonl(folder / "labels.jsonl", labels)
    with pytest.raises(InputError) as exc:
        load_dataset(folder)
    assert "manifest.json: files.labels.jsonl: SHA-256" in _message(exc)
    assert "does not match the file" in _message(exc)


def test_an_edited_folder_is_refused_by_eval_before_a_run_folder_exists(folder, tmp_path):
    cfg = load_config(CONFIGS / "rules.toml", ["limit=2"])
    run_eval(cfg, folder, tmp_path / "run", show_progress=False)
    (folder / "labels.jsonl").write_text(
        (folder / "labels.jsonl").read_text().replace('"answers":["', '"answers":["yes","')
    )
    with pytest.raises(InputError, match="does not match the file"):
        run_eval(cfg, folder, tmp_path / "run2", show_progress=False)
    assert not (tmp_path / "run2").exists()
    with pytest.raises(InputError, match="does not match the file"):
        run_eval(cfg, folder, tmp_path / "run", resume=True, show_progress=False)


def test_duplicate_task_ids_are_refused_naming_both_lines(folder, rewrite_data_file):
    tasks = _records(folder / "tasks.jsonl")
    rewrite_data_file(folder, "tasks.jsonl", [*tasks, tasks[3]])
    with pytest.raises(InputError) as exc:
        load_dataset(folder)
    n = len(tasks) + 1
    assert f"tasks.jsonl:{n}: id: duplicate {tasks[3]['id']!r} (first at line 4)" in _message(exc)


def test_a_task_without_a_label_is_refused(folder, rewrite_data_file):
    labels = _records(folder / "labels.jsonl")
    missing = labels.pop(5)["id"]
    rewrite_data_file(folder, "labels.jsonl", labels)
    with pytest.raises(InputError) as exc:
        load_dataset(folder)
    assert f"tasks.jsonl:6: id: {missing!r} has no label, expected a label per task id" in _message(exc)


def test_a_label_without_a_task_is_refused(folder, rewrite_data_file):
    labels = _records(folder / "labels.jsonl")
    labels.append(dict(labels[0], id="not-a-task"))
    rewrite_data_file(folder, "labels.jsonl", labels)
    with pytest.raises(InputError, match="'not-a-task' has no task"):
        load_dataset(folder)


def test_an_untouched_folder_loads(folder):
    dataset = load_dataset(folder)
    assert len(dataset.tasks) == len(dataset.labels) == 40
    assert json.loads((folder / "manifest.json").read_text())["counts"]["tasks"] == 40
