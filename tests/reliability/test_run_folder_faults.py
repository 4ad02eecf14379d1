"""Run-folder faults (issue 11 items 12, 13): two writers on one folder, and a disk that fills
up mid-run. Real CLI subprocesses and a real 64 KiB tmpfs (root, as on this project's machines
and CI)."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from memsearch.cli.app import EXIT_STORAGE
from memsearch.testing.agent_server import AgentServer

pytestmark = [pytest.mark.reliability, pytest.mark.slow]


def test_two_concurrent_resumes_never_run_a_task_twice(hotpot_dev_dir, tmp_path, rel):
    """Two `--resume`s at once used to both run the missing tasks (52 lines for 30 tasks)."""
    out, tasks = tmp_path / "run", 20
    started = time.perf_counter()
    # Slow answers (~0.25 s a call, 2 episodes at once: ~10 s for the run) so the first writer is
    # still running when the second starts, even on a loaded machine.
    with AgentServer(delay_s=0.25) as server:
        args = rel.cli_args("eval", rel.API, hotpot_dev_dir, out, tasks, rel.api_sets(server.base_url, "concurrency=2"))
        first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while time.time() < deadline and not (out / "trajectories.jsonl").is_file():
            time.sleep(0.02)
        second = rel.run_cli([*args, "--resume"])
        overlapped = first.poll() is None  # the second ran while the first was still writing
        _, first_err = first.communicate(timeout=180)
    lost, dup = rel.lost_and_duplicated(out, rel.task_ids(hotpot_dev_dir, tasks))
    rel.LEDGER.record("concurrent writers", runs=2, lost=lost, duplicated=dup,
                      wrong_exit=int(first.returncode != 0) + int(second.returncode != 2),
                      seconds=time.perf_counter() - started)
    assert first.returncode == 0, first_err
    assert overlapped, "the first run ended before the second started: the test did not exercise two writers"
    assert second.returncode == 2 and "is writing this run folder" in second.stderr
    assert (lost, dup) == (0, 0)


@pytest.fixture()
def small_disk(tmp_path):
    """A 64 KiB tmpfs: real ENOSPC (needs root, which CI and this project's machines have)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip()}); the disk-full test needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_ends_in_one_line_and_resume_finishes_the_run(hotpot_dev_dir, small_disk, tmp_path, rel):
    tasks = 40
    started = time.perf_counter()
    full = rel.run_cli(rel.cli_args("eval", rel.RULES, hotpot_dev_dir, small_disk / "run", tasks, []))
    errors = [line for line in full.stderr.splitlines() if line.startswith("error:")]
    # Whole lines are saved; the line being written when the disk filled may be torn (no final
    # newline): --resume cuts it off and runs that task again.
    saved = (small_disk / "run" / "trajectories.jsonl").read_bytes().count(b"\n")
    moved = tmp_path / "moved"  # given room: the folder moved to a disk with space
    shutil.copytree(small_disk / "run", moved)
    (moved / ".lock").unlink()
    resumed = rel.run_cli(rel.cli_args("eval", rel.RULES, hotpot_dev_dir, moved, tasks, [], resume=True))
    straight = rel.run_cli(rel.cli_args("eval", rel.RULES, hotpot_dev_dir, tmp_path / "straight", tasks, []))
    lost, dup = rel.lost_and_duplicated(moved, rel.task_ids(hotpot_dev_dir, tasks))
    rel.LEDGER.record(
        "disk full + resume",
        runs=2,
        lost=lost,
        duplicated=dup,
        wrong_exit=int(full.returncode != EXIT_STORAGE) + int(resumed.returncode != 0),
        seconds=time.perf_counter() - started,
    )
    assert full.returncode == EXIT_STORAGE, full.stderr[-2000:]
    assert len(errors) == 1 and "Traceback" not in full.stderr
    assert 0 < saved < tasks
    assert errors[0].startswith(
        f"error: {small_disk / 'run' / 'trajectories.jsonl'}: No space left on device; "
        f"{saved} of {tasks} task(s) are saved in {small_disk / 'run'}"
    )
    assert errors[0].endswith("then run the same command with --resume to continue")
    assert resumed.returncode == 0 and straight.returncode == 0, resumed.stderr[-2000:]
    assert (lost, dup) == (0, 0)
    for name in ("trajectories", "metrics"):
        compare = getattr(rel, f"comparable_{name}")
        assert compare(moved / f"{name}.jsonl") == compare(tmp_path / "straight" / f"{name}.jsonl")
    assert rel.comparable_summary(moved / "summary.json") == rel.comparable_summary(
        tmp_path / "straight" / "summary.json"
    )
