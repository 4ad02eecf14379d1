"""Failed tasks (issue 55): they score 0 on every answer metric, `--resume` runs them again after
a server outage (their failed attempts kept in failed_attempts.jsonl, nothing lost), and calls the
server's context cut short make a run unusable for comparison. Real runs against the scripted
OpenAI-compatible server on 127.0.0.1 (``memsearch.testing.agent_server``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.data.dataset import load_dataset
from memsearch.eval.attempts import FAILED_ATTEMPTS, supersede_failed
from memsearch.eval.runner import read_finished, run_eval, summarize
from memsearch.eval.score import answer_keys, score_trajectory
from memsearch.io import iter_jsonl
from memsearch.records.trajectory import Trajectory
from memsearch.testing.agent_server import AgentServer

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "configs" / "api.toml"
RULES = ROOT / "configs" / "rules.toml"
ROLES = ("memory", "controller", "reader")


def _config(url: str, *extra: str):
    # One task at a time: which requests the server fails (every n-th) is then the same every run.
    return load_config(API, ['tokenizer="lexical"', "concurrency=1",
                             *[f'backends.{r}.base_url="{url}"' for r in ROLES],
                             *[f"backends.{r}.max_retries=0" for r in ROLES], *extra])


def _lines(path: Path) -> list[dict]:
    return [obj for _, obj in iter_jsonl(path)]


def test_a_failed_task_scores_zero_even_when_its_reader_answered_right(hotpot_dev_dir, tmp_path):
    """Every third request fails: some tasks lose a memory call yet their reader still answers,
    sometimes rightly ("yes"). Such a task used to score EM 1 while counted failed."""
    with AgentServer(delay_s=0.0, fail_every=3) as server:
        summary = run_eval(_config(server.base_url, "limit=40"), hotpot_dev_dir, tmp_path / "run", show_progress=False)
    rows = _lines(tmp_path / "run" / "metrics.jsonl")
    failed = [r for r in rows if r["status"] != "ok"]
    answered_right = [r for r in failed if r["prediction"] in r["answers"]]
    assert answered_right, "the case this test is about did not occur"
    assert all(r[key] in (0.0, None) for r in failed for key in answer_keys())
    ok_em = sum(r["em"] for r in rows if r["status"] == "ok")
    assert summary.metrics["em"] == pytest.approx(ok_em / len(rows)) and summary.metric_counts["em"] == 40
    assert summary.evaluator_version == "eval-5"


def test_resume_runs_again_the_tasks_a_server_outage_failed(hotpot_dev_dir, tmp_path):
    """A server answering 500 to every 7th request fails some tasks (exit 3 from the CLI); once it
    is back, --resume runs exactly those tasks again, keeps the finished ones byte for byte and
    the failed attempts in failed_attempts.jsonl, and ends with the records of a clean run."""
    out, n = tmp_path / "run", 5
    with AgentServer(delay_s=0.0, fail_every=7) as flaky:
        port = flaky.port
        first = run_eval(_config(flaky.base_url, f"limit={n}"), hotpot_dev_dir, out, show_progress=False)
    lines = (out / "trajectories.jsonl").read_text().splitlines(keepends=True)
    failed = {json.loads(line)["task_id"]: line for line in lines if json.loads(line)["status"] != "ok"}
    kept = [line for line in lines if json.loads(line)["task_id"] not in failed]
    assert failed and kept, "expected both failed and finished tasks"
    assert first.complete is False and first.tasks.failed == len(failed)

    with AgentServer(port=port, delay_s=0.0) as back:  # the same server address, answering again
        again = run_eval(_config(back.base_url, f"limit={n}"), hotpot_dev_dir, out, resume=True, show_progress=False)
    with AgentServer(delay_s=0.0) as clean:
        ref = run_eval(_config(clean.base_url, f"limit={n}"), hotpot_dev_dir, tmp_path / "ref", show_progress=False)

    assert again.complete is True and again.usable_for_comparison is True
    assert again.timing["episodes_run"] == len(failed) and again.timing["resumed_tasks"] == len(kept)
    assert again.tasks.to_json() | {"failed_ids": None} == {"expected": n, "scored": n, "failed": 0, "failed_ids": None,
                                                     "retried": len(failed), "failed_attempts": len(failed)}
    now = (out / "trajectories.jsonl").read_text().splitlines(keepends=True)
    assert now[: len(kept)] == kept  # finished tasks untouched, in place
    retried = [json.loads(line) for line in now[len(kept):]]
    assert sorted(t["task_id"] for t in retried) == sorted(failed)
    assert all(t["status"] == "ok" and t["attempt"] == 2 for t in retried)
    assert (out / FAILED_ATTEMPTS).read_text() == "".join(line for line in lines if line in failed.values())

    def strip(rows):
        return sorted(({k: v for k, v in r.items() if k not in ("latency_s", "attempt")} for r in rows),
                      key=lambda r: r["task_id"])

    assert strip(_lines(out / "metrics.jsonl")) == strip(_lines(tmp_path / "ref" / "metrics.jsonl"))
    assert {k: v for k, v in again.metrics.items() if k != "latency_s"} == \
        {k: v for k, v in ref.metrics.items() if k != "latency_s"}


def test_a_kill_between_the_two_writes_of_a_supersede_records_each_attempt_once(hotpot_dev_dir, tmp_path):
    """supersede_failed appends the failed lines, then replaces trajectories.jsonl. Killed between
    the two (trajectories.jsonl as before), the next resume records nothing twice; a torn last
    line of failed_attempts.jsonl (killed mid-append) is cut, never kept."""
    out = tmp_path / "run"
    with AgentServer(delay_s=0.0, fail_every=1) as server:  # every request fails: every task
        run_eval(_config(server.base_url, "limit=2"), hotpot_dev_dir, out, show_progress=False)
    traj = out / "trajectories.jsonl"
    before = traj.read_bytes()
    ids = [t.id for t in load_dataset(hotpot_dev_dir).tasks[:2]]
    assert sorted(supersede_failed(out, read_finished(traj, ids))) == sorted(ids)
    assert traj.read_bytes() == b"" and (out / FAILED_ATTEMPTS).read_bytes() == before
    traj.write_bytes(before)  # as if killed before the replace
    (out / FAILED_ATTEMPTS).write_bytes(before + b'{"task_id": "torn')
    supersede_failed(out, read_finished(traj, ids))
    assert (out / FAILED_ATTEMPTS).read_bytes() == before and traj.read_bytes() == b""


def test_calls_cut_by_the_server_context_make_a_run_unusable(hotpot_dev_dir, tmp_path):
    """A real run's records with two memory calls and one reader call marked as cut short by the
    server's context (what the OpenAI backend records: finish_reason length below max_tokens)."""
    cfg = load_config(RULES, ["limit=3"])
    out = tmp_path / "run"
    clean = run_eval(cfg, hotpot_dev_dir, out, show_progress=False)
    assert clean.usable_for_comparison and clean.context_truncated == {"calls": 0, "tasks": 0, "by_role": {}}
    labels = load_dataset(hotpot_dev_dir).labels_by_id()
    trajs = _lines(out / "trajectories.jsonl")
    for traj, roles in zip(trajs, (("memory", "reader"), ("memory",)), strict=False):
        for role in roles:
            call = next(e for e in traj["events"] if e["type"] == "policy_call" and e["role"] == role)
            call["context_truncated"] = True
        traj["counts"]["context_truncated_calls"] = len(roles)
    rows = [score_trajectory(Trajectory.from_json(t), labels[t["task_id"]]) for t in trajs]
    run_info = json.loads((out / "run.json").read_text())
    summary = summarize(cfg, run_info, rows, 3, {})
    assert summary.complete is True and summary.usable_for_comparison is False
    assert summary.context_truncated == {"calls": 3, "tasks": 2, "by_role": {"memory": 2, "reader": 1}}
    assert summary.note.startswith("CONTEXT-TRUNCATED: 3 call(s) in 2 task(s) (by role: memory 2, reader 1)")
    # A completion cut at its own max_tokens (finish_reason length alone) is the budget working: usable.
    budget_cut = _lines(out / "trajectories.jsonl")
    for traj in budget_cut:
        for event in traj["events"]:
            event["finish_reason"] = "length" if event["type"] == "policy_call" else event.get("finish_reason")
    rows = [score_trajectory(Trajectory.from_json(t), labels[t["task_id"]]) for t in budget_cut]
    assert summarize(cfg, run_info, rows, 3, {}).usable_for_comparison is True
