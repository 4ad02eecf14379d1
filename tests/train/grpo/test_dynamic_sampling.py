"""Dynamic sampling (``train.grpo.dynamic_sampling``): zero-variance groups are dropped and replaced by
tasks not yet tried at the step, drawn reproducibly; the row accounting keeps the dropped rows;
and a real GRPO step on the tiny Llama logs what the filter did."""

from __future__ import annotations

import json

import pytest

from memsearch.records.trajectory import Trajectory
from memsearch.train.grpo.dynamic_sampling import has_spread, replacement_positions, sample_step


def trajectory(task: str, calls: int) -> Trajectory:
    event = {"type": "policy_call", "role": "memory", "step": 0, "error": None, "completion_ids": [1, 2],
             "logprobs": [0.0, 0.0], "prompt_ids": [3]}
    return Trajectory.from_json({"task_id": task, "status": "ok", "events": [dict(event) for _ in range(calls)]})


# Task t's two rollouts: rewards (0, 0) for even t (no spread), (0, 1) for odd t; t rows each.
TASKS = [f"t{i}" for i in range(10)]


def roll(log):
    def run(tasks, round_):
        log.append((round_, list(tasks)))
        groups = [[trajectory(t, int(t[1:])), trajectory(t, int(t[1:]))] for t in tasks]
        return groups, sum(2 * int(t[1:]) for t in tasks)
    return run


def score(groups):
    return [[0.0, float(int(g[0].task_id[1:]) % 2)] for g in groups]


def test_groups_without_spread_are_replaced_by_untried_tasks():
    log = []
    out = sample_step([0, 1, 2], TASKS, roll(log), score, filter_groups=True, max_extra_rounds=3, seed=5, step=4,
                      rank=0, role="memory")
    assert [g[0].task_id for g in out.groups] == ["t1", *[g[0].task_id for g in out.groups[1:]]]
    assert len(out.groups) == 3 and all(has_spread(r) for r in out.rewards)
    tried = [t for _, tasks in log for t in tasks]
    assert len(tried) == len(set(tried))  # a task is rolled out at most once per step
    assert [r for r, _ in log] == list(range(out.rounds + 1))
    # accounting: every generated row is either converted (kept groups) or dropped
    kept_rows = sum(2 * int(g[0].task_id[1:]) for g in out.groups)
    assert out.generated == kept_rows + out.rows_dropped
    assert out.groups_sampled == len(tried) and out.groups_dropped == out.groups_sampled - 3
    # reproducible: the same (seed, step, rank) draws the same replacements
    again = []
    sample_step([0, 1, 2], TASKS, roll(again), score, filter_groups=True, max_extra_rounds=3, seed=5, step=4, rank=0,
                role="memory")
    assert again == log


def test_rounds_are_capped_and_the_step_trains_on_fewer_groups():
    log = []
    even = [f"t{i}" for i in (0, 2, 4, 6, 8)]  # no task with spread at all
    out = sample_step([0, 1], even, roll(log), score, filter_groups=True, max_extra_rounds=2, seed=0, step=1, rank=0,
                      role="memory")
    assert out.groups == [] and out.rounds == 2 and out.groups_sampled == 5 and len(log) == 3
    # without filtering nothing is dropped and nothing more is sampled
    log = []
    out = sample_step([0, 1], even, roll(log), score, filter_groups=False, max_extra_rounds=2, seed=0, step=1,
                      rank=0, role="memory")
    assert len(out.groups) == 2 and out.rounds == 0 and out.rows_dropped == 0 and len(log) == 1


def test_replacements_never_repeat_a_tried_task_and_depend_on_the_rank():
    a = replacement_positions(20, {0, 1, 2}, 5, seed=1, step=3, round_=1, rank=0)
    b = replacement_positions(20, {0, 1, 2}, 5, seed=1, step=3, round_=1, rank=1)
    assert len(set(a)) == 5 and not set(a) & {0, 1, 2} and a != b
    assert replacement_positions(4, {0, 1, 2}, 5, seed=1, step=3, round_=1, rank=0) == [3]


@pytest.mark.slow
def test_a_grpo_step_logs_the_groups_sampled_and_dropped(tiny_model_dir, tiny_adapter_dir, hotpot_train_dir,
                                                         tmp_path):
    """The tiny random model writes no valid op in 12 tokens, so every rollout of a task earns the
    same reward: each group is dropped, two extra rounds are rolled out, and the row accounting
    still closes (generated = converted + dropped)."""
    from tests.train.grpo.test_grpo import grpo_config

    from memsearch.train.grpo.trainer import train_grpo

    cfg = grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, steps=1,
                      **{"dynamic_sampling.enabled": True, "dynamic_sampling.max_extra_rounds": 2})
    train_grpo(cfg, tmp_path / "run", echo=lambda m: None)
    (record,) = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert record["groups_sampled"] >= 2 and record["sampling_rounds"] <= 2
    assert record["groups"] + record["groups_dropped"] == record["groups_sampled"]
    assert record["rows_generated"] == record["rows_converted"] + record["rows_dropped"]
    assert record["rows_converted"] == record["rows_consumed"]
    # every group of every round had one reward: nothing kept, both rounds spent, no optimizer step
    assert record["groups"] == 0 and record["sampling_rounds"] == 2 and record["groups_sampled"] == 6
    assert record["rows_dropped"] == record["rows_generated"] > 0 and record["skipped_steps"] == 1
