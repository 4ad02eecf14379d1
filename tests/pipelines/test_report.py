"""The MemAgent report's base-vs-trained comparison: paired differences with bootstrap CIs over
the questions both runs scored, and the verdict per acceptance criterion."""

from __future__ import annotations

import pytest

from memsearch.eval.bootstrap import paired_bootstrap
from memsearch.eval.run_diff import paired_difference
from memsearch.pipelines.memagent.report import verdict
from memsearch.records.metrics_row import MetricsRow
from memsearch.records.run_summary import RunSummary, TaskCounts


def rows(values: list[float | None]) -> dict[str, MetricsRow]:
    return {f"t{i}": MetricsRow(task_id=f"t{i}", status="ok", scores={"sub_em": v}) for i, v in enumerate(values)}


def summary(expected: int, scored: int | None = None, failed: int = 0, request_errors: int = 0) -> RunSummary:
    scored = expected if scored is None else scored
    complete = scored == expected and not failed
    return RunSummary(complete=complete, usable_for_comparison=complete and not request_errors, note=None,
                      evaluator_version=None, tasks=TaskCounts(expected, scored, failed), request_errors=request_errors)


BASE = [0, 0, 1, 0, 1, 0, 0, 1, 0, 0]
TRAINED = [1, 1, 1, 0, 1, 1, 0, 1, 1, 0]  # better on 4 questions, worse on none


def test_paired_difference_is_trained_minus_base_over_shared_questions():
    d = paired_difference(rows(BASE), rows(TRAINED), "sub_em", resamples=2000, confidence=0.95, seed=0)
    assert (d["mean_a"], d["mean_b"], d["diff"], d["n"]) == (0.7, 0.3, pytest.approx(0.4), 10)
    ref = paired_bootstrap(TRAINED, BASE, n_resamples=2000, seed=0)
    assert (d["ci_low"], d["ci_high"]) == (ref["ci_low"], ref["ci_high"])
    assert 0.0 < d["ci_low"] < 0.4 < d["ci_high"] <= 0.8
    # a question scored by one run only, or None in one run, is left out of both
    base = {**rows(BASE), "extra": MetricsRow(task_id="extra", status="ok", scores={"sub_em": 1.0})}
    trained = rows([None, *TRAINED[1:]])
    d = paired_difference(base, trained, "sub_em", resamples=2000, confidence=0.95, seed=0)
    assert d["n"] == 9 and d["diff"] == pytest.approx((6 - 3) / 9)
    assert paired_difference(rows([]), rows(TRAINED), "sub_em", 2000, 0.95, 0) is None


def test_verdicts():
    ten = summary(10)
    better = paired_difference(rows(BASE), rows(TRAINED), "sub_em", 2000, 0.95, 0)
    v = verdict("trained > base on sub_em at N=50", ten, ten, better)
    assert (v["status"], v["trained_above_base"], v["ci_excludes_0"]) == ("PASS", True, True)
    assert v["line"].startswith("PASS: trained > base on sub_em at N=50: Δ +0.400, 95% CI [+0.")
    assert "(excludes 0), n=10" in v["line"]
    # one more right answer than base, on one question of ten: higher, but the CI includes 0
    slightly = paired_difference(rows(BASE), rows([1, *BASE[1:]]), "sub_em", 2000, 0.95, 0)
    v = verdict("c", ten, ten, slightly)
    assert (v["status"], v["trained_above_base"], v["ci_excludes_0"]) == ("NOT SIGNIFICANT", True, False)
    same = paired_difference(rows(BASE), rows(BASE), "sub_em", 2000, 0.95, 0)
    assert verdict("c", ten, ten, same)["status"] == "FAIL" and (same["ci_low"], same["ci_high"]) == (0.0, 0.0)
    worse = paired_difference(rows(TRAINED), rows(BASE), "sub_em", 2000, 0.95, 0)
    v = verdict("c", ten, ten, worse)
    assert v["status"] == "FAIL" and v["ci_excludes_0"] is True
    # incomplete or erroneous runs decide nothing, whatever their numbers say
    v = verdict("c", ten, summary(10, scored=9), better)
    assert (
        v["status"] == "NOT USABLE"
        and v["problems"][0] == "trained run unusable (0 request errors, 0 failed, 1 missing)"
    )
    assert verdict("c", summary(10, request_errors=2), ten, better)["status"] == "NOT USABLE"
    assert verdict("c", ten, ten, None)["status"] == "NOT USABLE"
    # both complete, but over different questions: not a paired comparison of the set
    nine = paired_difference(rows(BASE[:9]), rows(TRAINED), "sub_em", 2000, 0.95, 0)
    assert verdict("c", ten, ten, nine)["problems"] == ["the runs did not score the same questions"]
