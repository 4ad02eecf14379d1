"""The held-out bars (studies/memory_policy/bar.py) on the comparison the pipeline writes."""

from __future__ import annotations

import copy

import pytest
from studies.memory_policy import bar

from memsearch.pipelines.memory_policy.heldout import INVALID_KEYS


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


def test_a_bar_reads_invalid_calls_counted_per_cause_code_as_it_read_the_old_groups():
    """New summaries count invalid calls per cause code, old ones in four groups; over_budget is a
    key of both, so every check gives the same figures on either."""
    per_seed, over, shared, seeds = _passing()
    grouped = bar.evaluate("pooled", per_seed, over, shared, seeds)
    for rows in (shared, *seeds.values()):
        for row in rows.values():
            old = row["memory_calls"]["invalid"]
            row["memory_calls"]["invalid"] = {**dict.fromkeys(INVALID_KEYS, 0), "over_budget": old["over_budget"],
                                              "parse": 3, "unknown_id": 1}
    assert bar.evaluate("pooled", per_seed, over, shared, seeds) == grouped
