"""A GRPO step's rows (``train.grpo.batch``): advantages, credit assignment and the row-count
contract, against hand-computed values."""

from __future__ import annotations

import pytest

from memsearch.records.trajectory import Trajectory
from memsearch.train.grpo.batch import (
    RowCountError,
    RowCounts,
    build_batch,
    group_advantages,
    rows_from_trajectory,
)


def call(role, step, n_tokens=3, error=None, valid=True, constraint=None):
    return {
        "type": "policy_call",
        "role": role,
        "step": step,
        "error": error,
        "valid": valid,
        "prompt_ids": None if error else [1, 2, 3],
        "completion_ids": None if error else list(range(10, 10 + n_tokens)),
        "logprobs": None if error else [-0.5] * n_tokens,
        "constraint_id": constraint,
    }


def traj(task, *calls):
    return Trajectory.from_json({"task_id": task, "status": "ok", "events": [{"type": "search", "step": 0}, *calls]})


def test_group_advantages_hand_computed():
    assert group_advantages([1.0, 0.0, 0.5, 0.5]) == [0.5, -0.5, 0.0, 0.0]
    # unbiased std of [0.5,-0.5,0,0] = sqrt(0.5/3)
    scaled = group_advantages([1.0, 0.0, 0.5, 0.5], std_scale=True)
    assert scaled[0] == pytest.approx(0.5 / (0.5 / 3) ** 0.5, rel=1e-5)
    assert group_advantages([0.3, 0.3, 0.3], std_scale=True) == [0.0, 0.0, 0.0]  # zero variance: no signal, no NaN


def test_share_and_split_credit():
    """A trajectory's advantage reaches its rows whole (``share``) or in equal parts (``split``),
    set when each row is built."""
    trajs = [traj("t", *(call("memory", s) for s in range(n))) for n in (1, 2, 4)]

    def advantages(credit):
        return [[r.advantage for r in rows_from_trajectory(t, "memory", i, 0, advantage=a, credit=credit)[0]]
                for i, (t, a) in enumerate(zip(trajs, [0.6, -0.4, 0.8], strict=True))]

    assert advantages("share") == [[0.6], [-0.4, -0.4], [0.8] * 4]
    assert advantages("split") == [[0.6], [-0.2, -0.2], [0.2] * 4]
    with pytest.raises(ValueError, match="credit"):
        advantages("spread")
    with pytest.raises(ValueError, match="credit"):
        build_batch([trajs[:2]], [[1.0, 0.0]], role="memory", credit="spread", std_scale=False, generated=3)


def test_normalize_then_expand_drops_nothing():
    """The advantage is per trajectory (from its reward), not per row: a trajectory with more rows
    does not weigh more in the group mean, and every row of every trajectory is kept."""
    group = [
        traj("t", call("memory", 0), call("memory", 1), call("memory", 2), call("reader", 0)),
        traj("t", call("memory", 0)),
    ]
    batch = build_batch([group], [[1.0, 0.0]], role="memory", credit="split", std_scale=False, generated=4)
    assert batch.advantages == [0.5, -0.5]  # mean over trajectories, not rows
    assert [r.advantage for r in batch.rows] == pytest.approx([0.5 / 3] * 3 + [-0.5])
    assert batch.rows_per_trajectory == [3, 1]
    assert batch.counts.generated == batch.counts.converted == 4


def test_overwrite_role_trains_update_turns_and_final_answer():
    t = traj("t", call("memory", 0), call("memory", 1), call("reader", 0))
    rows, failed = rows_from_trajectory(t, "memagent", index=5, group_index=2)
    assert [(r.role, r.step, r.trajectory, r.group_index) for r in rows] == [
        ("memory", 0, 5, 2),
        ("memory", 1, 5, 2),
        ("reader", 0, 5, 2),
    ]
    assert failed == 0
    # per-turn alignment: ids, log-probs and mask have one entry per completion token
    for r in rows:
        assert len(r.completion_ids) == len(r.rollout_logprobs) == len(r.loss_mask) == 3


def test_failed_calls_are_counted_not_rows_and_zero_variance_groups_logged():
    groups = [
        [traj("a", call("memory", 0, error="timeout")), traj("a", call("memory", 0))],
        [traj("b", call("memory", 0)), traj("b", call("memory", 0))],
    ]
    batch = build_batch(groups, [[0.0, 1.0], [0.5, 0.5]], role="memory", credit="share", std_scale=False, generated=3)
    assert batch.counts.failed_calls == 1
    assert batch.counts.generated == batch.counts.converted == 3
    assert batch.zero_variance_groups == 1 and batch.groups == 2


def test_calls_without_token_ids_are_a_configuration_error():
    t = traj("t", {**call("memory", 0), "completion_ids": None})
    with pytest.raises(ValueError, match="local hf policy"):
        rows_from_trajectory(t, "memory", 0, 0)


def test_row_count_contract():
    RowCounts(generated=4, converted=4, consumed=4).check()
    with pytest.raises(RowCountError, match="generated 4, converted 4, dropped 0, failed 0, consumed 3"):
        RowCounts(generated=4, converted=4, consumed=3).check()
    # rows of groups dynamic sampling dropped were generated but never converted
    RowCounts(generated=6, converted=4, consumed=4, dropped=2).check()
    with pytest.raises(RowCountError, match="generated 6, converted 4, dropped 1, failed 0, consumed 4"):
        RowCounts(generated=6, converted=4, consumed=4, dropped=1).check()
    # so were the rows failed trajectories left out (train.grpo.failures)
    RowCounts(generated=7, converted=4, consumed=4, dropped=2, failed=1).check()
    with pytest.raises(RowCountError, match="generated 7, converted 4, dropped 2, failed 0, consumed 4"):
        RowCounts(generated=7, converted=4, consumed=4, dropped=2).check()


def test_trained_roles_are_defined_once_and_cover_call_roles_only():
    """A trained role (what a config trains) names call roles (what a policy call is); the GRPO
    config accepts exactly the trained roles."""
    from typing import get_args

    from memsearch.records.trajectory import CALL_ROLES
    from memsearch.train.config import GRPOConfig
    from memsearch.train.rows import TRAINED_CALL_ROLES, TRAINED_ROLES

    assert CALL_ROLES == ("memory", "controller", "reader")
    assert TRAINED_ROLES == tuple(TRAINED_CALL_ROLES) == ("memory", "controller", "memagent")
    assert all(set(calls) <= set(CALL_ROLES) for calls in TRAINED_CALL_ROLES.values())
    assert get_args(GRPOConfig.model_fields["role"].annotation) == TRAINED_ROLES


def test_rows_from_a_trajectory_know_an_over_budget_rejection_from_other_invalid_calls():
    over = {**call("memory", 0, valid=False),
            "invalid_reason": "memory after the batch would be 120 tokens, over the budget of 96 tokens"}
    unshown = {**call("memory", 1, valid=False), "invalid_reason": "ADD: source d9:0 was not shown"}
    rows, failed = rows_from_trajectory(traj("q", over, unshown, call("memory", 2)), "memory", 0, 0)
    assert failed == 0
    assert [(r.valid, r.over_budget) for r in rows] == [(False, True), (False, False), (True, False)]
