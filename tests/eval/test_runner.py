"""Eval runs end to end on real data: records, budgets, label isolation, faults, resume."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.errors import InputError
from memsearch.eval.matrix import check_comparable, run_matrix
from memsearch.eval.runner import run_eval
from memsearch.io import iter_jsonl
from memsearch.testing.agent_server import AgentServer
from memsearch.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"
API = ROOT / "configs" / "api.toml"
CANARY = "Zqxv Canary Answer 7731"


def _lines(path: Path) -> list[dict]:
    return [obj for _, obj in iter_jsonl(path)]


def _api_overrides(url: str, *extra: str) -> list[str]:
    return [
        'tokenizer="lexical"',
        *[f'backends.{r}.base_url="{url}"' for r in ("memory", "controller", "reader")],
        *extra,
    ]


@pytest.fixture()
def canary_data(hotpot_dev_dir, tmp_path, rewrite_data_file):
    """The prepared dev folder with a canary answer that exists only in labels.jsonl."""
    out = tmp_path / "canary"
    shutil.copytree(hotpot_dev_dir, out)
    labels = _lines(out / "labels.jsonl")
    for lab in labels:
        lab["answers"] = [CANARY, *lab["answers"]]
    rewrite_data_file(out, "labels.jsonl", labels)
    return out


def test_rules_matrix_keeps_labels_out_and_budgets_in(canary_data, tmp_path):
    out = tmp_path / "matrix"
    result = run_matrix(load_config(RULES, ["limit=25"]), canary_data, out, show_progress=False)
    assert set(result["groups"]) == {"A", "B", "C", "D"} and len(result["pairs"]) == 6
    tok = load_tokenizer("lexical")
    budgets = load_config(RULES).budgets
    for group in "ABCD":
        folder = out / group
        text = (folder / "trajectories.jsonl").read_text()
        assert CANARY not in text, "a label reached the agent"
        trajectories = _lines(folder / "trajectories.jsonl")
        assert sorted(t["task_id"] for t in trajectories) == sorted(
            r["task_id"] for r in _lines(folder / "metrics.jsonl")
        )
        assert len(trajectories) == 25
        for traj in trajectories:
            assert traj["counts"]["searches"] <= budgets.max_searches
            assert tok.count(traj["memory_final"]) <= budgets.memory_tokens
            for event in traj["events"]:
                if event["type"] == "search":
                    assert event["evidence_tokens"] <= budgets.evidence_tokens
                if event["type"] == "memory":
                    assert tok.count(event["after"]) <= budgets.memory_tokens
            assert set(traj["memory_sources"]) <= set(traj["shown_evidence"])
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["complete"] and summary["usable_for_comparison"]
        assert summary["entailment_evaluated"] is False
        assert summary["tokenizer"] == "lexical-v1" and summary["budgets"] == budgets.model_dump()
    assert "| A | summary | fixed |" in (out / "matrix.md").read_text()


def test_matrix_refuses_groups_with_different_budgets():
    # A group's budgets override is refused as the config loads (naming --set and key) ...
    with pytest.raises(InputError, match=r"^--set matrix.overrides.B=.*: matrix.overrides.B.budgets: budgets, "):
        load_config(RULES, ["limit=5", 'matrix.overrides.B={"budgets.memory_tokens" = 128}'])
    # ... and a config built in code is still checked before the matrix runs.
    cfg = load_config(RULES, ["limit=5"])
    b = cfg.model_copy(update={"budgets": cfg.budgets.model_copy(update={"memory_tokens": 128})})
    with pytest.raises(InputError, match="group B: budgets differ from group A"):
        check_comparable({"A": cfg, "B": b})


def test_existing_folder_refused_and_resume_needs_same_config(hotpot_dev_dir, tmp_path):
    out = tmp_path / "run"
    run_eval(load_config(RULES, ["limit=3"]), hotpot_dev_dir, out, show_progress=False)
    with pytest.raises(InputError, match="already exists"):
        run_eval(load_config(RULES, ["limit=3"]), hotpot_dev_dir, out, show_progress=False)
    with pytest.raises(InputError, match="config differs"):
        run_eval(
            load_config(RULES, ["limit=3", "budgets.max_searches=1"]),
            hotpot_dev_dir,
            out,
            resume=True,
            show_progress=False,
        )


def test_openai_backend_run_records_usage_and_never_writes_the_key(hotpot_dev_dir, tmp_path, monkeypatch):
    secret = "sk-memsearch-SECRET-4242"
    monkeypatch.setenv("MEMSEARCH_API_KEY", secret)
    with AgentServer(delay_s=0.0) as server:
        cfg = load_config(API, _api_overrides(server.base_url, "limit=8", 'agent.controller="policy"'))
        summary = run_eval(cfg, hotpot_dev_dir, tmp_path / "run", show_progress=False)
    assert set(server.auth_headers) == {f"Bearer {secret}"}
    for path in (tmp_path / "run").iterdir():
        assert secret not in path.read_text(), path.name
    assert summary.complete and summary.request_errors == 0
    assert summary.tokens["reader_prompt_tokens"] > 0 and "estimated_reader_prompt_tokens" not in summary.tokens
    assert summary.backends == {"memory": "openai", "controller": "openai", "reader": "openai"}


def test_server_faults_are_reported_not_fatal(hotpot_dev_dir, tmp_path):
    with AgentServer(delay_s=0.0, fail_every=4, garbage_every=7) as server:
        cfg = load_config(
            API,
            _api_overrides(
                server.base_url,
                "limit=10",
                "backends.memory.max_retries=0",
                "backends.controller.max_retries=0",
                "backends.reader.max_retries=0",
                'agent.controller="policy"',
            ),
        )
        summary = run_eval(cfg, hotpot_dev_dir, tmp_path / "run", show_progress=False)
    rows = _lines(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 10, "no task may be lost"
    assert summary.request_errors == sum(r["request_errors"] for r in rows) > 0
    assert summary.complete is False and summary.usable_for_comparison is False
    assert summary.note.startswith("INCOMPLETE")
    calls = [
        e for t in _lines(tmp_path / "run" / "trajectories.jsonl") for e in t["events"] if e["type"] == "policy_call"
    ]
    # A failed request is a request error, never the policy's invalid action (issue 11 item 4).
    failed = [e for e in calls if e["error"] is not None]
    assert len(failed) == summary.request_errors and all(e["valid"] is None for e in failed)
    assert all(e["invalid_cause"] == "request_failed" for e in failed)
    judged_invalid = sum(1 for e in calls if e["valid"] is False)
    assert sum(r["invalid_actions"] for r in rows) == judged_invalid
    for r in rows:
        answered = r["policy_calls"] - r["request_errors"]
        assert r["invalid_action_rate"] == (r["invalid_actions"] / answered if answered else None)
    # Unreadable memory ops and controller decisions are invalid actions with a reason; for the
    # reader the same text is a (wrong) answer.
    garbage = [e for e in calls if e["text"] == "I am not sure what to do." and e["role"] != "reader"]
    assert garbage and all(e["valid"] is False and e["invalid_reason"] for e in garbage)
    assert all(e["invalid_cause"] == "parse" for e in garbage)  # what code reads (memsearch.records)
    assert all(e["invalid_cause"] is None for e in calls if e["valid"] is True)


def _summary_without_timing(path: Path) -> dict:
    summary = json.loads(path.read_text())
    summary.pop("timing")
    summary.pop("backend_stats")  # counts of this invocation, like timing
    summary["metrics"].pop("latency_s")
    return summary


@pytest.mark.slow
def test_resume_after_killing_the_process(hotpot_dev_dir, tmp_path):
    """Kill a real `memsearch eval` process mid-run, resume it, and get the same records as an
    uninterrupted run: no task lost, none repeated."""
    exe = Path(sys.executable).parent / "memsearch"
    with AgentServer(delay_s=0.05) as server:
        args = ["--config", str(API), "--data", str(hotpot_dev_dir), "--limit", "30"]
        for o in _api_overrides(server.base_url, "concurrency=2"):
            args += ["--set", o]
        full, cut = tmp_path / "full", tmp_path / "cut"
        subprocess.run([str(exe), "eval", "run", *args, "--out", str(full)], check=True, capture_output=True)
        proc = subprocess.Popen(
            [str(exe), "eval", "run", *args, "--out", str(cut)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.time() + 60
        while time.time() < deadline:
            traj = cut / "trajectories.jsonl"
            if traj.is_file() and traj.read_text().count("\n") >= 8:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        done_before = (cut / "trajectories.jsonl").read_text().count("\n")
        assert 8 <= done_before < 30 and not (cut / "summary.json").exists()
        subprocess.run([str(exe), "eval", "run", *args, "--out", str(cut), "--resume"], check=True, capture_output=True)
    ids = [t["task_id"] for t in _lines(cut / "trajectories.jsonl")]
    assert len(ids) == len(set(ids)) == 30
    assert _summary_without_timing(cut / "summary.json") == _summary_without_timing(full / "summary.json")
    strip = lambda rows: [{k: v for k, v in r.items() if k != "latency_s"} for r in rows]  # noqa: E731
    assert strip(_lines(cut / "metrics.jsonl")) == strip(_lines(full / "metrics.jsonl"))
    assert json.loads((cut / "summary.json").read_text())["timing"]["resumed_tasks"] == done_before


def test_a_server_that_never_answers_is_not_an_invalid_policy(hotpot_dev_dir, tmp_path):
    """Every request fails: 100% request errors, and no invalid-action rate at all (it used to
    read 1.000, blaming the policy for the transport)."""
    with AgentServer(delay_s=0.0, fail_every=1) as server:
        cfg = load_config(
            API,
            _api_overrides(
                server.base_url, "limit=3", *[f"backends.{r}.max_retries=0" for r in ("memory", "controller", "reader")]
            ),
        )
        summary = run_eval(cfg, hotpot_dev_dir, tmp_path / "run", show_progress=False)
    assert summary.request_errors > 0 and summary.tasks.failed == 3
    assert summary.metrics["invalid_action_rate"] is None and summary.metrics["invalid_actions"] == 0
    assert summary.metrics["f1"] == 0.0 and summary.metric_counts["f1"] == 3  # failed tasks stay in
