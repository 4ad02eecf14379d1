"""A canary API key (MEMSEARCH_API_KEY) that the fault server echoes in completions and in
error bodies (500, 429, bad JSON) must appear in no file under the run folder and not in the
CLI's stdout or stderr, for eval and matrix."""

from __future__ import annotations

import time

import pytest

from memsearch.cli.app import EXIT_INCOMPLETE
from memsearch.testing.agent_server import AgentServer

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

CANARY = "sk-canary-7f3b1e9d42"
TASKS = 6


@pytest.mark.parametrize("command", ["eval", "matrix"])
def test_canary_key_never_written(command, hotpot_dev_dir, tmp_path, rel):
    ids = rel.task_ids(hotpot_dev_dir, TASKS)
    sets = [f"backends.{r}.{k}" for r in rel.SERVED for k in ("timeout_s=0.5", "max_retries=1")]
    sets += ["concurrency=6", 'agent.controller="policy"'] if command == "eval" else ["concurrency=6"]
    out = tmp_path / "run"
    started = time.perf_counter()
    with AgentServer(delay_s=0.0, faults={"500": 0.1, "429": 0.1, "bad_json": 0.1}, seed=3, retry_after_s=0.01,
                     max_faults_per_request=3, echo_key=True, lifetime_s=90) as server:
        proc = rel.run_cli(
            rel.cli_args(command, rel.API, hotpot_dev_dir, out, TASKS, rel.api_sets(server.base_url, *sets)),
            env={"MEMSEARCH_API_KEY": CANARY},
        )
    folders = [out] if command == "eval" else [out / g for g in "ABCD"]
    summaries = [rel.raw_lines(f / "metrics.jsonl") for f in folders]
    complete = all(r["status"] == "ok" for rows in summaries for r in rows)
    expected_exit = 0 if complete else EXIT_INCOMPLETE
    lost = dup = 0
    for f in folders:
        lo, du = rel.lost_and_duplicated(f, ids)
        lost, dup = lost + lo, dup + du
    rel.LEDGER.record(
        "canary API key",
        runs=1,
        lost=lost,
        duplicated=dup,
        wrong_exit=int(proc.returncode != expected_exit),
        seconds=time.perf_counter() - started,
    )
    # The key was really sent and really echoed back, in answers and in error bodies.
    assert set(server.auth_headers) == {f"Bearer {CANARY}"}
    assert (
        server.echoed > 0
        and server.fault_counts["500"] + server.fault_counts["429"] + server.fault_counts["bad_json"] > 0
    )
    leaks = [str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()]
    assert leaks == [], f"canary key written to {leaks}"
    assert CANARY not in proc.stdout and CANARY not in proc.stderr
    assert proc.returncode == expected_exit, proc.stderr[-2000:]
    assert (lost, dup) == (0, 0)
