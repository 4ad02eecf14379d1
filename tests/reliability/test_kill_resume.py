"""SIGKILL at seeded random points of a real `memsearch eval` / `memsearch matrix` process, then
``--resume`` (itself possibly killed again, then resumed again): the final trajectories, metrics
and summaries (minus timing) equal an uninterrupted run's; no task lost or duplicated."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from memsearch.testing.agent_server import AgentServer

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

EVAL_TASKS = 12
MATRIX_TASKS = 6
GROUPS = "ABCD"


def _lines_in(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return -1


def _run_and_kill(args: list[str], when, timeout: float = 60) -> int | None:
    """Start ``args``; SIGKILL it as soon as ``when()`` is true. Returns the exit status, or None
    when it was killed (a run that finished first is simply not killed)."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if when():
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                return None
            time.sleep(0.005)
        return proc.wait(max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _same_run(rel, folder: Path, ref: Path, ids: list[str], scenario: str) -> None:
    lost, dup = rel.lost_and_duplicated(folder, ids)
    rel.LEDGER.record(scenario, runs=0, lost=lost, duplicated=dup)
    assert (lost, dup) == (0, 0), f"{folder}: {lost} lost, {dup} duplicated"
    assert rel.comparable_trajectories(folder / "trajectories.jsonl") == rel.comparable_trajectories(
        ref / "trajectories.jsonl"
    )
    assert rel.comparable_metrics(folder / "metrics.jsonl") == rel.comparable_metrics(ref / "metrics.jsonl")
    assert rel.comparable_summary(folder / "summary.json") == rel.comparable_summary(ref / "summary.json")


@pytest.fixture(scope="module")
def server():
    with AgentServer(delay_s=0.02, lifetime_s=240) as s:
        yield s


@pytest.fixture(scope="module")
def eval_reference(server, hotpot_dev_dir, tmp_path_factory, rel):
    out = tmp_path_factory.mktemp("eval-ref") / "run"
    proc = rel.run_cli(
        rel.cli_args("eval", rel.API, hotpot_dev_dir, out, EVAL_TASKS, rel.api_sets(server.base_url, "concurrency=2"))
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_eval_killed_and_resumed(seed, server, eval_reference, hotpot_dev_dir, tmp_path, rel):
    rng = random.Random(seed)
    ids = rel.task_ids(hotpot_dev_dir, EVAL_TASKS)
    out = tmp_path / "run"
    traj = out / "trajectories.jsonl"
    # Kill points: the first when k trajectory lines exist (0 = the file was just opened); half
    # the time the resume is killed again, later.
    points = [rng.randint(0, EVAL_TASKS - 2)]
    if rng.random() < 0.5 or seed == 1:
        points.append(rng.randint(points[0] + 1, EVAL_TASKS - 1))
    sets = rel.api_sets(server.base_url, "concurrency=2")
    started, runs, wrong, kills = time.perf_counter(), 0, 0, 0
    for i, k in enumerate(points):
        status = _run_and_kill(
            rel.cli_args("eval", rel.API, hotpot_dev_dir, out, EVAL_TASKS, sets, resume=i > 0),
            lambda k=k: _lines_in(traj) >= k,
        )
        runs += 1
        kills += status is None
        wrong += status not in (None, 0)
    assert kills >= 1 and not (out / "summary.json").exists()
    final = rel.run_cli(rel.cli_args("eval", rel.API, hotpot_dev_dir, out, EVAL_TASKS, sets, resume=True))
    runs += 1
    wrong += final.returncode != 0
    rel.LEDGER.record(
        "SIGKILL + resume (eval, api)", runs=runs, wrong_exit=wrong, seconds=time.perf_counter() - started
    )
    assert final.returncode == 0, final.stderr[-2000:]
    assert wrong == 0
    _same_run(rel, out, eval_reference, ids, "SIGKILL + resume (eval, api)")


def _matrix_case(rel, config, data, out, ref, n, sets, plan, scenario):
    """``plan``: one ``when(out)`` predicate per kill; then a final resume must finish it."""
    ids = rel.task_ids(data, n)
    started, runs, wrong, kills = time.perf_counter(), 0, 0, 0
    for i, when in enumerate(plan):
        status = _run_and_kill(rel.cli_args("matrix", config, data, out, n, sets, resume=i > 0), lambda w=when: w(out))
        runs += 1
        kills += status is None
        wrong += status not in (None, 0)
    final = rel.run_cli(rel.cli_args("matrix", config, data, out, n, sets, resume=True))
    runs += 1
    wrong += final.returncode != 0
    rel.LEDGER.record(scenario, runs=runs, wrong_exit=wrong, seconds=time.perf_counter() - started)
    assert final.returncode == 0, final.stderr[-2000:]
    assert wrong == 0
    for g in GROUPS:
        _same_run(rel, out / g, ref / g, ids, scenario)
    matrix = [rel.without_wallclock(json.loads((f / "matrix.json").read_text())) for f in (out, ref)]
    assert matrix[0] == matrix[1]
    assert (out / "matrix.md").read_text() == (ref / "matrix.md").read_text()
    return kills


def test_matrix_api_killed_twice_and_resumed(server, hotpot_dev_dir, tmp_path, rel):
    rng = random.Random(3)
    sets = rel.api_sets(server.base_url, "concurrency=2")
    ref = tmp_path / "ref"
    proc = rel.run_cli(rel.cli_args("matrix", rel.API, hotpot_dev_dir, ref, MATRIX_TASKS, sets))
    assert proc.returncode == 0, proc.stderr[-2000:]
    # Two kill points, in order: (group, trajectory lines of that group).
    a, b = sorted(rng.sample(range(len(GROUPS) * MATRIX_TASKS - 1), 2))
    plan = [
        lambda out, p=p: _lines_in(out / GROUPS[p // MATRIX_TASKS] / "trajectories.jsonl") >= p % MATRIX_TASKS
        for p in (a, b)
    ]
    kills = _matrix_case(
        rel, rel.API, hotpot_dev_dir, tmp_path / "cut", ref, MATRIX_TASKS, sets, plan, "SIGKILL + resume (matrix, api)"
    )
    assert kills >= 1


@pytest.mark.parametrize("seed", [4, 5])
def test_matrix_rules_killed_at_random_times(seed, hotpot_dev_dir, tmp_path_factory, tmp_path, rel):
    """The rules backend is fast: kill after a seeded random delay once group A has begun."""
    n = 12
    ref = tmp_path_factory.getbasetemp() / "rules-matrix-ref"
    if not (ref / "matrix.json").exists():
        proc = rel.run_cli(rel.cli_args("matrix", rel.RULES, hotpot_dev_dir, ref, n, []))
        assert proc.returncode == 0, proc.stderr[-2000:]
    rng = random.Random(seed)
    delays = [rng.uniform(0.0, 0.4), rng.uniform(0.0, 0.4)]

    def after(delay):
        state = {}

        def when(out):
            if _lines_in(out / "A" / "trajectories.jsonl") < 0:
                return False
            state.setdefault("t0", time.monotonic())
            return time.monotonic() - state["t0"] >= delay

        return when

    kills = _matrix_case(
        rel,
        rel.RULES,
        hotpot_dev_dir,
        tmp_path / "cut",
        ref,
        n,
        [],
        [after(d) for d in delays],
        "SIGKILL + resume (matrix, rules)",
    )
    assert kills >= 1, "the run finished before the first kill point"
