"""Run folders written by engines 2 to 6 (``tests/records/old_runs``, README there) read through
today's records and score as they scored when they were written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.data.records import Label
from memsearch.eval.score import score_trajectory
from memsearch.io import iter_jsonl
from memsearch.records.causes import InvalidCause
from memsearch.records.trajectory import read_trajectories

OLD_RUNS = Path(__file__).parent / "old_runs"
FOLDERS = sorted(p.name for p in OLD_RUNS.iterdir() if p.is_dir())
# Per-question figures of a row that depend on nothing but the record (timing does not).
IGNORED = {"latency_s"}


def _labels() -> dict[str, Label]:
    return {row["id"]: Label(**row) for _, row in iter_jsonl(OLD_RUNS / "labels.jsonl")}


def test_every_engine_version_is_here():
    assert FOLDERS == [f"engine-{v}-{k}" for v in range(2, 7) for k in ("policy", "summary")]


@pytest.mark.parametrize("folder", FOLDERS)
def test_an_old_run_reads_and_scores_as_it_did(folder):
    labels, run = _labels(), OLD_RUNS / folder
    raw = {t["task_id"]: t for _, t in iter_jsonl(run / "trajectories.jsonl.gz")}
    trajectories = {t.task_id: t for _, t in read_trajectories(run / "trajectories.jsonl.gz")}
    old_rows = [row for _, row in iter_jsonl(run / "metrics.jsonl.gz")]
    assert len(old_rows) == len(trajectories) == 3
    version = int(folder.split("-")[1])
    for old in old_rows:
        traj = trajectories[old["task_id"]]
        assert traj.engine_version == ("engine-6" if version == 6 else None)
        new = score_trajectory(traj, labels[traj.task_id]).to_json()  # the line the scorer writes today
        shared = (old.keys() & new.keys()) - IGNORED
        assert len(shared) >= 20
        assert {k: new[k] for k in shared} == {k: old[k] for k in shared}, folder
        # The ops, stored once in the record, are the ones the file counted.
        assert traj.memory_ops == raw[traj.task_id]["counts"]["memory_ops"]
        calls = traj.policy_calls()
        assert len(calls) == raw[traj.task_id]["counts"]["policy_calls"] and calls[-1].role == "reader"
        assert all(c.invalid_cause in (None, *InvalidCause) for c in calls)
        if folder.endswith("policy"):
            assert traj.policy_calls(["controller"]) and len(traj.searches) == traj.counts.searches
        # Written again, what the old line held survives (a newer field is added, none is lost).
        written = json.loads(json.dumps(traj.to_json()))
        assert _holds(written, raw[traj.task_id]), folder


def _holds(new, old) -> bool:
    """Whether ``new`` holds everything ``old`` does (objects may have gained keys, nothing else changed)."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k in new and _holds(new[k], v) for k, v in old.items())
    if isinstance(old, list):
        return isinstance(new, list) and len(new) == len(old) and all(map(_holds, new, old))
    return new == old
