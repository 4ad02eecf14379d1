"""Dynamic sampling for GRPO (DAPO, arXiv 2503.14476; verl's ``algorithm.filter_groups``): a group
whose rewards are all equal has zero advantages and teaches nothing, so it is dropped and other
tasks are rolled out in its place, for at most ``max_extra_rounds`` extra rounds per step.

A step then trains on the groups that kept a reward spread: at most ``tasks_per_step`` of them
(this rank's share), fewer when the rounds run out. Which tasks replace the dropped ones is a
function of (seed, step, round, rank): tasks not yet rolled out at this step, drawn without
replacement, so ``--resume`` repeats a step exactly. Each extra round samples with its own
per-rollout seeds (``Rollouts.config_for``).

The row-count contract still holds, with one more term: rows generated = rows converted (kept
groups) + rows dropped (the dropped groups' rows, counted from their trajectories) + the rows
of failed trajectories left out. A group's spread is that of its successful members, so a group
that request errors left without two of them is dropped and replaced (``train.grpo.failures``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memsearch.engine.episode import derived_seed
from memsearch.records.trajectory import Trajectory
from memsearch.train.grpo.batch import trainable_calls
from memsearch.train.grpo.failures import StepFaults, split_failed

Groups = list[list[Trajectory]]


@dataclass
class SampledStep:
    """One step's groups after filtering, and what the filter did (``train_log.jsonl``)."""

    groups: Groups
    rewards: list[list[float]]
    generated: int  # completions of the trained roles over every round
    rounds: int = 0  # extra rounds taken
    groups_sampled: int = 0  # groups rolled out over every round
    groups_dropped: int = 0  # zero-variance groups left out (and groups over the step's share)
    rows_dropped: int = 0
    faults: StepFaults = field(default_factory=StepFaults)  # failed requests over every round (train.grpo.failures)


def has_spread(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards differ (the same test as ``batch.build_batch``'s zero-variance count)."""
    return bool(rewards) and max(rewards) - min(rewards) >= 1e-12


def replacement_positions(n_tasks: int, tried: set[int], need: int, seed: int, step: int, round_: int,
                          rank: int) -> list[int]:
    """``need`` task indices not in ``tried``, drawn by (seed, step, round, rank)."""
    pool = [i for i in range(n_tasks) if i not in tried]
    rng = random.Random(derived_seed(seed, "resample", step, round_, rank))
    return rng.sample(pool, min(need, len(pool)))


def sample_step(positions: list[int], tasks: Sequence[Any], roll: Callable[[list[Any], int], tuple[Groups, int]],
                score: Callable[[Groups], list[list[float]]], *, filter_groups: bool, max_extra_rounds: int,
                seed: int, step: int, rank: int, role: str) -> SampledStep:
    """Roll out ``positions`` (indices into ``tasks``); with ``filter_groups``, drop the groups
    without a reward spread and roll out replacements, round by round (without it, every group
    is kept and nothing more is sampled). ``roll(tasks, round)`` returns the groups and the
    completions generated; ``score(groups)`` their rewards."""
    want = len(positions)
    groups, generated = roll([tasks[i] for i in positions], 0)
    rewards = score(groups)
    out = SampledStep([], [], generated, groups_sampled=len(groups))
    tried = set(positions)

    def keep(new_groups: Groups, new_rewards: list[list[float]]) -> None:
        out.faults.add(new_groups)
        for grp, rs in zip(new_groups, new_rewards, strict=True):
            # the spread of the successful members: a failed trajectory is no member (train.grpo.failures)
            if (has_spread(split_failed(grp, rs)[1]) or not filter_groups) and len(out.groups) < want:
                out.groups.append(grp)
                out.rewards.append(rs)
            else:
                out.groups_dropped += 1
                out.rows_dropped += sum(len(trainable_calls(tr, role)[0]) for tr in grp)

    keep(groups, rewards)
    while filter_groups and len(out.groups) < want and out.rounds < max_extra_rounds:
        extra = replacement_positions(len(tasks), tried, want - len(out.groups), seed, step, out.rounds + 1, rank)
        if not extra:
            break
        out.rounds += 1
        tried.update(extra)
        groups, generated = roll([tasks[i] for i in extra], out.rounds)
        out.generated += generated
        out.groups_sampled += len(groups)
        keep(groups, score(groups))
    return out
