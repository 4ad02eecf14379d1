"""The two corrected readings of the v3 record (docs/results/memory_policy_cpu_v3/README.md,
"Two readings corrected"), recomputed from the committed train logs through ``read_train_log``."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from memsearch.records.train_step import TrainStep, read_train_log

V3 = Path(__file__).resolve().parents[2] / "docs" / "results" / "memory_policy_cpu_v3"
LOGS = {"pilot3": "pilot3_grpo1_train_log.jsonl", "pilot4": "pilot4_grpo1_train_log.jsonl",
        **{f"seed{n}": f"seed-{n}/grpo1/train_log.jsonl" for n in (1, 2, 3)}}


def _trained(name: str) -> dict[int, TrainStep]:
    return {s.step: s for s in read_train_log(V3 / LOGS[name]) if s.trained}


def _reward_correlation(a: str, b: str) -> float:
    first, second = _trained(a), _trained(b)
    steps = sorted(first.keys() & second.keys())
    assert len(steps) == 60
    return statistics.correlation([first[s].reward_mean for s in steps], [second[s].reward_mean for s in steps])


def test_the_step_reward_follows_the_question_order_not_learning():
    assert (V3 / LOGS["pilot3"]).read_bytes() == (V3 / LOGS["seed1"]).read_bytes()
    assert _reward_correlation("pilot3", "pilot4") == pytest.approx(0.918, abs=5e-4)
    assert [round(_reward_correlation(a, b), 3) for a, b in (("seed1", "seed2"), ("seed1", "seed3"),
                                                             ("seed2", "seed3"))] == [0.078, -0.119, -0.003]

    def call_reward(name: str, first: int, last: int) -> float:
        values = [s.call_reward_mean for n, s in _trained(name).items() if first <= n <= last]
        return round(sum(values) / len(values), 3)

    windows = ((1, 20), (21, 40), (41, 60))
    assert [[call_reward(f"seed{n}", *w) for w in windows] for n in (1, 2, 3)] == [
        [0.042, 0.040, 0.049], [0.033, 0.034, 0.054], [0.053, 0.038, 0.038]]


def test_kl_per_completion_is_far_larger_than_per_token():
    def per_completion(step: TrainStep) -> float:
        return step.kl * step.completion_tokens / step.rows_consumed

    peaks = {name: max(per_completion(s) for s in _trained(name).values()) for name in LOGS}
    assert [round(peaks[f"seed{n}"], 3) for n in (1, 2, 3)] == [0.257, 0.329, 0.286]
    assert round(peaks["pilot4"], 3) == 0.566
    assert max(s.kl for n in (1, 2, 3) for s in _trained(f"seed{n}").values()) == pytest.approx(0.0178, abs=5e-5)
    lengths = [s.completion_tokens / s.rows_consumed for n in (1, 2, 3) for s in _trained(f"seed{n}").values()]
    assert round(min(lengths), 1) == 16.5 and round(max(lengths), 1) == 21.6
