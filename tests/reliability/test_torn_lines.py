"""A run killed mid-write leaves trajectories.jsonl with a torn last line. Cut the file at seeded
random byte offsets inside a line (keeping the lines before it, as a crash after that many tasks
would) and ``--resume``: the run finishes exactly like an uninterrupted one."""

from __future__ import annotations

import random
import shutil
import time

import pytest

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

TASKS = 12


def test_resume_after_torn_last_line(hotpot_dev_dir, tmp_path, rel):
    ids = rel.task_ids(hotpot_dev_dir, TASKS)
    ref = tmp_path / "ref"
    proc = rel.run_cli(rel.cli_args("eval", rel.RULES, hotpot_dev_dir, ref, TASKS, []))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = (ref / "trajectories.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines) == TASKS
    rng = random.Random(7)
    # The real last line torn (the crash hit the final write), then three earlier points.
    cuts = [TASKS - 1, *rng.sample(range(TASKS - 1), 3)]
    for i, kept in enumerate(cuts):
        torn = lines[kept]
        offset = rng.randint(1, len(torn) - 1)  # inside the line: at least one byte, never its newline
        out = tmp_path / f"cut{i}"
        shutil.copytree(ref, out)
        (out / "summary.json").unlink()    # a killed run never wrote these
        (out / "metrics.jsonl").unlink()
        (out / "trajectories.jsonl").write_bytes(b"".join(lines[:kept]) + torn[:offset])
        started = time.perf_counter()
        resumed = rel.run_cli(rel.cli_args("eval", rel.RULES, hotpot_dev_dir, out, TASKS, [], resume=True))
        lost, dup = rel.lost_and_duplicated(out, ids)
        rel.LEDGER.record("torn last line + resume", runs=1, lost=lost, duplicated=dup,
                          wrong_exit=int(resumed.returncode != 0), seconds=time.perf_counter() - started)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert (lost, dup) == (0, 0), f"cut after {kept} lines at byte {offset}: {lost} lost, {dup} duplicated"
        raw = (out / "trajectories.jsonl").read_bytes()
        assert raw.endswith(b"\n") and raw.count(b"\n") == TASKS and raw.startswith(b"".join(lines[:kept]))
        assert rel.comparable_trajectories(out / "trajectories.jsonl") == rel.comparable_trajectories(
            ref / "trajectories.jsonl"
        )
        assert rel.comparable_metrics(out / "metrics.jsonl") == rel.comparable_metrics(ref / "metrics.jsonl")
        assert rel.comparable_summary(out / "summary.json") == rel.comparable_summary(ref / "summary.json")
