"""The held-out comparison's records (pipelines/memory_policy/heldout.py): memory calls counted
per cause code, the per-decision rates, the paired differences recomputed from a published
folder, the pipeline report on old summaries, and a config that still names a bar."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.errors import InputError
from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline
from memsearch.pipelines.memory_policy.heldout import INVALID_KEYS, decision_rates, memory_calls, paired_differences
from memsearch.pipelines.memory_policy.report import render_heldout
from memsearch.records.causes import InvalidCause
from memsearch.records.trajectory import ENGINE_VERSION

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def _trajectory(task: str, events: list[dict], cited: list[str]) -> dict:
    """A trajectory as the engine writes it: each memory call's executed ops in its action and in
    its step's memory event (the one copy the record reads)."""
    executed = {e["step"]: e["action"]["memory"]["executed"] for e in events if e["type"] == "policy_call"}
    events = [{**e, "executed": executed.get(e["step"], {})} if e["type"] == "memory" else e for e in events]
    return {"task_id": task, "events": events, "memory_cited": cited}


def _call(step: int, executed: dict, valid: bool = True, reason: str | None = None) -> dict:
    return {"type": "policy_call", "role": "memory", "step": step, "valid": valid, "invalid_reason": reason,
            "finish_reason": "stop", "action": {"memory": {"executed": executed}}}


def test_decision_rates_and_call_shares_from_a_run(tmp_path):
    """Three memory calls on one question with gold {d1:0, d2:0}: the first keeps the shown gold
    sentence, the second adds a non-gold one and misses d2:0, the third overflows the budget."""
    over = "memory after the batch would be 120 tokens, over the budget of 96"
    noop, add = {"ADD": 0, "UPDATE": 0, "DELETE": 0, "NOOP": 1}, {"ADD": 1, "UPDATE": 0, "DELETE": 0, "NOOP": 0}
    events = [
        {"type": "search", "step": 0, "shown": ["d1:0", "d1:1"]}, _call(0, {**add, "ADD": 2}),
        {"type": "memory", "step": 0, "valid": True, "reason": None, "sources_before": []},
        {"type": "search", "step": 1, "shown": ["d2:0", "d3:0"]}, _call(1, add),
        {"type": "memory", "step": 1, "valid": True, "reason": None, "sources_before": ["d1:0", "d1:1"]},
        {"type": "search", "step": 2, "shown": ["d2:0", "d4:0"]},
        _call(2, {k: 0 for k in noop}, valid=False, reason=over),
        {"type": "memory", "step": 2, "valid": False, "reason": over, "sources_before": ["d1:0", "d1:1", "d3:0"]},
        {"type": "search", "step": 3, "shown": ["d5:0"]}, _call(3, noop),
        {"type": "memory", "step": 3, "valid": True, "reason": None, "sources_before": ["d1:0", "d1:1", "d3:0"]},
    ]
    run = tmp_path / "run"
    run.mkdir()
    (run / "trajectories.jsonl").write_text(json.dumps(_trajectory("q1", events, ["d1:0", "d1:1", "d3:0"])) + "\n")
    rates = decision_rates(run, {"q1": {"d1:0", "d2:0"}})
    # gold shown and not yet held: d1:0 (step 0, kept), d2:0 (step 1, missed), d2:0 (step 2, missed)
    assert rates["gold_shown"] == 3 and rates["gold_kept_share"] == pytest.approx(1 / 3, abs=1e-4)
    assert rates["junk_ids_per_call"] == pytest.approx(2 / 4)  # d1:1 at step 0, d3:0 at step 1
    assert rates["overflow_rate"] == 0.25
    # gold calls: steps 0-2 (stored at 0 and 1, the overflow at 2 stored nothing); other: step 3
    assert rates["gold_calls"] == 3 and rates["store_rate_gold_calls"] == pytest.approx(2 / 3, abs=1e-4)
    assert rates["store_rate_other_calls"] == 0.0
    assert rates["gold_call_outcomes"] == {"kept_gold": 1, "stored_other_only": 1, "stored_nothing": 0,
                                           "over_budget": 1, "invalid_other": 0}
    calls = memory_calls(run)
    assert calls["calls"] == 4 and calls["calls_with"] == {"ADD": 2, "UPDATE": 0, "DELETE": 0, "NOOP": 1}
    assert calls["ops_executed"]["ADD"] == 3 and calls["invalid"]["over_budget"] == 1


def test_gold_call_outcomes_tell_a_noop_from_a_rejected_call(tmp_path):
    """Two gold calls that keep nothing: one valid NOOP, one batch rejected for citing an unshown id."""
    unshown = "source d9:0 was not shown"
    events = [
        {"type": "search", "step": 0, "shown": ["d1:0"]}, _call(0, {"NOOP": 1}),
        {"type": "memory", "step": 0, "valid": True, "reason": None, "sources_before": []},
        {"type": "search", "step": 1, "shown": ["d2:0"]}, _call(1, {}, valid=False, reason=unshown),
        {"type": "memory", "step": 1, "valid": False, "reason": unshown, "sources_before": []},
    ]
    run = tmp_path / "run"
    run.mkdir()
    (run / "trajectories.jsonl").write_text(json.dumps(_trajectory("q1", events, [])) + "\n")
    rates = decision_rates(run, {"q1": {"d1:0", "d2:0"}})
    assert rates["gold_call_outcomes"] == {"kept_gold": 0, "stored_other_only": 0, "stored_nothing": 1,
                                           "over_budget": 0, "invalid_other": 1}
    assert rates["gold_kept_share"] == 0.0 and rates["overflow_rate"] == 0.0



def _coded(valid, cause=None, finish="stop") -> dict:
    return {"type": "policy_call", "role": "memory", "valid": valid, "invalid_cause": cause, "finish_reason": finish,
            "action": {"memory": {"executed": {}}}}


def test_invalid_memory_calls_are_counted_per_cause_code(tmp_path):
    """Each invalid call under its cause code, a call cut at its token limit as truncated whatever its
    code; valid calls, failed requests (valid None) and other roles' calls are not invalid memory calls."""
    events = [_coded(False, "parse"), _coded(False, "over_budget"), _coded(False, "over_budget"),
              _coded(False, "unknown_id"), _coded(False, "parse", finish="length"), _coded(True),
              _coded(None, "request_failed"), {**_coded(False, "parse"), "role": "reader"}]
    (tmp_path / "trajectories.jsonl").write_text(
        json.dumps({"task_id": "q1", "engine_version": ENGINE_VERSION, "events": events}) + "\n")
    calls = memory_calls(tmp_path)
    assert list(calls["invalid"]) == list(INVALID_KEYS) and "request_failed" not in INVALID_KEYS
    assert set(INVALID_KEYS) == {"truncated"} | {c.value for c in InvalidCause} - {"request_failed"}
    assert {k: v for k, v in calls["invalid"].items() if v} == {"truncated": 1, "parse": 1, "over_budget": 2,
                                                                "unknown_id": 1}
    assert calls["calls"] == 7 and calls["invalid_rate"] == round(5 / 7, 4)


def test_paired_differences_recompute_a_published_comparison_from_its_metrics():
    """docs/results/memory_policy_cpu_v3: the per-seed and pooled differences summary.json holds are
    what paired_differences gives on the published metrics.jsonl.gz (same seed, resamples, order)."""
    folder = RESULTS / "memory_policy_cpu_v3"
    summary = json.loads((folder / "summary.json").read_text())
    seeds = {s: {p: folder / f"seed-{s}" / "heldout" / p for p in ("sft", "grpo")} for s in ("1", "2", "3")}
    per_seed, over = paired_differences({p: folder / "heldout" / p for p in ("base", "rules")}, seeds,
                                        dict.fromkeys(seeds, True), 10_000, 0.95, 0)
    assert per_seed == summary["per_seed"] and over == summary["over_seeds"]
    assert round(over["grpo-rules"]["memory_support_recall"]["ci_low"], 3) == -0.055


@pytest.mark.parametrize("name", ["memory_policy_cpu", "memory_policy_cpu_v2", "memory_policy_cpu_v3",
                                  "memory_policy_cpu/ablation-cold-start"])
def test_the_report_renders_published_summaries_written_with_a_bar_and_grouped_causes(name):
    summary = json.loads((RESULTS / name / "summary.json").read_text())
    assert "bar" in summary and set(summary["policies"]["shared"]["rules"]["memory_calls"]["invalid"]) == {
        "over_budget", "truncated", "unshown_source", "other"}
    text = "\n".join(render_heldout(None, summary))
    assert "Bar (" not in text and "### Over seeds" in text
    seed, rows = next(iter(summary["policies"]["seeds"].items()))
    recall = rows["grpo"]["memory_support_recall"]
    assert f"### Seed {seed}" in text and f"| grpo | {recall:.3f} |" in text
    d = summary["over_seeds"]["grpo-rules"]["memory_support_recall"]
    assert f"| grpo-rules | memory_support_recall | {d['mean_a']:.3f} | {d['mean_b']:.3f} | {d['diff']:+.3f} |" in text


def test_the_report_lists_the_invalid_calls_that_occurred_by_cause():
    summary = json.loads((RESULTS / "memory_policy_cpu_v3" / "summary.json").read_text())
    rules = summary["policies"]["shared"]["rules"]
    rules["memory_calls"]["invalid"] = {**dict.fromkeys(INVALID_KEYS, 0), "parse": 2, "truncated": 1}
    text = "\n".join(render_heldout(None, summary))
    line = next(x for x in text.splitlines() if x.startswith("| rules | 0.303 |"))
    assert "| truncated 1, parse 2 |" in line
    base = next(x for x in text.splitlines() if x.startswith("| base | 0.010 |"))
    assert "| 0.000 | 0 | 8 / 0 / 0 / 579 |" in base  # no invalid call: the cell says 0


def test_a_config_that_still_names_a_bar_is_refused_naming_the_study():
    """The bar left the pipeline: an old config's `bar` is an error that says where it went, not
    an unknown field, and not silently dropped."""
    with pytest.raises(InputError) as exc:
        load_config(ROOT / "configs" / "memory_policy_cpu.toml", ['bar="pooled"'], model=MemoryPolicyPipeline)
    message = str(exc.value)
    assert "bar: the pipeline no longer judges a bar" in message and "studies/protocols.toml" in message
    assert "unknown field" not in message
    assert "bar" not in MemoryPolicyPipeline.model_fields
