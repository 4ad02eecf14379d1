"""Paired bootstrap: degenerate cases with exact answers, a hand-computed example, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memsearch.eval.bootstrap as bootstrap_module
from memsearch.eval.bootstrap import paired_bootstrap


def test_identical_groups():
    a = [0.0, 1.0, 0.5, 0.25, 1.0]
    result = paired_bootstrap(a, a)
    assert result["diff"] == 0.0
    assert (result["ci_low"], result["ci_high"]) == (0.0, 0.0)
    assert result["p_value"] == 1.0
    assert result["n"] == 5
    assert result["mean_a"] == result["mean_b"] == pytest.approx(0.55)


def test_constant_shift_has_zero_width_interval():
    # Paired: task difficulty cancels, so a constant +0.1 is certain even though a varies a lot.
    b = [0.0, 0.9, 0.2, 0.5, 0.3, 0.8, 0.1]
    a = [x + 0.1 for x in b]
    result = paired_bootstrap(a, b)
    assert result["diff"] == pytest.approx(0.1)
    assert result["ci_low"] == pytest.approx(0.1)
    assert result["ci_high"] == pytest.approx(0.1)
    assert result["p_value"] == pytest.approx(1 / 10_001)


def test_hand_computed_small_example():
    # Differences d = [1, 1, 0, 0, 1]: a resample mean is k/5 with k ~ Binomial(5, 0.6).
    # P(k=0) = 0.4^5 = 0.0102 < 0.025 <= P(k<=1) = 0.087, so the 2.5% point is 0.2;
    # P(k=5) = 0.6^5 = 0.078 > 0.025, so the 97.5% point is 1.0.
    # Two-sided p: |k/5 - 0.6| >= 0.6 only when k = 0, so p ~ 0.4^5.
    a = [1, 1, 1, 0, 1]
    b = [0, 0, 1, 0, 0]
    result = paired_bootstrap(a, b, n_resamples=20_000, seed=7)
    assert result["mean_a"] == pytest.approx(0.8)
    assert result["mean_b"] == pytest.approx(0.2)
    assert result["diff"] == pytest.approx(0.6)
    assert result["ci_low"] == pytest.approx(0.2)
    assert result["ci_high"] == pytest.approx(1.0)
    assert result["p_value"] == pytest.approx(0.4**5, abs=0.003)
    assert result["ci_low"] > 0  # a is better, and the interval says so


def test_direction_flips_when_groups_swap():
    rng = np.random.default_rng(11)
    b = rng.random(60)
    a = np.clip(b + rng.normal(0.15, 0.1, size=60), 0, 1)
    forward = paired_bootstrap(a, b, seed=3)
    backward = paired_bootstrap(b, a, seed=3)
    assert forward["ci_low"] > 0
    assert backward["ci_high"] < 0
    assert backward["diff"] == pytest.approx(-forward["diff"])
    assert backward["ci_low"] == pytest.approx(-forward["ci_high"])
    assert backward["ci_high"] == pytest.approx(-forward["ci_low"])
    assert backward["p_value"] == forward["p_value"]


def test_interval_width_matches_normal_approximation():
    # For a mean of many differences the percentile interval is close to diff +- 1.96 * se.
    rng = np.random.default_rng(5)
    d = rng.normal(0.05, 0.3, size=400)
    b = rng.random(400)
    result = paired_bootstrap(b + d, b, n_resamples=20_000, seed=1)
    half_width = (result["ci_high"] - result["ci_low"]) / 2
    se = d.std() / math.sqrt(d.size)
    assert half_width == pytest.approx(1.959964 * se, rel=0.05)


def test_deterministic_for_a_seed():
    rng = np.random.default_rng(0)
    a, b = rng.random(50), rng.random(50)
    first = paired_bootstrap(a, b, seed=42)
    assert paired_bootstrap(list(a), list(b), seed=42) == first
    other = paired_bootstrap(a, b, seed=43)
    assert (other["ci_low"], other["ci_high"]) != (first["ci_low"], first["ci_high"])
    assert other["diff"] == first["diff"]


def test_chunking_does_not_change_the_result(monkeypatch):
    rng = np.random.default_rng(9)
    a, b = rng.random(37), rng.random(37)
    whole = paired_bootstrap(a, b, n_resamples=1001, seed=5)
    monkeypatch.setattr(bootstrap_module, "_MAX_CELLS_PER_CHUNK", 37 * 3)
    assert paired_bootstrap(a, b, n_resamples=1001, seed=5) == whole


def test_single_task():
    result = paired_bootstrap([0.7], [0.2])
    assert result["diff"] == pytest.approx(0.5)
    assert result["ci_low"] == result["ci_high"] == pytest.approx(0.5)
    assert result["p_value"] is None


def test_confidence_controls_width():
    rng = np.random.default_rng(2)
    a, b = rng.random(80), rng.random(80)
    wide = paired_bootstrap(a, b, confidence=0.99)
    narrow = paired_bootstrap(a, b, confidence=0.5)
    assert wide["ci_low"] < narrow["ci_low"] < narrow["ci_high"] < wide["ci_high"]
    assert wide["confidence"] == 0.99 and wide["n_resamples"] == 10_000 and wide["seed"] == 0


@pytest.mark.parametrize(
    ("a", "b", "message"),
    [
        ([1.0, 0.0], [1.0], r"len\(a\)=2, len\(b\)=1"),
        ([], [], "at least one task"),
        ([1.0, None], [1.0, 0.0], r"a\[1\] is None: drop that task"),
        ([1.0, 0.0], [1.0, math.nan], r"b\[1\] is nan"),
        ([1.0, 0.0], [1.0, math.inf], r"b\[1\] is inf"),
        ([[1.0], [0.0]], [[1.0], [0.0]], "one-dimensional"),
        (["x"], [1.0], "only numbers"),
    ],
)
def test_refuses_bad_input(a, b, message):
    with pytest.raises(ValueError, match=message):
        paired_bootstrap(a, b)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_resamples": 0}, "n_resamples"),
        ({"n_resamples": 10.5}, "n_resamples"),
        ({"confidence": 1.0}, "confidence"),
        ({"confidence": 0.0}, "confidence"),
    ],
)
def test_refuses_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        paired_bootstrap([1.0, 0.0], [0.0, 0.0], **kwargs)


@settings(max_examples=60, deadline=None)
@given(pairs=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=2, max_size=30))
def test_interval_properties(pairs):
    a = [x for x, _ in pairs]
    b = [y for _, y in pairs]
    result = paired_bootstrap(a, b, n_resamples=500)
    d = np.subtract(a, b)
    assert d.min() - 1e-12 <= result["ci_low"] <= result["ci_high"] <= d.max() + 1e-12
    assert result["diff"] == pytest.approx(result["mean_a"] - result["mean_b"], abs=1e-12)
    assert 0 < result["p_value"] <= 1
