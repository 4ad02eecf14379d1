"""Benchmark: one GRPO step of the v2 memory-policy recipe before and after the rollout speed-up,
and the eval's seconds per memory call, side by side in one command (docs/training.md, "Where a
GRPO step's time goes").

    OMP_NUM_THREADS=2 uv run python bench/rl_step.py                    # about 8 minutes on 2 idle cores
    OMP_NUM_THREADS=2 uv run python bench/rl_step.py --baseline none    # this checkout only
    OMP_NUM_THREADS=2 uv run python bench/rl_step.py --set 'grpo.dtype="bfloat16"'   # this side in bf16

Workload: ``studies/memory_policy/configs/memory_policy_cpu_v2.toml`` with the overrides of its
PROTOCOL.md (docs/results/memory_policy_cpu_v2), seed 1, the shapes the protocol trained with: 4 train
questions x 2 trajectories, every memory call branched 4 ways (state credit, 96 rows), schema
mode, KL to the start, shared-prompt scoring. The start adapter is the shipped
``models/memory-policy-cpu`` (the protocol's step-8 policy; SFT adapters are not shipped); the
train questions are those of GRPO step ``--step`` of the recipe's seeded order. One step =
``Rollouts.run`` (episodes, trained role sampled at T = 1) + rewards + rows + ``update``
(reference pass, loss, backward, AdamW), exactly what ``train_grpo`` runs between two log lines,
without the checkpoint and the periodic evaluation.

Sides, each in a fresh child process (this script re-invoked with ``--side``), in this order:

- ``before``: the code at ``--baseline`` (default ``952e95d``, the commit the speed issue was
  measured on), its ``src/`` taken with ``git archive`` into a temporary folder and put first on
  ``PYTHONPATH``; the same environment, data, adapter and seeds.
- ``after``: this checkout. Then the eval: ``run_eval`` with the episode config the trainer
  evaluates with (``grpo.trained_role_backends``: the adapter merged, greedy, schema mode) on the
  first ``--eval-questions`` dev questions (16: the eval's concurrency), timed only (no metric is
  printed); seconds per memory call = episode-phase wall time / memory calls.

Printed per side: rollout seconds (prefill, decode, and the part of both spent choosing tokens:
schema masks, sampling, constraint state), update seconds (of which the reference pass), step
seconds, rows, prompt tokens prefilled, decode steps, the largest |sampler - trainer| log-prob
over the tokens in the loss. The last line:

    RESULT rollout_s_per_row=<after> eval_s_per_call=<after> rollout_to_eval=<ratio>
           step_speedup=<before/after> rollout_speedup=... update_speedup=...
           logprob_mismatch=<after> logprob_mismatch_mean=<after> baseline_logprob_mismatch=<before>

Targets (the issue): rollout_to_eval <= 1.5; step_speedup >= 5; logprob_mismatch below 1e-4
(float32 round-off of another batch and padding; ``tests/train/test_logprobs.py``); with
``--set 'grpo.dtype="bfloat16"'`` it is bf16 round-off (largest ~0.3, mean ~0.005). The
baseline's mismatch is its logged figure, which compared masked tokens (0 by construction) with
their rollout log-probs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "952e95d"
# PROTOCOL.md's overrides of the v2 recipe (docs/results/memory_policy_cpu_v2/PROTOCOL.md)
PROTOCOL = ["seeds=[1]", "matrix_seeds=[]", "teacher_rows.other_noop_share=0.05", "grpo.state_reward.junk_penalty=0",
            "grpo.global_weight=0.5", 'grpo.invalid_decision_credit="over_budget"', "grpo.steps=8",
            "grpo.eval.at_start=false", "grpo.optim.lr=2e-4"]


def side(args) -> dict:
    """One side's step (and, for ``after``, the eval), in this process."""
    import torch

    from memsearch.config import load_config
    from memsearch.data.dataset import load_dataset, save_dataset
    from memsearch.data.hotpot import convert_hotpot
    from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline
    from memsearch.train.distributed import Dist
    from memsearch.train.grpo import trainer as grpo
    from memsearch.train.grpo.decisions import DecisionRule
    from memsearch.train.grpo.reward import trajectory_reward
    from memsearch.train.grpo.state_credit import build_state_batch
    from memsearch.train.policy import load_policy, make_optimizer

    work = Path(args.work)
    pipe = load_config(ROOT / "studies" / "memory_policy" / "configs" / "memory_policy_cpu_v2.toml",
                       PROTOCOL + args.set, model=MemoryPolicyPipeline)
    train_dir = work / "train"
    if not train_dir.exists():
        save_dataset(convert_hotpot(ROOT / pipe.data.train, split="train"), train_dir)
    cfg = grpo.GRPOConfig.model_validate({
        **pipe.grpo_config(str(train_dir), 1, str(ROOT / "models" / "memory-policy-cpu"), None).model_dump(),
        "save_rollouts": False, "device": "cpu"})
    dataset = load_dataset(cfg.data)
    labels = dataset.labels_by_id()
    policy, tokenizer, _ = load_policy(cfg.model, cfg.adapter, cfg.lora, "cpu", cfg.dtype, cfg.seed,
                                       keep_reference=cfg.loss.kl_coef > 0 and cfg.loss.kl_reference == "start")
    optimizer, scheduler = make_optimizer(policy, cfg.optim, cfg.steps)
    dist = Dist.from_env(60, 60)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rollouts = grpo.Rollouts(cfg, dataset, policy, tokenizer)
    tasks = [dataset.tasks[i] for i in grpo.step_task_positions(args.step, cfg.rollout.tasks_per_step,
                                                                  len(dataset.tasks), cfg.seed, 0, 1)]
    t0 = time.perf_counter()
    groups = rollouts.run(tasks, args.step)
    t_roll = time.perf_counter() - t0
    rewards = [[trajectory_reward(tr, labels[tr["task_id"]], cfg.reward, cfg.role) for tr in grp] for grp in groups]
    batch = build_state_batch(groups, rewards, labels, cfg.credit.state_reward, std_scale=cfg.credit.std_scale,
                              global_weight=cfg.credit.global_weight, generated=rollouts.generated,
                              decisions=DecisionRule(tokenizer, cfg.credit.invalid_decision_credit))
    masked = batch.masked_decision_tokens
    # the update's parts: the reference (and old-policy) pass before the first optimizer step,
    # then the loss passes with backward and AdamW
    fixed_s = [0.0]
    fixed = grpo._fixed_logprobs

    def timed_fixed(*a, **k):
        t = time.perf_counter()
        try:
            return fixed(*a, **k)
        finally:
            fixed_s[0] += time.perf_counter() - t

    grpo._fixed_logprobs = timed_fixed
    t1 = time.perf_counter()
    stats = grpo.update(policy, optimizer, batch, cfg, dist, pad, grpo._mask_fn(tokenizer), scheduler, step=args.step)
    t_update = time.perf_counter() - t1
    decoder = rollouts.policy_backend.stats()
    rollouts.close()
    out = {
        "rollout_s": t_roll, "update_s": t_update, "step_s": t_roll + t_update, "rows": len(batch.rows),
        "completion_tokens": sum(len(r.completion_ids) for r in batch.rows), "masked_decision_tokens": masked,
        "prompt_tokens": decoder["prompt_tokens"], "prefill_tokens": decoder.get("prefill_tokens",
                                                                                  decoder["prompt_tokens"]),
        "decode_steps": decoder["decode_steps"], "prefill_s": decoder["prefill_s"], "decode_s": decoder["decode_s"],
        "pick_s": decoder.get("pick_s"), "reference_pass_s": fixed_s[0],
        "logprob_mismatch": stats.logprob_mismatch,
        "logprob_mismatch_mean": getattr(stats, "logprob_mismatch_mean", None),  # not logged at the baseline
        "loss": stats.loss, "grad_norm": stats.grad_norm,
        "threads": torch.get_num_threads(),
    }
    if args.side == "after":
        out.update(eval_timing(cfg, args.eval_questions, work))
    return out


def eval_timing(cfg, questions: int, work: Path) -> dict:
    """Seconds per memory call of the trainer's own evaluation path on ``questions`` dev questions."""
    from memsearch.assets.samples import HOTPOT_DEV, samples_dir
    from memsearch.data.dataset import save_dataset
    from memsearch.data.hotpot import convert_hotpot
    from memsearch.eval.runner import run_eval
    from memsearch.io import iter_jsonl
    from memsearch.train.grpo.trainer import trained_role_backends

    dev = work / "dev"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_DEV, split="dev", limit=questions), dev)
    run_config = trained_role_backends(cfg, Path(cfg.adapter), limit=questions)
    summary = run_eval(run_config, dev, work / "eval", show_progress=False)
    calls = sum(1 for _, tr in iter_jsonl(work / "eval" / "trajectories.jsonl") for e in tr["events"]
                if e.get("type") == "policy_call" and e.get("role") == "memory")
    wall = summary.timing["episodes_wall_s"]
    return {"eval_s": wall, "eval_memory_calls": calls, "eval_s_per_call": wall / calls}


def run_side(name: str, src: Path, args, work: Path) -> dict:
    out = work / f"{name}.json"
    env = dict(os.environ, PYTHONPATH=str(src) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, __file__, "--side", name, "--work", str(work / name), "--json", str(out),
           "--step", str(args.step), "--eval-questions", str(args.eval_questions)]
    if name == "after":  # the baseline runs the recipe as it ran then
        cmd += [part for item in args.set for part in ("--set", item)]
    (work / name).mkdir(parents=True, exist_ok=True)
    print(f"[{name}] running one step with the code in {src} ...", flush=True)
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    result = json.loads(out.read_text())
    pick = "" if result["pick_s"] is None else f"; choosing tokens {result['pick_s']:.1f}s of it"
    print(f"[{name}] rollout {result['rollout_s']:.1f}s (prefill {result['prefill_s']:.1f}s over "
          f"{result['prefill_tokens']} of {result['prompt_tokens']} prompt tokens, decode {result['decode_s']:.1f}s in "
          f"{result['decode_steps']} steps{pick}), update {result['update_s']:.1f}s (reference pass "
          f"{result['reference_pass_s']:.1f}s), step {result['step_s']:.1f}s; "
          f"{result['rows']} rows, {result['completion_tokens']} completion tokens, logprob_mismatch "
          f"{result['logprob_mismatch']:.2g} ({result['masked_decision_tokens']} tokens out of the loss), loss "
          f"{result['loss']:.6f}, grad_norm {result['grad_norm']:.6f}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default=BASELINE, help="commit whose src/ is the 'before' side, or 'none'")
    parser.add_argument("--step", type=int, default=1, help="which step's questions of the recipe's seeded order")
    parser.add_argument("--eval-questions", type=int, default=16)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override of the recipe on this checkout's side only (e.g. grpo.dtype=\"bfloat16\"); "
                             "the baseline runs the recipe as it ran")
    parser.add_argument("--side", choices=["before", "after"], help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        Path(args.json).write_text(json.dumps(side(args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        before = None
        if args.baseline != "none":
            base = work / "baseline"
            base.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline, "src"], capture_output=True)
            if archive.returncode:
                sys.exit(f"bench/rl_step.py: cannot read commit {args.baseline} ({archive.stderr.decode().strip()}); "
                         "a full clone is needed for the baseline, or pass --baseline none")
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
            before = run_side("before", base / "src", args, work)
        after = run_side("after", ROOT / "src", args, work)
    per_row = after["rollout_s"] / after["rows"]
    print(f"[after] eval: {after['eval_memory_calls']} memory calls in {after['eval_s']:.1f}s "
          f"({after['eval_s_per_call']:.2f} s per call); rollout {per_row:.2f} s per row")
    figures = {"rollout_s_per_row": f"{per_row:.3f}", "eval_s_per_call": f"{after['eval_s_per_call']:.3f}",
               "rollout_to_eval": f"{per_row / after['eval_s_per_call']:.2f}"}
    if before is not None:
        figures.update(step_speedup=f"{before['step_s'] / after['step_s']:.2f}",
                       rollout_speedup=f"{before['rollout_s'] / after['rollout_s']:.2f}",
                       update_speedup=f"{before['update_s'] / after['update_s']:.2f}")
    figures["logprob_mismatch"] = f"{after['logprob_mismatch']:.2e}"
    figures["logprob_mismatch_mean"] = f"{after['logprob_mismatch_mean']:.2e}"
    if before is not None:
        figures["baseline_logprob_mismatch"] = f"{before['logprob_mismatch']:.2e}"
    print("RESULT " + " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
