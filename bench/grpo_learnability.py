"""Learnability check: can GRPO at least fit the questions it trains on? (docs/training.md,
"Can the trainer fit what it sees?")

    OMP_NUM_THREADS=2 uv run python bench/grpo_learnability.py [--minutes 20] [--out DIR] [--start base]

The one benchmark here that runs longer than a few minutes: the check is defined by its time
budget (20 minutes of training on 2 cores; --minutes changes it, and then its bar no longer
applies as written).

Protocol (fixed before the first run; docs/results/grpo_learnability/README.md):

- Questions: the first 8 HotpotQA train questions of ``data/samples/hotpotqa/train_extended.json``,
  the only training data. Recipe: ``studies/memory_policy/configs/memory_policy_cpu_v2.toml`` with
  the overrides of its PROTOCOL.md (state credit with 4 branches per memory call, 4 questions x 2 trajectories per step,
  so one epoch is 2 steps; lr 2e-4, KL 0.05 to the start, schema mode), seed 1, from the shipped
  adapter ``models/memory-policy-cpu`` (also the KL reference). ``train_grpo`` itself runs,
  ``checkpoint_every = 1``, no periodic evaluation; it is stopped after the first step that ends
  past ``--minutes`` of training.
- Measured: the mean per-call reward (``train.grpo.state_credit.call_reward``, the quantity the
  recipe's advantages are made of) of the start adapter and of the last step's adapter, each
  from one rollout pass over the 8 questions with the same sampling seeds (2 trajectories per
  question, every memory call branched 4 ways, T = 1): one value per (question, trajectory), the
  mean over its calls' branches; 16 paired values.
- Bar: end - start >= +0.05 and the paired bootstrap 95 % CI (10,000 resamples, seed 0) above 0.
  Why 0.05: a gold sentence kept is worth 1/|G| (about 0.5) to the call that shows it, an
  overflow costs 0.25-0.5; +0.05 per call is about one call in ten turned from nothing into
  keeping gold, far above what the common seeds leave to chance (a policy that did not move
  scores exactly its start).

``--start base`` begins from the untrained base model with a fresh LoRA (the recipe's r and
alpha; the KL reference is then the base): for a recipe the shipped adapter was not trained for,
e.g. the extractive format (``--set episode.agent.memory_format='"extractive"'``). Like ``--set``,
it makes a diagnostic or a check of its own, registered before it runs, not the check above.

The last line: ``RESULT start_call_reward=... end_call_reward=... diff=... ci_low=... ci_high=...
steps=... train_s=... passed=0|1``. ``--out`` keeps the run folder (train_log.jsonl, rollouts,
checkpoints) and writes ``result.json`` there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from rl_step import PROTOCOL as V2_PROTOCOL

ROOT = Path(__file__).resolve().parent.parent
# the v2 protocol's overrides (one list, in bench/rl_step.py), steps unbounded: the clock stops the run
PROTOCOL = [o for o in V2_PROTOCOL if not o.startswith("grpo.steps=")] + ["grpo.steps=1000"]
QUESTIONS, MARGIN, MEASURE_STEP = 8, 0.05, 10**6


class _TimeUp(Exception):
    pass


def per_trajectory_call_reward(groups, labels, settings) -> list[float]:
    """One value per trajectory (task order, then rollout): the mean per-call reward over the
    branches of its memory calls."""
    from memsearch.train.grpo.state_credit import call_branches, call_reward
    from memsearch.train.rows import trained_calls

    values = []
    for trajs in groups:
        for traj in trajs:
            gold = set(labels[traj["task_id"]].supporting_facts)
            scores = []
            for call in trained_calls(traj, "memory"):
                branches = [b for b, _ in call_branches(call)[0]]
                before = {"kept": call["kept_before"], "cited": call["cited_before"]}
                scores += [call_reward(b, before, gold, settings) for b in branches]
            values.append(sum(scores) / len(scores) if scores else 0.0)
    return values


def measure(cfg, adapter: str | None, dataset) -> list[float]:
    """The per-trajectory call rewards of ``adapter`` on every question, with the measurement seeds."""
    from memsearch.train.grpo.trainer import Rollouts
    from memsearch.train.policy import load_policy

    policy, tokenizer, _ = load_policy(cfg.model, adapter, cfg.lora, "cpu", cfg.dtype, cfg.seed)
    rollouts = Rollouts(cfg, dataset, policy, tokenizer)
    try:
        groups = rollouts.run(dataset.tasks, MEASURE_STEP)
    finally:
        rollouts.close()
    return per_trajectory_call_reward(groups, dataset.labels_by_id(), cfg.credit.state_reward)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="training time budget (the bar assumes 20)")
    parser.add_argument("--out", help="keep the run folder here (must not exist)")
    parser.add_argument("--start", choices=("shipped", "base"), default="shipped",
                        help="the shipped adapter (the registered check) or the base model with a fresh LoRA")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override the recipe (pipeline config keys, e.g. grpo.optim.lr=5e-5): a diagnostic "
                        "run, not the check as registered")
    args = parser.parse_args()

    from memsearch.config import load_config
    from memsearch.data.dataset import load_dataset, save_dataset
    from memsearch.data.hotpot import convert_hotpot
    from memsearch.eval.bootstrap import paired_bootstrap
    from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline
    from memsearch.train.config import GRPOConfig
    from memsearch.train.grpo.trainer import train_grpo

    out = Path(args.out) if args.out else None
    if out is not None and out.exists():
        raise SystemExit(f"{out}: exists; choose a new --out (nothing is overwritten)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        pipe = load_config(ROOT / "studies" / "memory_policy" / "configs" / "memory_policy_cpu_v2.toml",
                           PROTOCOL + args.set,
                           model=MemoryPolicyPipeline)
        save_dataset(convert_hotpot(ROOT / pipe.data.train, split="train", limit=QUESTIONS), work / "train")
        start = str(ROOT / "models" / "memory-policy-cpu") if args.start == "shipped" else None
        cfg = GRPOConfig.model_validate({**pipe.grpo_config(str(work / "train"), 1, start, None).model_dump(),
                                         "checkpoint_every": 1, "keep_checkpoints": 1, "device": "cpu"})
        dataset = load_dataset(cfg.data)
        print(f"measuring the start on {len(dataset.tasks)} questions ...", flush=True)
        before = measure(cfg, start, dataset)
        run = work / "run"
        t0 = time.perf_counter()
        steps = 0

        def echo(message: str) -> None:
            nonlocal steps
            print(message, flush=True)
            if message.startswith("step "):
                steps += 1
                if time.perf_counter() - t0 > args.minutes * 60:
                    raise _TimeUp

        try:
            train_grpo(cfg, run, echo=echo)
        except _TimeUp:
            pass
        train_s = time.perf_counter() - t0
        last = sorted((run / "checkpoints").glob("step-*"))[-1]
        print(f"measuring {last.name} ...", flush=True)
        after = measure(cfg, str(last / "adapter"), dataset)
        ci = paired_bootstrap(after, before, n_resamples=10_000, seed=0)
        passed = ci["diff"] >= MARGIN and ci["ci_low"] > 0
        result = {"questions": QUESTIONS, "overrides": args.set, "minutes": args.minutes, "start_from": args.start,
                  "steps": steps, "train_s": round(train_s, 1), "margin": MARGIN,
                  "start": before, "end": after, "bootstrap": ci, "passed": passed, "checkpoint": last.name}
        if out is not None:
            shutil.copytree(run, out, ignore=shutil.ignore_patterns("checkpoints"))
            (out / "result.json").write_text(json.dumps(result, indent=2))
    print(f"per-call reward: start {ci['mean_b']:.4f}, after {steps} steps {ci['mean_a']:.4f}; "
          f"difference {ci['diff']:+.4f} [{ci['ci_low']:+.4f}, {ci['ci_high']:+.4f}]; bar: >= {MARGIN} and CI > 0")
    if args.set or args.minutes != 20.0 or args.start != "shipped":
        print(f"not the registered check (start {args.start}, overrides {args.set}, {args.minutes} minutes)")
    print(f"RESULT start_call_reward={ci['mean_b']:.4f} end_call_reward={ci['mean_a']:.4f} diff={ci['diff']:.4f} "
          f"ci_low={ci['ci_low']:.4f} ci_high={ci['ci_high']:.4f} steps={steps} train_s={train_s:.0f} "
          f"passed={int(passed)}")


if __name__ == "__main__":
    main()
