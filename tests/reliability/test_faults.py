"""Faults on the wire: eval and matrix through a seeded fault-injecting OpenAI-compatible server
(HTTP 500, 429 + Retry-After, stalls past the client timeout, bad JSON, empty choices, short
bodies, dropped connections). No task may be lost or duplicated, summary.json's request_errors
must equal the per-task sum, ``complete`` must be false exactly when a task failed, and the exit
status must be 0 when complete and ``EXIT_INCOMPLETE`` (3) when not."""

from __future__ import annotations

import json
import time

import pytest

from memsearch.cli.app import EXIT_INCOMPLETE
from memsearch.testing.agent_server import TRANSIENT_FAULT_KINDS, AgentServer

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

TASKS = 8
TIMEOUT_S = 1.0      # per attempt (room for a loaded machine); a stall outlasts it, so it is a client timeout
STALL_S = 1.6
EVERY_KIND = {k: 0.07 for k in TRANSIENT_FAULT_KINDS}  # ~half the requests draw a fault


def _transport(timeout_s: float, retries: int) -> list[str]:
    return [f"backends.{r}.{k}" for r in ("memory", "controller", "reader", "baseline_memory")
            for k in (f"timeout_s={timeout_s}", f"max_retries={retries}")]


def _check_folder(rel, folder, ids, scenario: str) -> dict:
    """Record lost/duplicated tasks of one run folder; returns its summary."""
    lost, dup = rel.lost_and_duplicated(folder, ids)
    rel.LEDGER.record(scenario, runs=0, lost=lost, duplicated=dup)
    summary = json.loads((folder / "summary.json").read_text())
    rows = rel.raw_lines(folder / "metrics.jsonl")
    failed = [r["task_id"] for r in rows if r["status"] != "ok"]
    assert (lost, dup) == (0, 0), f"{folder}: {lost} task(s) lost, {dup} duplicated"
    assert summary["request_errors"] == sum(r["request_errors"] for r in rows)
    calls = [e for t in rel.raw_lines(folder / "trajectories.jsonl") for e in t["events"] if e["type"] == "policy_call"]
    assert summary["request_errors"] == sum(1 for e in calls if e["error"] is not None)
    assert summary["tasks"]["failed"] == len(failed) and summary["tasks"]["scored"] == len(ids)
    assert summary["complete"] is (not failed), (
        f"{folder}: complete={summary['complete']} with {len(failed)} failed task(s)"
    )
    return summary


def test_eval_recovers_from_every_fault_kind(hotpot_dev_dir, tmp_path, rel):
    """Faults at a rate the retries absorb (at most 2 in a row per request, 3 retries): the run is
    complete, exits 0, and scores exactly like a run against a clean server."""
    ids = rel.task_ids(hotpot_dev_dir, TASKS)
    sets = _transport(TIMEOUT_S, 3) + ["concurrency=8"]
    started = time.perf_counter()
    with AgentServer(delay_s=0.0, lifetime_s=60) as clean:
        ref = rel.run_cli(
            rel.cli_args(
                "eval", rel.API, hotpot_dev_dir, tmp_path / "clean", TASKS, rel.api_sets(clean.base_url, *sets)
            )
        )
    with AgentServer(
        delay_s=0.0,
        faults=EVERY_KIND,
        seed=13,  # draws hit every fault kind for these request bodies (eval asks no log-probs)
        stall_s=STALL_S,
        retry_after_s=0.02,
        max_faults_per_request=2,
        lifetime_s=90,
    ) as server:
        proc = rel.run_cli(
            rel.cli_args(
                "eval", rel.API, hotpot_dev_dir, tmp_path / "faulty", TASKS, rel.api_sets(server.base_url, *sets)
            )
        )
    wrong = int(ref.returncode != 0) + int(proc.returncode != 0)
    rel.LEDGER.record("faults within retries (eval)", runs=2, wrong_exit=wrong, seconds=time.perf_counter() - started)
    assert ref.returncode == 0, ref.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = _check_folder(rel, tmp_path / "faulty", ids, "faults within retries (eval)")
    assert summary["complete"] is True and summary["request_errors"] == 0
    # Every kind of fault was really served, and none changed a result.
    assert all(server.fault_counts[k] >= 1 for k in TRANSIENT_FAULT_KINDS), server.fault_counts
    assert sum(server.fault_counts.values()) >= 15
    assert rel.comparable_metrics(tmp_path / "faulty" / "metrics.jsonl") == rel.comparable_metrics(
        tmp_path / "clean" / "metrics.jsonl"
    )
    assert rel.comparable_summary(tmp_path / "faulty" / "summary.json") == rel.comparable_summary(
        tmp_path / "clean" / "summary.json"
    )


def test_eval_with_faults_beyond_retries_is_incomplete_and_exits_3(hotpot_dev_dir, tmp_path, rel):
    """No retries: every injected fault is exactly one request error, some tasks fail, the run
    says so (complete false) and exits EXIT_INCOMPLETE."""
    ids = rel.task_ids(hotpot_dev_dir, TASKS)
    sets = _transport(TIMEOUT_S, 0) + ["concurrency=8", 'agent.controller="policy"']
    started = time.perf_counter()
    with AgentServer(
        delay_s=0.0, faults=EVERY_KIND, seed=5, stall_s=STALL_S, max_faults_per_request=10, lifetime_s=90
    ) as server:
        proc = rel.run_cli(
            rel.cli_args("eval", rel.API, hotpot_dev_dir, tmp_path / "run", TASKS, rel.api_sets(server.base_url, *sets))
        )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    expected_exit = 0 if summary["complete"] else EXIT_INCOMPLETE
    rel.LEDGER.record(
        "faults beyond retries (eval)",
        runs=1,
        wrong_exit=int(proc.returncode != expected_exit),
        seconds=time.perf_counter() - started,
    )
    summary = _check_folder(rel, tmp_path / "run", ids, "faults beyond retries (eval)")
    assert proc.returncode == expected_exit, (proc.returncode, proc.stderr[-2000:])
    assert summary["tasks"]["failed"] > 0 and summary["complete"] is False and proc.returncode == EXIT_INCOMPLETE
    # One failed request per injected fault: nothing hidden, nothing double-counted.
    assert summary["request_errors"] == sum(server.fault_counts.values()) > 0
    assert "INCOMPLETE" in proc.stderr


@pytest.mark.parametrize("retries", [1, 4])
def test_matrix_through_faults(hotpot_dev_dir, tmp_path, rel, retries):
    """All four groups through the fault server: per group no task lost or duplicated and an
    honest summary; the exit status is 3 exactly when some group is incomplete."""
    n = 6
    ids = rel.task_ids(hotpot_dev_dir, n)
    sets = _transport(TIMEOUT_S, retries) + ["concurrency=6"]
    scenario = f"faults, matrix (max_retries={retries})"
    started = time.perf_counter()
    with AgentServer(
        delay_s=0.0,
        faults={k: 0.05 for k in TRANSIENT_FAULT_KINDS},
        seed=23 + retries,
        stall_s=STALL_S,
        retry_after_s=0.02,
        max_faults_per_request=3,
        lifetime_s=120,
    ) as server:
        proc = rel.run_cli(
            rel.cli_args("matrix", rel.API, hotpot_dev_dir, tmp_path / "m", n, rel.api_sets(server.base_url, *sets))
        )
    groups = {g: json.loads((tmp_path / "m" / g / "summary.json").read_text()) for g in "ABCD"}
    expected_exit = 0 if all(s["complete"] for s in groups.values()) else EXIT_INCOMPLETE
    rel.LEDGER.record(
        scenario, runs=1, wrong_exit=int(proc.returncode != expected_exit), seconds=time.perf_counter() - started
    )
    for g in "ABCD":
        _check_folder(rel, tmp_path / "m" / g, ids, scenario)
    assert proc.returncode == expected_exit, (proc.returncode, proc.stderr[-2000:])
    assert sum(server.fault_counts.values()) > 0
    if retries == 4:  # 3 faults in a row at most: every request gets through
        assert expected_exit == 0 and all(s["request_errors"] == 0 for s in groups.values())
    else:  # 2 faults in a row fail a request: some group is incomplete (seeded, so always)
        assert expected_exit == EXIT_INCOMPLETE and sum(s["request_errors"] for s in groups.values()) > 0


def test_an_outage_fails_the_run_and_resume_finishes_it_once_the_server_is_back(hotpot_dev_dir, tmp_path, rel):
    """The server is down for the whole first run (every request answered 500, no retries): every
    task fails, exit 3. `--resume` used to run nothing and exit 3 again (failed tasks counted as
    finished); with the server back at the same address it runs them again and exits 0, each
    task once in trajectories.jsonl and its failed attempt in failed_attempts.jsonl."""
    n = 4
    ids = rel.task_ids(hotpot_dev_dir, n)
    out = tmp_path / "run"
    started = time.perf_counter()
    with AgentServer(delay_s=0.0, fail_every=1) as down:
        port = down.port
        sets = rel.api_sets(down.base_url, *_transport(TIMEOUT_S, 0))
        failed = rel.run_cli(rel.cli_args("eval", rel.API, hotpot_dev_dir, out, n, sets))
    with AgentServer(port=port, delay_s=0.0) as back:
        resumed = rel.run_cli(rel.cli_args("eval", rel.API, hotpot_dev_dir, out, n, sets, resume=True))
        assert back.requests > 0
    wrong = int(failed.returncode != EXIT_INCOMPLETE) + int(resumed.returncode != 0)
    rel.LEDGER.record("outage, then --resume (eval)", runs=2, wrong_exit=wrong, seconds=time.perf_counter() - started)
    summary = _check_folder(rel, out, ids, "outage, then --resume (eval)")
    assert failed.returncode == EXIT_INCOMPLETE, failed.stderr[-2000:]
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert summary["complete"] is True and summary["tasks"]["retried"] == n == summary["tasks"]["failed_attempts"]
    attempts = rel.raw_lines(out / "failed_attempts.jsonl")
    assert sorted(t["task_id"] for t in attempts) == sorted(ids) and all(t["status"] == "error" for t in attempts)
    assert all(t["attempt"] == 2 for t in rel.raw_lines(out / "trajectories.jsonl"))
