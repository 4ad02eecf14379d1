"""The held-out bars (pipelines/memory_policy/bar.py) and the per-decision rates they read."""

from __future__ import annotations

import copy
import json

import pytest

from memsearch.pipelines.memory_policy import bar
from memsearch.pipelines.memory_policy.heldout import decision_rates, memory_calls


def _diff(value: float, low: float) -> dict:
    return {"diff": value, "ci_low": low, "ci_high": value + (value - low), "usable": True}


def _row(precision: float | None, add: int, noop: int, over_budget: int, calls: int = 100) -> dict:
    return {"memory_support_precision": precision,
            "memory_calls": {"calls": calls, "calls_with": {"ADD": add, "UPDATE": 0, "DELETE": 0, "NOOP": noop},
                             "invalid": {"over_budget": over_budget, "truncated": 0, "unshown_source": 0, "other": 0}}}


def _passing() -> tuple[dict, dict, dict, dict]:
    """Figures of two seeds that clear every check of the pooled bar."""
    per_seed = {s: {"grpo-rules": {"memory_support_recall": _diff(0.04, -0.01)}} for s in (1, 2)}
    over = {"grpo-rules": {"memory_support_recall": _diff(0.04, 0.01), "f1": _diff(0.0, -0.02)},
            "grpo-sft": {"memory_support_recall": _diff(0.06, 0.02), "f1": _diff(0.0, -0.02)}}
    shared = {"rules": _row(0.48, 60, 40, 0), "base": _row(None, 0, 0, 0)}
    seeds = {s: {"grpo": _row(0.44, 30, 60, 5), "sft": _row(0.40, 40, 50, 9)} for s in (1, 2)}
    return per_seed, over, shared, seeds


def test_pooled_bar_holds_when_every_check_holds_and_records_its_figures():
    result = bar.evaluate("pooled", *_passing())
    assert result["holds"] is True and all(c["holds"] for c in result["checks"].values())
    assert set(result["checks"]) == {"recall_pooled", "recall_each_seed", "recall_over_sft", "precision", "f1",
                                     "ops_each_seed", "overflow_each_seed"}
    assert result["per_seed"] == {1: True, 2: True} and result["grpo_improves_on_sft"] is True
    figures = result["seed_figures"][1]
    assert figures["call_share"] == {"ADD": 0.30, "NOOP": 0.60}
    assert figures["over_budget_rate"] == {"grpo": 0.05, "sft": 0.09}
    assert result["checks"]["f1"]["ci_low"] == -0.02 and result["checks"]["f1"]["above"] == bar.F1_FLOOR


@pytest.mark.parametrize("check, breaks", [
    ("recall_pooled", lambda p, o, sh, se: o["grpo-rules"]["memory_support_recall"].update(ci_low=0.0)),
    ("recall_each_seed", lambda p, o, sh, se: p[2]["grpo-rules"]["memory_support_recall"].update(diff=-0.001)),
    ("recall_over_sft", lambda p, o, sh, se: o["grpo-sft"]["memory_support_recall"].update(ci_low=-0.01)),
    ("precision", lambda p, o, sh, se: se[1]["grpo"].update(memory_support_precision=0.4299)),
    ("precision", lambda p, o, sh, se: se[1]["grpo"].update(memory_support_precision=None)),  # cites nothing
    ("f1", lambda p, o, sh, se: o["grpo-rules"]["f1"].update(ci_low=-0.03)),
    ("ops_each_seed", lambda p, o, sh, se: se[2]["grpo"]["memory_calls"]["calls_with"].update(ADD=9)),
    ("ops_each_seed", lambda p, o, sh, se: se[1]["grpo"]["memory_calls"]["calls_with"].update(NOOP=0)),
    ("overflow_each_seed", lambda p, o, sh, se: se[1]["grpo"]["memory_calls"]["invalid"].update(over_budget=9)),
])
def test_pooled_bar_fails_on_each_check_alone(check, breaks):
    figures = copy.deepcopy(_passing())
    breaks(*figures)
    result = bar.evaluate("pooled", *figures)
    assert result["holds"] is False
    assert [name for name, c in result["checks"].items() if not c["holds"]] == [check]


def test_pooled_bar_at_its_thresholds():
    """The thresholds are inclusive where the protocol says "at least" / "not below", strict elsewhere."""
    per_seed, over, shared, seeds = _passing()
    seeds[1]["grpo"]["memory_support_precision"] = 0.48 - bar.PRECISION_MARGIN  # "not below rules - 0.05"
    seeds[1]["grpo"]["memory_calls"]["calls_with"]["ADD"] = 10  # exactly 10 % of the calls
    assert bar.evaluate("pooled", per_seed, over, shared, seeds)["holds"] is True


def test_pooled_bar_needs_usable_runs():
    per_seed, over, shared, seeds = _passing()
    per_seed[1]["grpo-rules"]["memory_support_recall"]["usable"] = False
    result = bar.evaluate("pooled", per_seed, over, shared, seeds)
    assert result["usable"] is False and result["holds"] is False


def test_pooled_extractive_reads_the_overflow_check_as_a_rate_of_zero():
    """v3's bar: the same checks as v2's; extractive decoding cannot overflow, so both over-budget
    rates are 0 and the check asks for grpo's to be 0 (v2's "below sft's" would always fail)."""
    per_seed, over, shared, seeds = _passing()
    for s in seeds.values():
        for row in s.values():
            row["memory_calls"]["invalid"]["over_budget"] = 0
    assert bar.evaluate("pooled", per_seed, over, shared, seeds)["checks"]["overflow_each_seed"]["holds"] is False
    result = bar.evaluate("pooled_extractive", per_seed, over, shared, seeds)
    assert result["holds"] is True and result["name"] == "pooled_extractive"
    assert "over-budget rate 0" in result["criterion"]
    seeds[2]["grpo"]["memory_calls"]["invalid"]["over_budget"] = 1  # the constraint let one through
    result = bar.evaluate("pooled_extractive", per_seed, over, shared, seeds)
    assert [name for name, c in result["checks"].items() if not c["holds"]] == ["overflow_each_seed"]


def test_recall_every_seed_is_recipe_v1s_bar():
    per_seed, over, shared, seeds = _passing()
    result = bar.evaluate("recall_every_seed", per_seed, over, shared, seeds)
    assert result["per_seed"] == {1: False, 2: False} and result["holds"] is False  # each seed's CI low is -0.01
    for d in per_seed.values():
        d["grpo-rules"]["memory_support_recall"]["ci_low"] = 0.001
    assert bar.evaluate("recall_every_seed", per_seed, over, shared, seeds)["holds"] is True


def _trajectory(task: str, events: list[dict], cited: list[str]) -> dict:
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

