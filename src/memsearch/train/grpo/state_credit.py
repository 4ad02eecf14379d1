"""Per-decision credit for the memory role: state groups (``credit.mode = "state"``, docs/design.md §7).

Trajectory-level credit gives every memory call of a trajectory the trajectory's advantage: an
ADD that overflowed the budget and the gold ADD beside it are pushed alike, and rollouts that
reached different memories are compared as if they had decided from the same one. State groups
compare decisions taken from the *same* state instead (GiGPO, arXiv 2505.10978; the local groups
of Memory-R2's LoGo-GRPO): at every memory call of a sampled episode the engine draws
``state_group_size`` completions of the same prompt (same memory, same evidence), applies each to
a copy of the memory, records each branch's outcome in the call's event (``branches``), and
continues the episode from one of them, chosen at random with the episode's seed
(``engine.episode``). Here every branch becomes a row whose advantage is its per-call reward
minus the mean over its branches (optionally divided by their std).

**The per-call reward is label shaping** (train labels only; ``StateReward``), with G = the
question's gold supporting facts:

- a branch the memory accepted: ``gold_gain`` x (gold ids kept by faithful items after it -
  before it) / |G|, minus ``junk_penalty`` x (ids newly cited that are not gold) / |G|; a NOOP
  (nothing new) scores 0, a DELETE of a faithful gold item loses what it held;
- a batch rejected for overflowing the memory budget: - ``overflow_penalty`` x (0.5 + 0.5 x
  min(1, tokens over / budget)), so a batch twice the budget costs the whole penalty and one a
  token over costs half of it;
- any other rejected or unreadable batch: - ``rejected_batch_penalty``;
- a branch whose request failed has no completion: no row, no part of the group;
- a trajectory with a request error (``train.grpo.failures``) gives no row; the global term below is
  taken over its task's successful trajectories.

With ``global_weight`` > 0 the continued branch's rows also get ``global_weight`` x the
trajectory's own group advantage (the trajectory reward, ``train.grpo.reward``, inside its task's
group): the local-plus-global sum of LoGo-GRPO, for the decisions the trajectory's outcome
followed from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from memsearch.records.events import BranchOutcome, PolicyCall
from memsearch.records.trajectory import Trajectory
from memsearch.train.grpo.batch import Batch, group_advantages, grpo_row
from memsearch.train.grpo.decisions import DecisionRule
from memsearch.train.grpo.failures import split_failed
from memsearch.train.rows import Row, trained_calls

if TYPE_CHECKING:
    from memsearch.data.records import Label
    from memsearch.train.config import StateReward


def _over_budget(branch: BranchOutcome) -> bool:
    return branch.status == "rejected" and (branch.over_budget_tokens or 0) > 0


def call_reward(branch: BranchOutcome, call: PolicyCall, gold: set[str], settings: StateReward) -> float:
    """The per-call reward of one branch of ``call`` (module doc), against the ids the call's
    memory kept and cited before any branch applied (``kept_before``, ``cited_before``)."""
    if _over_budget(branch):
        over = (branch.over_budget_tokens or 0) / max(1, branch.budget_tokens or 0)
        return -settings.overflow_penalty * (0.5 + 0.5 * min(1.0, over))
    if branch.status != "applied":
        return -settings.rejected_batch_penalty
    if not gold:
        return 0.0
    kept_gain = len(set(branch.kept or ()) & gold) - len(set(call.kept_before or ()) & gold)
    junk = len((set(branch.cited or ()) - set(call.cited_before or ())) - gold)
    return (settings.gold_gain * kept_gain - settings.junk_penalty * junk) / len(gold)


def call_branches(call: PolicyCall) -> tuple[list[tuple[BranchOutcome, bool]], int]:
    """The branches of ``call`` with a completion, each with whether the episode continued from
    it, and the number of failed branches."""
    kept, failed = [], 0
    for k, branch in enumerate(call.branches or ()):
        if branch.error or branch.completion_ids is None:
            failed += 1
            continue
        kept.append((branch, k == call.branch_chosen))
    return kept, failed


def state_group_advantages(scores: Sequence[float], continued: Sequence[bool], trajectory_advantage: float, *,
                           std_scale: bool, global_weight: float) -> list[float]:
    """The advantages of one state group's branches (module doc): each branch's per-call reward
    minus the group's mean (optionally over its std), plus ``global_weight`` x the trajectory's
    group advantage on the branch the episode continued from."""
    local = group_advantages(scores, std_scale)
    return [adv + (global_weight * trajectory_advantage if chosen else 0.0)
            for chosen, adv in zip(continued, local, strict=True)]


def branch_rows(call: PolicyCall, branches: Sequence[tuple[BranchOutcome, bool]], advantages: Sequence[float],
                trajectory: int, group_index: int, decisions: DecisionRule | None = None) -> list[Row]:
    """One complete row per branch (``call_branches``), with its advantage."""
    return [grpo_row(prompt_ids=call.prompt_ids or (), completion_ids=branch.completion_ids or (),
                     logprobs=branch.logprobs or (), trajectory=trajectory, group_index=group_index, role=call.role,
                     step=call.step, constraint_id=branch.constraint_id, valid=branch.status == "applied",
                     over_budget=_over_budget(branch), advantage=adv, decisions=decisions)
            for (branch, _), adv in zip(branches, advantages, strict=True)]


def build_state_batch(groups: Sequence[Sequence[Trajectory]], rewards: Sequence[Sequence[float]],
                      labels: dict[str, Label], settings: StateReward, *, std_scale: bool, global_weight: float,
                      generated: int, decisions: DecisionRule | None = None) -> Batch:
    """Rows of every branch of every memory call, each with its state group's advantage.

    ``groups`` / ``rewards``: the step's trajectories by task and their trajectory rewards (for
    the log, and for ``global_weight``). ``batch.groups`` and ``zero_variance_groups`` count the
    state groups; ``call_rewards`` (on the batch) keeps every branch's reward for the log.
    ``decisions``: the rows' deciding tokens and their loss mask (none without it)."""
    batch = Batch()
    batch.counts.generated = generated
    index = call_group = 0
    for trajs, rs in zip(groups, rewards, strict=True):
        ok, members = split_failed(trajs, rs)
        global_adv = group_advantages(members, std_scale) if global_weight else [0.0] * len(members)
        member_adv = iter(global_adv)
        for traj, good in zip(trajs, ok, strict=True):
            if not good:  # a request failed (train.grpo.failures): none of its rows is trained on
                for call in memory_calls(traj):
                    branches, failed = call_branches(call)
                    batch.counts.failed_calls += failed
                    batch.counts.failed += len(branches)
                continue
            traj_adv = next(member_adv)
            gold = set(labels[traj.task_id].supporting_facts)
            count = 0
            for call in memory_calls(traj):
                branches, failed = call_branches(call)
                batch.counts.failed_calls += failed
                if not branches:
                    continue
                scores = [call_reward(b, call, gold, settings) for b, _ in branches]
                advs = state_group_advantages(scores, [chosen for _, chosen in branches], traj_adv,
                                              std_scale=std_scale, global_weight=global_weight)
                rows = branch_rows(call, branches, advs, index, call_group, decisions)
                batch.rows.extend(rows)
                batch.call_rewards.extend(scores)
                batch.groups += 1
                batch.zero_variance_groups += int(max(scores) - min(scores) < 1e-12)
                count += len(rows)
                call_group += 1
            batch.rows_per_trajectory.append(count)
            index += 1
        batch.rewards.extend(members)
        batch.advantages.extend(global_adv)
    batch.counts.converted = len(batch.rows)
    return batch


def memory_calls(trajectory: Trajectory) -> list[PolicyCall]:
    """The trajectory's memory calls, each with its branches (else ``ValueError``)."""
    calls = trained_calls(trajectory, "memory")
    if any(call.branches is None for call in calls):
        raise ValueError(f"task {trajectory.task_id}: a memory call without branches; credit.mode = 'state' "
                         "needs the engine's state groups (Environment.branches)")
    return calls
