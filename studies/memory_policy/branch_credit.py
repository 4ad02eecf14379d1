"""Where a GRPO stage's per-call credit went: its saved state-group branches re-scored by state
and outcome (docs/results/memory_policy_cpu_v2 prints such tables).

    uv run python -m studies.memory_policy.branch_credit runs/mp-v2-p4/seed-1/grpo1 \
        --data runs/mp-v2-p4/prepare/train --steps 1-3

A greedy evaluation shows *that* a policy moved; this shows what pushed it. Every branch of
every memory call in ``rollouts/step-*.jsonl`` is scored again with the stage's own per-call
reward (``state_credit.call_reward``, the ``state_reward`` and ``std_scale`` of the stage's
``config.json``) and its local advantage within its call (the global term, ``global_weight``,
is left out), then grouped by

- **room**: the memory budget left when the call was made (the call's ``budget_left``; older
  rollouts: its prompt's "Memory budget left"),
  at least ``room_tokens`` or less;
- **gold shown**: whether the call's new evidence (the search just before it) held a gold
  supporting fact of the question's train label;
- **outcome**: the op the branch applied (``ADD``, ``UPDATE``, ``DELETE``, ``NOOP``; the first
  that executed), ``over_budget`` (rejected for overflowing the memory) or ``invalid`` (any
  other rejected or unreadable batch).

Labels are train labels: this reads what the trainer itself saw.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from memsearch.errors import InputError
from memsearch.pipelines.memory_policy.heldout import gold_facts
from memsearch.records.events import BranchOutcome, PolicyCall, SearchEvent
from memsearch.records.trajectory import read_trajectories
from memsearch.train.config import StateReward
from memsearch.train.config_keys import upgrade_grpo_keys
from memsearch.train.grpo.batch import group_advantages
from memsearch.train.grpo.state_credit import call_reward

_BUDGET_LEFT = re.compile(r"Memory budget left: (-?\d+) tokens")
_STEP = re.compile(r"step-(\d+)\.")
OUTCOME_ORDER = ("ADD", "UPDATE", "DELETE", "NOOP", "over_budget", "invalid")


def outcome(branch: BranchOutcome) -> str:
    """A branch's outcome bucket (module doc)."""
    if branch.status != "applied":
        return "over_budget" if (branch.over_budget_tokens or 0) > 0 else "invalid"
    executed = branch.executed or {}
    return next((op for op in ("ADD", "UPDATE", "DELETE") if executed.get(op)), "NOOP")


def _budget_left(call: PolicyCall, where: str) -> int:
    if call.budget_left is not None:  # recorded by the engine
        return call.budget_left
    # rollouts saved before the engine recorded it: the number its prompt showed
    found = _BUDGET_LEFT.search(call.messages[-1]["content"])
    if not found:
        raise InputError(f"{where}: a memory call's prompt has no 'Memory budget left: N tokens' line")
    return int(found.group(1))


def branch_credit(stage: Path, data: Path, *, steps: tuple[int, int] | None = None,
                  room_tokens: int = 60) -> list[dict[str, Any]]:
    """One row per (room, gold shown, outcome) with its branch count, mean per-call reward, mean
    and summed local advantage, over the stage's saved rollouts of ``steps`` (first, last;
    all when None). ``data``: the prepared train data the stage trained on (its labels)."""
    stage, gold = Path(stage), gold_facts(Path(data))
    config_path = stage / "config.json"
    if not config_path.is_file():
        raise InputError(f"{stage}: no config.json (not a GRPO stage folder)")
    # a run's config.json in the grouped layout or the earlier flat one
    credit = upgrade_grpo_keys(json.loads(config_path.read_text())).get("credit") or {}
    if credit.get("mode") != "state":
        raise InputError(f"{config_path}: credit is {credit.get('mode')!r}; only 'state' saves branches")
    settings, std_scale = StateReward(**credit["state_reward"]), bool(credit.get("std_scale"))
    files = [p for p in sorted((stage / "rollouts").glob("step-*.jsonl"))
             if steps is None or steps[0] <= int(_STEP.search(p.name).group(1)) <= steps[1]]
    if not files:
        raise InputError(f"{stage}/rollouts: no step-*.jsonl in steps {steps} (save_rollouts must be on)")
    cells: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    for path in files:
        for line_no, trajectory in read_trajectories(path):
            where = f"{path}:{line_no}"
            if trajectory.task_id not in gold:
                raise InputError(f"{where}: task {trajectory.task_id} has no label in {data}")
            facts, shown = gold[trajectory.task_id], ()
            for event in trajectory.events:
                if isinstance(event, SearchEvent):
                    shown = event.shown
                if not isinstance(event, PolicyCall) or event.role != "memory" or event.branches is None:
                    continue
                branches = [b for b in event.branches if not b.error and b.completion_ids is not None]
                rewards = [call_reward(b, event, facts, settings) for b in branches]
                room = "room" if _budget_left(event, where) >= room_tokens else "tight"
                gold_shown = "gold shown" if set(shown) & facts else "no gold shown"
                for branch, reward, adv in zip(branches, rewards, group_advantages(rewards, std_scale), strict=True):
                    cells[(room, gold_shown, outcome(branch))].append((reward, adv))
    rows = []
    for (room, gold_shown, kind), values in sorted(
            cells.items(), key=lambda kv: (kv[0][0], kv[0][1], OUTCOME_ORDER.index(kv[0][2]))):
        rewards, advs = [v[0] for v in values], [v[1] for v in values]
        rows.append({"room": room, "gold": gold_shown, "outcome": kind, "branches": len(values),
                     "reward_mean": sum(rewards) / len(rewards), "advantage_mean": sum(advs) / len(advs),
                     "advantage_sum": sum(advs)})
    return rows


def markdown_table(rows: list[dict[str, Any]], room_tokens: int) -> str:
    """The rows as the results README prints them."""
    lines = [f"| room (>= {room_tokens} tokens left) | gold | outcome | branches | mean per-call reward "
             "| mean advantage | summed advantage |", "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['room']} | {r['gold']} | {r['outcome']} | {r['branches']} | {r['reward_mean']:+.3f} "
              f"| {r['advantage_mean']:+.3f} | {r['advantage_sum']:+.1f} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m studies.memory_policy.branch_credit STAGE --data DIR [--steps FIRST-LAST] [--room-tokens N]``."""
    parser = argparse.ArgumentParser(description="Print where a GRPO stage's per-call credit went, by room, gold "
                                     "shown and outcome.")
    parser.add_argument("stage", type=Path, help="a GRPO stage folder with credit = 'state' (RUN/seed-N/grpo1)")
    parser.add_argument("--data", type=Path, required=True, help="its prepared train data (RUN/prepare/train)")
    parser.add_argument("--steps", help="FIRST-LAST, inclusive (default: every saved step)")
    parser.add_argument("--room-tokens", type=int, default=60, help="memory budget left that counts as room (60)")
    args = parser.parse_args(argv)
    try:
        steps = None
        if args.steps:
            first, sep, last = args.steps.partition("-")
            if not (first.isdigit() and (not sep or last.isdigit())):
                raise InputError(f"--steps {args.steps!r}: expected FIRST-LAST, e.g. 1-3, or one step")
            steps = (int(first), int(last or first))
        rows = branch_credit(args.stage, args.data, steps=steps, room_tokens=args.room_tokens)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown_table(rows, args.room_tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
