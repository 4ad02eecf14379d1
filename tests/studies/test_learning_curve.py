"""studies.memory_policy.learning_curve (module and command): the slope of a
GRPO run's validation curve, its interval, and the steps it implies, checked against scipy's own
regression and against exact lines; read from real train logs (v3's pilots) and a real rules run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from studies.memory_policy import learning_curve
from studies.memory_policy.learning_curve import estimate, fit_slope, log_curves

from memsearch.assets.samples import config_path
from memsearch.config import load_config
from memsearch.errors import InputError
from memsearch.eval.runner import run_eval

PILOTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "memory_policy_cpu_v3"


def write_log(path, validation, reward=None, step_s=50.0):
    """A GRPO train log in the trainer's row layout: training rows (reward_mean, step_s) and the
    evaluation rows (eval_memory_support_recall) at the steps given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"step": s, "eval_memory_support_recall": v, "eval_f1": 0.1} for s, v in validation.items()]
    for step, value in (reward or {}).items():
        rows.append({"step": step, "reward_mean": value, "step_s": step_s})
    path.write_text("".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: r["step"])))
    return path


def test_one_series_matches_scipy_linregress_on_a_real_pilot_log():
    curve = log_curves(PILOTS / "pilot3_grpo1_train_log.jsonl", "memory_support_recall")["validation"]
    assert sorted(curve) == [0, 10, 20, 30, 40, 50, 60]
    assert curve[60] == pytest.approx(0.264, abs=5e-4)
    fit = fit_slope({"p3": curve})
    ref = stats.linregress(list(curve), list(curve.values()))
    assert fit["slope"] == pytest.approx(ref.slope, rel=1e-12)
    assert fit["se"] == pytest.approx(ref.stderr, rel=1e-9)
    half = stats.t.ppf(0.975, len(curve) - 2) * ref.stderr
    assert fit["ci"] == pytest.approx([ref.slope - half, ref.slope + half], rel=1e-9)
    assert fit["fitted_last"]["p3"] == pytest.approx(ref.intercept + ref.slope * 60, rel=1e-12)


def test_series_keep_their_own_intercepts():
    # two seeds on parallel lines, 0.1 apart: the pooled slope is theirs, not the one the offset fakes
    steps = [0, 10, 20, 30]
    a = {s: 0.20 + 0.001 * s for s in steps}
    b = {s + 30: 0.10 + 0.001 * (s + 30) - 0.03 for s in steps}  # later steps, lower line
    fit = fit_slope({"a": a, "b": b})
    assert fit["slope"] == pytest.approx(0.001, rel=1e-9)
    assert fit["ci"] == pytest.approx([0.001, 0.001], abs=1e-12)
    naive = np.polyfit(list(a) + list(b), list(a.values()) + list(b.values()), 1)[0]
    assert naive < 0  # what one line through both would say


def test_steps_and_hours_follow_from_the_fit(tmp_path):
    # exact lines: recall rises 0.001 a step from 0.25 (seed 1) and 0.27 (seed 2); fitted at step 60:
    # 0.31 and 0.33, mean 0.32; target 0.33 + 0.02 = 0.35 -> 30 more steps at 72 s = 0.6 h
    logs = {
        "seed-1": write_log(tmp_path / "s1.jsonl", {s: 0.25 + 0.001 * s for s in range(0, 61, 10)},
                            {s: 0.2 + 0.002 * s for s in range(1, 61)}, step_s=72.0),
        "seed-2": write_log(tmp_path / "s2.jsonl", {s: 0.27 + 0.001 * s for s in range(0, 61, 10)},
                            {s: 0.3 + 0.002 * s for s in range(1, 61)}, step_s=72.0),
    }
    result = estimate(logs, baseline=0.33, margin=0.02)
    assert result["fitted_last_mean"] == pytest.approx(0.32)
    assert result["gap"] == pytest.approx(0.03)
    assert result["steps_at_point"] == pytest.approx(30.0)
    assert result["steps_at_upper"] == pytest.approx(30.0)
    assert result["hours_at_point"] == pytest.approx(0.6)
    assert result["reward_slope"]["slope"] == pytest.approx(0.002)
    assert result["last_step"] == 60


def test_flat_or_falling_curves_give_no_finite_steps_and_a_closed_gap_gives_zero(tmp_path):
    falling = {s: 0.30 - 0.0005 * s + (0.01 if s % 20 else -0.01) for s in range(0, 61, 10)}
    logs = {"seed-1": write_log(tmp_path / "f.jsonl", falling, {1: 0.2, 2: 0.3, 3: 0.25})}
    result = estimate(logs, baseline=0.315)
    assert result["validation_slope"]["ci"][0] < result["validation_slope"]["slope"] < 0
    assert result["steps_at_point"] is None
    up = result["validation_slope"]["ci"][1]
    assert result["steps_at_upper"] == (None if up <= 0 else pytest.approx(result["gap"] / up))
    # the baseline is already beaten at the last step: nothing more to train
    assert estimate(logs, baseline=0.1)["steps_at_upper"] == 0.0


def test_refusals(tmp_path):
    with pytest.raises(InputError, match="no such train log"):
        log_curves(tmp_path / "missing.jsonl", "memory_support_recall")
    one = write_log(tmp_path / "one.jsonl", {0: 0.3}, {1: 0.2})
    with pytest.raises(InputError, match="1 validation evaluation"):
        log_curves(one, "memory_support_recall")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 0}\n{"step": 1, oops\n')
    with pytest.raises(InputError, match=r"bad.jsonl:2.*invalid JSON"):
        log_curves(bad, "memory_support_recall")
    # three points in two series leave no degree of freedom for an interval
    with pytest.raises(InputError, match="too few"):
        fit_slope({"a": {0: 0.1, 10: 0.2}, "b": {0: 0.3}})


def test_script_reads_a_real_baseline_run_and_never_overwrites(tmp_path, hotpot_dev_dir, capsys):
    rules = tmp_path / "rules"
    run_eval(load_config(config_path("group_b_rules.toml"), ["limit=6"]), hotpot_dev_dir, rules, show_progress=False)
    baseline = json.loads((rules / "summary.json").read_text())["metrics"]["memory_support_recall"]
    script = learning_curve
    out = tmp_path / "estimate.json"
    logs = [str(PILOTS / "pilot3_grpo1_train_log.jsonl"), str(PILOTS / "pilot4_grpo1_train_log.jsonl")]
    assert script.main([*logs, "--baseline", str(rules), "--margin", "0.03", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"memory_support_recall {baseline:.4f} on 6 questions" in printed
    result = json.loads(out.read_text())
    assert result["target"] == pytest.approx(baseline + 0.03)
    assert len(result["points"]) == 2 and result["validation_slope"]["points"] == 14
    assert result["baseline_run"]["tasks"]["scored"] == 6
    before = out.read_text()
    assert script.main([*logs, "--baseline", str(rules), "--out", str(out)]) == 2
    assert "never overwritten" in capsys.readouterr().err and out.read_text() == before
    assert script.main([*logs, "--baseline", str(tmp_path)]) == 2
    assert "summary.json: missing" in capsys.readouterr().err
