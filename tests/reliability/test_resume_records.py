"""Damaged and symlinked records on `--resume` (issue 54), through the real CLI: a trajectories
line that is no trajectory of the run, and a record path that is a folder, a FIFO or a symlink
(to a file outside the run folder: the resume used to append through it, growing that file).
Each is exit status 2 with ``error:`` lines naming the file (and line) and no traceback; nothing
is written through a link, nothing outside the run folder changes, and once the named line or
path is fixed the same resume finishes the run."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

TASKS = 4


@pytest.fixture(scope="module")
def finished(hotpot_dev_dir, tmp_path_factory, rel):
    out = tmp_path_factory.mktemp("finished") / "run"
    result = rel.run_cli(rel.cli_args("eval", rel.RULES, hotpot_dev_dir, out, TASKS, []))
    assert result.returncode == 0, result.stderr[-2000:]
    return out


def _line(lines: list[str], edit) -> str:
    traj = json.loads(lines[0])
    edit(traj)
    return json.dumps(traj) + "\n"


# name -> (lines -> the damaged file's lines, the line the refusal names, what it says)
LINES = {
    "empty object": (lambda lines: [*lines, "{}\n"], TASKS + 1, "task_id: no task_id"),
    "array": (lambda lines: [lines[0], "[]\n", *lines[1:]], 2, "json: a JSON list, expected a trajectory object"),
    "int task_id": (lambda lines: [*lines, _line(lines, lambda t: t.update(task_id=5))], TASKS + 1,
                    "task_id: task_id 5 (int), expected the id of a task"),
    "task not in the data": (lambda lines: [*lines, _line(lines, lambda t: t.update(task_id="nosuch"))], TASKS + 1,
                             "task_id: 'nosuch' is no task of this run"),
    "duplicated line": (lambda lines: [*lines, lines[1]], TASKS + 1, "task_id: an identical copy of task"),
}


@pytest.mark.parametrize("name", LINES)
def test_a_line_that_is_no_trajectory_of_the_run_is_refused_naming_it(finished, hotpot_dev_dir, tmp_path, rel, name):
    damage, lineno, says = LINES[name]
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    traj = out / "trajectories.jsonl"
    lines = traj.read_text().splitlines(keepends=True)
    traj.write_text("".join(damage(lines)))
    before = traj.read_bytes()
    started = time.perf_counter()
    args = rel.cli_args("eval", rel.RULES, hotpot_dev_dir, out, TASKS, [], resume=True)
    refused = rel.run_cli(args)
    unchanged = traj.read_bytes() == before  # the refused resume wrote nothing
    first_error = refused.stderr.splitlines()[0] if refused.stderr else ""
    # Fixed as the message says (that one line removed), the same resume finishes the run.
    traj.write_text("".join(line for i, line in enumerate(traj.read_text().splitlines(keepends=True), 1)
                            if i != lineno))
    resumed = rel.run_cli(args)
    lost, dup = rel.lost_and_duplicated(out, rel.task_ids(hotpot_dev_dir, TASKS))
    rel.LEDGER.record("damaged resume records", runs=2, lost=lost, duplicated=dup,
                      wrong_exit=int(refused.returncode != 2 or "Traceback" in refused.stderr)
                      + int(resumed.returncode != 0), seconds=time.perf_counter() - started)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert first_error.startswith(f"error: {traj}:{lineno}: {says}") and f"remove line {lineno}" in first_error
    assert unchanged
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (lost, dup) == (0, 0)


def _symlink_outside(out: Path, name: str, outside: Path) -> str:
    shutil.move(out / name, outside)
    (out / name).symlink_to(outside)
    return "is a symlink"


def _folder(out: Path, name: str, outside: Path) -> str:
    (out / name).unlink(missing_ok=True)
    (out / name).mkdir()
    return "is a folder"


def _fifo(out: Path, name: str, outside: Path) -> str:
    (out / name).unlink(missing_ok=True)
    os.mkfifo(out / name)
    return "is no plain file"


@pytest.mark.parametrize("name", ["trajectories.jsonl", "metrics.jsonl", "summary.json", "failed_attempts.jsonl",
                                  ".lock"])
@pytest.mark.parametrize("make", [_symlink_outside, _folder, _fifo])
def test_a_record_that_is_no_plain_file_is_refused_and_never_written_through(
    finished, hotpot_dev_dir, tmp_path, rel, name, make
):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    traj = out / "trajectories.jsonl"
    traj.write_text("".join(traj.read_text().splitlines(keepends=True)[:2]))  # 2 tasks left to run
    outside_dir = tmp_path / "elsewhere"
    outside_dir.mkdir()
    if name in (".lock", "failed_attempts.jsonl") and not (out / name).exists():
        (out / name).write_text("")
    what = make(out, name, outside_dir / name)
    before = rel.tree_state(outside_dir)
    started = time.perf_counter()
    refused = rel.run_cli(rel.cli_args("eval", rel.RULES, hotpot_dev_dir, out, TASKS, [], resume=True))
    touched = rel.changed_paths(before, rel.tree_state(outside_dir))
    rel.LEDGER.record("symlinked records" if make is _symlink_outside else "records that are no files",
                      runs=1, outside=len(touched),
                      wrong_exit=int(refused.returncode != 2 or "Traceback" in refused.stderr),
                      seconds=time.perf_counter() - started)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert f"error: {out / name}: {what}" in refused.stderr
    assert touched == []
