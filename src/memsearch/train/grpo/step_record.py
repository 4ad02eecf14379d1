"""One line of GRPO's ``train_log.jsonl`` (``records.train_step.TrainStep``): this step's counts
summed over ranks by name, and the update's statistics (docs/training.md lists the fields)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memsearch.records.train_step import TrainStep
from memsearch.records.trajectory import Trajectory
from memsearch.train.distributed import Dist
from memsearch.train.grpo.batch import Batch
from memsearch.train.grpo.decisions import HISTOGRAM_KEYS, op_histogram
from memsearch.train.grpo.failures import failed_share
from memsearch.train.rows import TRAINED_CALL_ROLES, trained_calls

if TYPE_CHECKING:
    from memsearch.train.grpo.dynamic_sampling import SampledStep


@dataclass
class UpdateStats:
    """What ``update`` reports: first-epoch statistics summed over ranks (means per completion
    token where a mean is meant), as ``train_log.jsonl`` records them."""

    loss: float = 0.0
    tokens: float = 0.0
    clip_fraction: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    ratio_mean: float = 0.0
    grad_norm: float = 0.0
    consumed: int = 0
    logprob_mismatch: float = 0.0  # largest |rollout - recomputed| log-prob in the loss
    logprob_mismatch_mean: float = 0.0  # their mean
    denominator: float = 0.0
    skipped_steps: int = 0  # optimizer steps skipped: no row with a non-zero advantage (or no token)
    decision_entropy: float | None = None  # mean entropy at the tokens that choose (train.grpo.decisions)


def step_record(
    step: int, batch: Batch, groups: Sequence[Sequence[Trajectory]], stats: UpdateStats, dist: Dist, lr: float,
    role: str, t0: float, t_roll: float, sampled: SampledStep,
) -> TrainStep:
    """One line of the training log, summed over ranks (``groups``: the groups trained on;
    ``sampled``: what dynamic sampling rolled out and dropped, and the failed requests of all of
    it). ``trajectories`` and the reward figures are those of the trajectories trained on."""
    counts = step_counts(batch, groups, role)
    faults = sampled.faults  # every trajectory rolled out, dropped groups' too (train.grpo.failures)
    counts.update(call_reward_sum=sum(batch.call_rewards), call_rewards=float(len(batch.call_rewards)),
                  rows_dropped=float(batch.counts.dropped), rows_failed=float(batch.counts.failed),
                  request_errors=float(faults.request_errors), failed_trajectories=float(faults.failed),
                  trajectories_sampled=float(faults.trajectories),
                  masked_decision_tokens=float(batch.masked_decision_tokens), sampling_rounds=float(sampled.rounds),
                  groups_sampled=float(sampled.groups_sampled), groups_dropped=float(sampled.groups_dropped))
    total = dist.all_sum_named(counts)
    n = total["trajectories"]
    mean = total["reward_sum"] / n if n else 0.0
    var = max(0.0, total["reward_square_sum"] / n - mean * mean) if n else 0.0
    return TrainStep(
        step=step,
        reward_mean=mean,
        reward_std=var**0.5,
        call_reward_mean=_ratio(total["call_reward_sum"], total["call_rewards"]) if total["call_rewards"] else None,
        zero_variance_groups=int(total["zero_variance_groups"]),
        groups=int(total["groups"]),
        trajectories=int(n),
        rows_generated=int(total["rows_generated"]),
        rows_converted=int(total["rows_converted"]),
        rows_consumed=int(total["rows_consumed"]),
        rows_dropped=int(total["rows_dropped"]),
        rows_failed=int(total["rows_failed"]),
        groups_sampled=int(total["groups_sampled"]),
        groups_dropped=int(total["groups_dropped"]),
        sampling_rounds=int(total["sampling_rounds"]),
        rows_per_trajectory=_ratio(total["trajectory_rows"], total["trajectory_row_counts"]),
        failed_calls=int(total["failed_calls"]),
        request_errors=int(total["request_errors"]),
        failed_trajectories=int(total["failed_trajectories"]),
        failed_share=failed_share(total["failed_trajectories"], total["trajectories_sampled"]),
        invalid_rate=_ratio(total["invalid_calls"], total["calls"]),
        loss=stats.loss,
        clip_fraction=stats.clip_fraction,
        kl=stats.kl,
        entropy=stats.entropy,
        decision_entropy=stats.decision_entropy,
        masked_decision_tokens=int(total["masked_decision_tokens"]),
        ops={name: int(total[f"ops/{name}"]) for name in HISTOGRAM_KEYS},
        ratio_mean=stats.ratio_mean,
        grad_norm=stats.grad_norm,
        skipped_steps=stats.skipped_steps,
        completion_tokens=int(stats.tokens),
        prompt_tokens=int(total["prompt_tokens"]),
        logprob_mismatch=stats.logprob_mismatch,
        logprob_mismatch_mean=stats.logprob_mismatch_mean,
        lr=lr,
        rollout_s=round(t_roll, 3),
        step_s=round(time.perf_counter() - t0, 3),
    )


def step_counts(batch: Batch, groups: Sequence[Sequence[Trajectory]], role: str) -> dict[str, float]:
    """This rank's counts of one step, by name (``step_record`` sums them over ranks)."""
    trajs = [tr for grp in groups for tr in grp]
    calls = [c for tr in trajs for c in trained_calls(tr, role)]
    # the histogram is of trained memory calls: none when the trained role leaves memory out
    ops = op_histogram(trajs if "memory" in TRAINED_CALL_ROLES[role] else [])
    return {
        **{f"ops/{name}": float(ops[name]) for name in HISTOGRAM_KEYS},
        "reward_sum": sum(batch.rewards),
        "reward_square_sum": sum(r * r for r in batch.rewards),
        "trajectories": len(batch.rewards),
        "zero_variance_groups": batch.zero_variance_groups,
        "groups": batch.groups,
        "rows_generated": batch.counts.generated,
        "rows_converted": batch.counts.converted,
        "rows_consumed": batch.counts.consumed,
        "failed_calls": batch.counts.failed_calls,
        "invalid_calls": sum(1 for c in calls if c.valid is False),
        "calls": len(calls),
        "prompt_tokens": sum(len(c.prompt_ids or ()) for c in calls),
        "trajectory_rows": sum(batch.rows_per_trajectory),
        "trajectory_row_counts": len(batch.rows_per_trajectory),
    }


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0
