"""Per-decision credit for the memory role: state groups (``credit = "state"``, docs/design.md §7).

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
- any other rejected or unreadable batch: - ``invalid_penalty``;
- a branch whose request failed has no completion: no row, no part of the group;
- a trajectory with a request error (``train.failures``) gives no row; the global term below is
  taken over its task's successful trajectories.

With ``global_weight`` > 0 the continued branch's rows also get ``global_weight`` x the
trajectory's own group advantage (the trajectory reward, ``train.reward``, inside its task's
group): the local-plus-global sum of LoGo-GRPO, for the decisions the trajectory's outcome
followed from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memsearch.train.failures import split_failed
from memsearch.train.rows import Batch, Row, group_advantages, trained_calls

if TYPE_CHECKING:
    from memsearch.data.records import Label
    from memsearch.train.config import StateReward


def call_reward(branch: dict[str, Any], before: dict[str, Any], gold: set[str], settings: StateReward) -> float:
    """The per-call reward of one branch (module doc); ``before`` holds the call's ``kept`` and
    ``cited`` ids before any branch applied."""
    if branch["status"] == "rejected" and branch.get("over_budget_tokens", 0) > 0:
        over = branch["over_budget_tokens"] / max(1, branch["budget_tokens"])
        return -settings.overflow_penalty * (0.5 + 0.5 * min(1.0, over))
    if branch["status"] != "applied":
        return -settings.invalid_penalty
    if not gold:
        return 0.0
    kept_gain = len(set(branch["kept"]) & gold) - len(set(before["kept"]) & gold)
    junk = len((set(branch["cited"]) - set(before["cited"])) - gold)
    return (settings.gold_gain * kept_gain - settings.junk_penalty * junk) / len(gold)


def branch_rows(call: dict[str, Any], trajectory: int, group: int) -> tuple[list[Row], list[dict[str, Any]], int]:
    """One row per branch with a completion, the branches they came from, and the failed branches."""
    rows, kept, failed = [], [], 0
    for k, branch in enumerate(call["branches"]):
        if branch.get("error") or branch.get("completion_ids") is None:
            failed += 1
            continue
        ids, lps = branch["completion_ids"], branch["logprobs"]
        rows.append(Row(prompt_ids=list(call["prompt_ids"]), completion_ids=list(ids),
                        rollout_logprobs=[float(x) for x in lps], loss_mask=[1] * len(ids), trajectory=trajectory,
                        group=group, role=call["role"], step=call["step"], constraint_id=branch.get("constraint_id"),
                        valid=branch["status"] == "applied",
                        over_budget=branch["status"] == "rejected" and branch.get("over_budget_tokens", 0) > 0))
        kept.append({**branch, "chosen": k == call["branch_chosen"]})
    return rows, kept, failed


def build_state_batch(groups: Sequence[Sequence[dict[str, Any]]], rewards: Sequence[Sequence[float]],
                      labels: dict[str, Label], settings: StateReward, *, std_scale: bool, global_weight: float,
                      generated: int) -> Batch:
    """Rows of every branch of every memory call, each with its state group's advantage.

    ``groups`` / ``rewards``: the step's trajectories by task and their trajectory rewards (for
    the log, and for ``global_weight``). ``batch.groups`` and ``zero_variance_groups`` count the
    state groups; ``call_rewards`` (on the batch) keeps every branch's reward for the log."""
    batch = Batch()
    batch.counts.generated = generated
    index = call_group = 0
    for trajs, rs in zip(groups, rewards, strict=True):
        ok, members = split_failed(trajs, rs)
        global_adv = group_advantages(members, std_scale) if global_weight else [0.0] * len(members)
        member_adv = iter(global_adv)
        for traj, good in zip(trajs, ok, strict=True):
            if not good:  # a request failed (train.failures): none of its rows is trained on
                for call in _memory_calls(traj):
                    rows, _, failed = branch_rows(call, index, call_group)
                    batch.counts.failed_calls += failed
                    batch.counts.failed += len(rows)
                continue
            traj_adv = next(member_adv)
            gold = set(labels[traj["task_id"]].supporting_facts)
            count = 0
            for call in _memory_calls(traj):
                rows, branches, failed = branch_rows(call, index, call_group)
                batch.counts.failed_calls += failed
                if not rows:
                    continue
                before = {"kept": call["kept_before"], "cited": call["cited_before"]}
                scores = [call_reward(b, before, gold, settings) for b in branches]
                local = group_advantages(scores, std_scale)
                for row, branch, adv in zip(rows, branches, local, strict=True):
                    row.advantage = adv + (global_weight * traj_adv if branch["chosen"] else 0.0)
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


def _memory_calls(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """The trajectory's memory calls, each with its branches (else ``ValueError``)."""
    calls = trained_calls(trajectory, "memory")
    if any("branches" not in call for call in calls):
        raise ValueError(f"task {trajectory.get('task_id')}: a memory call without branches; credit = 'state' "
                         "needs the engine's state groups (Environment.branches)")
    return calls
