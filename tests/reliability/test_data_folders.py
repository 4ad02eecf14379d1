"""Damaged and edited data folders are refused before any run folder exists, with exit status 2
and a located message: labels/tasks/corpus edited after `prepare-*` (the manifest's SHA-256 no
longer matches), duplicate task ids, a task without a label, a truncated corpus line."""

from __future__ import annotations

import json
import shutil
import time

import pytest

pytestmark = pytest.mark.reliability

TASKS = 6


def _copy(hotpot_dev_dir, tmp_path, name="data"):
    out = tmp_path / name
    shutil.copytree(hotpot_dev_dir, out)
    return out


def _refused(rel, data, tmp_path, scenario, expect: str, command: str = "eval", resume_of=None):
    """Run the CLI on ``data``: exit 2, ``expect`` in stderr, no traceback, and no run folder
    made (or, with ``resume_of``, that folder unchanged)."""
    out = resume_of or tmp_path / f"run-{command}"
    before = sorted((p.name, p.stat().st_size) for p in out.rglob("*")) if resume_of else None
    started = time.perf_counter()
    proc = rel.run_cli(rel.cli_args(command, rel.RULES, data, out, TASKS, [], resume=resume_of is not None))
    rel.LEDGER.record(scenario, runs=1, wrong_exit=int(proc.returncode != 2), seconds=time.perf_counter() - started)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1000:], proc.stderr[-2000:])
    assert expect in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    if resume_of:
        assert sorted((p.name, p.stat().st_size) for p in out.rglob("*")) == before
    else:
        assert not out.exists(), "a run folder was made for refused data"


@pytest.mark.parametrize("command", ["eval", "matrix"])
@pytest.mark.parametrize("name", ["labels.jsonl", "tasks.jsonl", "corpus.jsonl"])
def test_edited_file_is_refused(name, command, hotpot_dev_dir, tmp_path, rel):
    data = _copy(hotpot_dev_dir, tmp_path)
    rows = rel.raw_lines(data / name)
    if name == "labels.jsonl":
        for row in rows:
            row["answers"] = ["yes"]
    elif name == "tasks.jsonl":
        rows[0]["question"] = rows[0]["question"] + " (edited)"
    else:
        rows[0]["text"] = rows[0].get("text", "") + " edited"
    (data / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    _refused(rel, data, tmp_path, f"edited data ({command})", "does not match the file", command=command)


def test_resume_on_edited_labels_is_refused(hotpot_dev_dir, tmp_path, rel):
    data = _copy(hotpot_dev_dir, tmp_path)
    run = tmp_path / "run"
    proc = rel.run_cli(rel.cli_args("eval", rel.RULES, data, run, TASKS, []))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run / "summary.json").unlink()  # as if it had crashed
    labels = rel.raw_lines(data / "labels.jsonl")
    for lab in labels:
        lab["answers"] = ["yes"]
    (data / "labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in labels), encoding="utf-8")
    _refused(rel, data, tmp_path, "edited data (--resume)", "does not match the file", resume_of=run)


def test_duplicate_task_id_is_refused(hotpot_dev_dir, tmp_path, rel, rewrite_data_file):
    data = _copy(hotpot_dev_dir, tmp_path)
    tasks = rel.raw_lines(data / "tasks.jsonl")
    tasks.insert(2, dict(tasks[0]))
    rewrite_data_file(data, "tasks.jsonl", tasks)
    _refused(rel, data, tmp_path, "duplicate task id", f"duplicate {tasks[0]['id']!r}")


def test_task_without_label_is_refused(hotpot_dev_dir, tmp_path, rel, rewrite_data_file):
    data = _copy(hotpot_dev_dir, tmp_path)
    labels = rel.raw_lines(data / "labels.jsonl")
    gone = labels.pop(1)
    rewrite_data_file(data, "labels.jsonl", labels)
    _refused(rel, data, tmp_path, "task without a label", f"{gone['id']!r} has no label")


def test_truncated_corpus_line_is_refused_with_its_line(hotpot_dev_dir, tmp_path, rel):
    """A corpus cut short mid-line (a copy or a prepare that died), its manifest hash made to
    match so the parse itself must catch it and name file:line."""
    from memsearch.io import sha256_file

    data = _copy(hotpot_dev_dir, tmp_path)
    raw = (data / "corpus.jsonl").read_bytes()
    lines = raw.splitlines(keepends=True)
    (data / "corpus.jsonl").write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["files"]["corpus.jsonl"] = sha256_file(data / "corpus.jsonl")
    (data / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    _refused(rel, data, tmp_path, "truncated corpus line", f"corpus.jsonl:{len(lines)}")
