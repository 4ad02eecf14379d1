"""Multi-turn GRPO through the episode engine: the readable single-node reference trainer.

    memsearch train grpo --config configs/train/grpo_cpu.toml --out runs/grpo
    torchrun --nproc_per_node 2 -m memsearch.cli.app train grpo --config ... --out ...   # one process per device

One step, top to bottom (``train_grpo``):

1. take this step's tasks (a seeded permutation per epoch; rank r takes every world-th one);
2. roll out ``group_size`` episodes per task with the *same* engine as evaluation
   (``run_episode``), the trained role(s) answered by an ``hf`` backend that holds the policy
   as it is at this step, merged into a plain copy of the base (``policy.MergedSampler``:
   inference mode, no dropout, no LoRA layers; a bf16 base samples unmerged), one batcher
   for every concurrent episode, the branches of one state prefilled once (``hf_decoder``,
   "Shared prompts"); sampling at ``temperature``, a distinct seed per step / rollout / task / call; the other roles by
   whatever backend the episode config names (rules, a frozen stage-1 model...);
3. reward each trajectory (``reward.trajectory_reward``); with ``dynamic_sampling``, groups whose
   rewards are all equal are replaced by other tasks (``dynamic_sampling``); advantage per
   trajectory inside its group (of its successful members), expanded to its rows without dropping
   any (``batch.build_batch``);
4. recompute log-probs (the schema mask replayed), clipped policy loss (+ k3 KL to the
   reference: the frozen starting adapter, or the base), micro-batched backward, gradients
   summed over ranks and divided by the global denominator, clip, AdamW step and LR-schedule
   step, once per mini-batch and epoch (``update``);
5. check the row-count contract, log (with the decision view: ``decisions``), stop if the
   collapse guard trips (``collapse``), checkpoint, evaluate.

A trajectory with a request error (a server fault) is never trained on, and a step where more
than ``max_failed_share`` of them failed stops the run before its update (``failures``).

``--resume`` continues from the newest intact checkpoint exactly (weights, optimizer,
scheduler, RNG, data position are functions of the step; a damaged one is named and skipped:
``train.checkpoint``). A non-finite loss, gradient norm or weight stops the run
(``train.finite``). The update itself, with the old log-probs of the ratio: ``train.grpo.update``.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import torch

from memsearch.config import RunConfig, Sampling
from memsearch.devices import apply_training_layout
from memsearch.engine.episode import derived_seed
from memsearch.errors import InputError
from memsearch.io import write_jsonl
from memsearch.records.train_step import TrainStep
from memsearch.records.trajectory import Trajectory
from memsearch.train.checkpoint import checkpoints, resume_checkpoint, save_checkpoint
from memsearch.train.config import GRPOConfig
from memsearch.train.distributed import Dist
from memsearch.train.finite import require_finite
from memsearch.train.grpo.batch import Batch, build_batch
from memsearch.train.grpo.collapse import guard_for_run, stop_collapsed
from memsearch.train.grpo.decisions import DecisionRule
from memsearch.train.grpo.dynamic_sampling import sample_step
from memsearch.train.grpo.failures import check_failed_share
from memsearch.train.grpo.state_credit import build_state_batch
from memsearch.train.grpo.step_record import step_record
from memsearch.train.grpo.update import update
from memsearch.train.log import TrainLog
from memsearch.train.rows import TRAINED_CALL_ROLES
from memsearch.train.run_folder import check_run_folder, drop_lost_steps, finish_run, prepare_run_folder

__all__ = ["Rollouts", "make_batch", "step_task_positions", "train_grpo", "trained_role_backends", "update"]


def step_task_positions(step: int, tasks_per_step: int, n_tasks: int, seed: int, rank: int, world: int) -> list[int]:
    """Indices (into the train tasks) of this rank's tasks at ``step`` (1-based): consecutive
    slices of a seeded permutation per epoch, dealt round-robin to the ranks."""
    out = []
    for j in range((step - 1) * tasks_per_step, step * tasks_per_step):
        if j % world != rank:
            continue
        epoch, pos = divmod(j, n_tasks)
        order = list(range(n_tasks))
        random.Random(derived_seed(seed, "epoch", epoch)).shuffle(order)
        out.append(order[pos])
    return out


def schema_mask_fn(tokenizer):
    """The schema-mode masks of a row, replayed from its constraint id and completion ids (the
    ``mask_fn`` the update scores rows with under ``GRPOConfig.schema_mode``)."""
    from memsearch.backends.hf.constraint import compile_constraint
    from memsearch.memory.action_format import constraint_by_id

    def masks(row):
        return compile_constraint(constraint_by_id(row.constraint_id), tokenizer).masks_for(row.completion_ids)

    return masks


class Rollouts:
    """Episodes of one step through the shared engine, the trained role(s) on the live policy.

    Owns its shared parts (``engine.environment``) and the policy backend; ``close`` closes the
    backends (the policy's included, not the model it wraps)."""

    def __init__(self, cfg: GRPOConfig, dataset, policy, tokenizer, fast: bool = True) -> None:
        from memsearch.backends.hf.backend import HFBackend
        from memsearch.backends.hf.model import pick_dtype
        from memsearch.engine.environment import build_shared
        from memsearch.train.policy import MergedSampler

        self.cfg = cfg
        self.policy, self.tokenizer = policy, tokenizer
        self.trained = set(TRAINED_CALL_ROLES[cfg.role])
        # The episode's [retrieval] table: bm25/dense/hybrid in process, a built index, or the
        # shared service (rollout workers on many nodes searching one index).
        self.shared = build_shared(cfg.episode, dataset, leave_out=self.trained)
        self.generated = 0  # completions of the trained roles in the last ``run`` (counted by the backend)
        # fast: branches of one state prefilled once, sampled from the merged copy (module doc);
        # off, from the PEFT model with every prompt prefilled: the reference the tests compare with.
        # A base in a low-precision dtype is never merged: W + scale * B @ A rounded to bfloat16 is
        # not the function the trainer differentiates (bf16 base, float32 LoRA added to its output).
        device = next(policy.parameters()).device
        merge = fast and pick_dtype(cfg.dtype, device) == torch.float32
        self.sampler = MergedSampler(policy, cfg.model, device, cfg.dtype) if merge else None
        self.policy_backend = HFBackend(
            model=cfg.model,
            loaded=(self.sampler.model if merge else policy, tokenizer),
            max_batch_size=cfg.rollout.max_batch_size,
            seed=cfg.seed,
            name="hf-policy",
            share_prompts=fast,
        )
        self.backends = self.shared.backends_with({role: self.policy_backend for role in self.trained})
        # The trained roles' sampling, built once; each rollout copies it with a seed of its own.
        self.sampling = Sampling(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)

    def config_for(self, step: int, k: int, round_: int = 0):
        """The episode config of rollout ``k`` at ``step``: trained roles sample at T with their own
        seed (an extra round of dynamic sampling has seeds of its own)."""
        seed_parts = (self.cfg.seed, "rollout", step, k) + (("round", round_) if round_ else ())
        seeded = self.sampling.model_copy(update={"seed": derived_seed(*seed_parts)})
        return trained_role_backends(self.cfg, sampling=seeded)

    def run(self, tasks, step: int, round_: int = 0) -> list[list[Trajectory]]:
        """``group_size`` trajectories per task, grouped by task (task order, then rollout index)."""
        from memsearch.engine.episode import run_episode
        from memsearch.train.policy import release_cached_memory

        if self.sampler is not None:
            with self.policy_backend.decoder.paused():  # no decode run sees half-copied weights
                self.sampler.refresh()  # the adapter as it is at this step
        envs = [
            self.shared.environment(self.config_for(step, k, round_), "grpo", answered_by=self.backends,
                                    branches=self.cfg.credit.state_group_size if self.cfg.credit.mode == "state" else 1)
            for k in range(self.cfg.rollout.group_size)
        ]

        async def all_episodes():
            return await asyncio.gather(*(run_episode(t, env) for t in tasks for env in envs))

        answered = self.policy_backend.completed
        before = sum(answered[role] for role in self.trained)
        flat = asyncio.run(all_episodes()) if tasks else []
        release_cached_memory(self.policy)  # the rollouts' KV caches: free for the update's activations
        # rows generated, counted where the calls are answered (not re-read from the trajectories)
        self.generated = sum(answered[role] for role in self.trained) - before
        g = self.cfg.rollout.group_size
        return [flat[i * g : (i + 1) * g] for i in range(len(tasks))]

    def evaluation_model(self):
        """The model a greedy evaluation decodes with, holding the policy's weights as they are now:
        the merged copy refreshed (in float32 the very weights ``memsearch eval`` gets by merging the
        saved adapter), else the policy itself (eval mode). No second model (``train.live_eval``)."""
        if self.sampler is None:
            return self.policy
        with self.policy_backend.decoder.paused():
            self.sampler.refresh()
        return self.sampler.model

    def close(self) -> None:
        """Close every backend once."""
        from memsearch.engine.environment import close_backends

        asyncio.run(close_backends(self.backends))


def trained_role_backends(cfg: GRPOConfig, adapter: Path | None = None, sampling: Sampling | None = None,
                          **fields: Any) -> RunConfig:
    """``cfg.episode`` with the trained roles on the hf policy, sampled the way training samples
    them: the one place rollouts, periodic evaluation and the verl lane take it from, so the
    evaluated policy is the trained one. Their schema mode is ``cfg.schema_mode`` (memory role
    only); ``sampling`` (rollouts: temperature, top_p, a seed per rollout) replaces their own
    (evaluation: the episode's, greedy by default); ``adapter``: they load it on ``cfg.model``;
    ``fields``: other run-config fields (``limit``). Copies of the validated episode's parts
    (``model_copy``): nothing is dumped and validated again per rollout."""
    backends = cfg.episode.backends
    roles = {}
    for role in TRAINED_CALL_ROLES[cfg.role]:
        update = {"kind": "hf", "schema_mode": cfg.schema_mode and role == "memory"}
        if adapter is not None:
            update.update(model=cfg.model, adapter=str(adapter))
        if sampling is not None:
            update["sampling"] = sampling
        roles[role] = getattr(backends, role).replaced(**update)
    return cfg.episode.model_copy(update={"backends": backends.model_copy(update=roles), **fields})


def _evaluate(cfg: GRPOConfig, adapter: Path, out: Path, rollouts: Rollouts
              ) -> tuple[dict[str, float], dict[str, int] | None]:
    """Greedy evaluation of the adapter through the eval runner (the same code path and records as
    `memsearch eval` of ``adapter``), the trained roles answered by the live policy, which holds
    that adapter's weights now: no second model is loaded (``train.live_eval``). Returns the
    logged metrics and the executed ops (``TrainStep.with_evaluation``)."""
    from memsearch.train.live_eval import evaluate_live

    run_config = trained_role_backends(cfg, adapter, limit=cfg.eval.limit)
    summary = evaluate_live(run_config, rollouts.trained, rollouts.evaluation_model(), rollouts.tokenizer,
                            cfg.eval.data, out)
    metrics = {
        k: v
        for k, v in summary.metrics.items()
        if k in ("f1", "em", "sub_em", "boxed_em", "invalid_action_rate", "memory_support_recall",
                 "memory_support_precision")
    }
    # greedy decoding's ops: what the collapse guard's eval check reads
    ops = {k.removeprefix("ops_"): v for k, v in summary.memory_ops.items()} if summary.memory_ops else None
    return metrics, ops


def make_batch(cfg: GRPOConfig, groups, rewards, labels, tokenizer, generated: int) -> Batch:
    """A step's training rows from its trajectories (by task) and their rewards: advantages by
    ``cfg.credit.mode``, decision tokens marked, invalid decisions masked by
    ``cfg.credit.invalid_decision_credit``. ``generated``: completions the policy backend returned."""
    decisions = DecisionRule(tokenizer, cfg.credit.invalid_decision_credit)
    if cfg.credit.mode == "state":
        return build_state_batch(groups, rewards, labels, cfg.credit.state_reward, std_scale=cfg.credit.std_scale,
                                 global_weight=cfg.credit.global_weight, generated=generated, decisions=decisions)
    return build_batch(groups, rewards, cfg.role, cfg.credit.mode, cfg.credit.std_scale, generated=generated,
                       decisions=decisions)


def _step_line(record: TrainStep, steps: int) -> str:
    """The step's line on the console; request errors only when there were some."""
    line = (f"step {record.step}/{steps}: reward {record.reward_mean:.3f} (std {record.reward_std:.3f}), "
            f"zero-variance groups {record.zero_variance_groups}/{record.groups}, rows "
            f"{record.rows_consumed}, invalid {record.invalid_rate:.2f}, {record.step_s:.1f}s")
    if record.request_errors or record.failed_trajectories:
        line += (f"; request errors {record.request_errors}, failed trajectories {record.failed_trajectories} "
                 f"({record.failed_share:.0%}, not trained on)")
    return line


def train_grpo(cfg: GRPOConfig, out: str | Path, resume: bool = False, echo=print,
               fast_rollouts: bool = True) -> dict[str, Any]:
    """Train (or resume) a GRPO run into ``out``; returns the final summary. ``fast_rollouts``
    off samples from the PEFT policy itself with every prompt prefilled (``Rollouts``): slower,
    the same run up to float round-off, kept to check that claim."""
    from memsearch.data.dataset import load_dataset
    from memsearch.train.grpo.reward import trajectory_reward
    from memsearch.train.memory_plan import check_device_memory
    from memsearch.train.policy import load_policy, make_optimizer, save_adapter

    out = Path(out)
    apply_training_layout(cfg.devices)  # before CUDA reads CUDA_VISIBLE_DEVICES (memsearch.devices)
    dist = Dist.from_env(cfg.dist_timeout_s, cfg.eval.wait_s)
    try:
        check_run_folder(cfg, out, resume, dist)
        dataset = load_dataset(cfg.data)
        split = dataset.manifest.get("split")
        if split != "train":
            raise InputError(
                f"{cfg.data}: manifest split is {split!r}; GRPO trains on a train split only (docs/design.md §9)"
            )
        labels = dataset.labels_by_id()
        device = dist.device(cfg.device)
        # before any weight loads: refuse a step this GPU cannot hold (train.memory_plan)
        check_device_memory(cfg, device, dist, echo if dist.main else None)
        policy, tokenizer, note = load_policy(
            cfg.model,
            cfg.adapter,
            cfg.lora,
            device,
            cfg.dtype,
            cfg.seed,
            keep_reference=cfg.loss.kl_coef > 0 and cfg.loss.kl_reference == "start",
            gradient_checkpointing=cfg.gradient_checkpointing,
        )
        optimizer_steps = cfg.steps * cfg.update.epochs * cfg.update.mini_batches_per_step
        optimizer, scheduler = make_optimizer(policy, cfg.optim, optimizer_steps)
        prepare_run_folder(cfg, out, resume, dist)  # only now: everything above may refuse the start
        if dist.main:
            echo(note)
        start = 0
        if resume:
            start, _ = resume_checkpoint(out / "checkpoints", policy, optimizer, scheduler, dist, echo)
            drop_lost_steps(out, start, dist)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        mask_fn = schema_mask_fn(tokenizer) if cfg.schema_mode else None
        rollouts = Rollouts(cfg, dataset, policy, tokenizer, fast=fast_rollouts)
        log = TrainLog(out, enabled=dist.main, resume_step=start if resume else None)
        guard = guard_for_run(cfg.collapse_guard, out, start, dist)
        if cfg.eval.data and cfg.eval.at_start and start == 0:
            if dist.main:
                save_adapter(policy, out / "adapter-step0")
                evaluation = _evaluate(cfg, out / "adapter-step0", out / "eval" / "step-000000", rollouts)
                log.write(TrainStep(step=0).with_evaluation(*evaluation).to_json())
            dist.wait_for_main("evaluation of the starting adapter")  # bounded by eval.wait_s
        for step in range(start + 1, cfg.steps + 1):
            t0 = time.perf_counter()
            positions = step_task_positions(
                step, cfg.rollout.tasks_per_step, len(dataset.tasks), cfg.seed, dist.rank, dist.world
            )

            def roll(tasks, round_, step=step):
                groups = rollouts.run(tasks, step, round_)
                return groups, rollouts.generated

            def score(groups):
                return [[trajectory_reward(tr, labels[tr.task_id], cfg.reward, cfg.role) for tr in grp]
                        for grp in groups]

            sampled = sample_step(positions, dataset.tasks, roll, score, filter_groups=cfg.dynamic_sampling.enabled,
                                  max_extra_rounds=cfg.dynamic_sampling.max_extra_rounds, seed=cfg.seed, step=step,
                                  rank=dist.rank, role=cfg.role)
            groups, rewards = sampled.groups, sampled.rewards
            t_roll = time.perf_counter() - t0
            if cfg.save_rollouts:  # before the fault check: a stopped step's trajectories show its errors
                (out / "rollouts").mkdir(exist_ok=True)
                write_jsonl(
                    out / "rollouts" / f"step-{step:06d}.rank{dist.rank}.jsonl",
                    [{**tr.to_json(), "reward": r} for grp, rs in zip(groups, rewards) for tr, r in zip(grp, rs)],
                )
            # too many request errors: stop before training on what is left (train.grpo.failures)
            check_failed_share(sampled.faults, cfg.max_failed_share, step, out, dist,
                               lambda: next(reversed(checkpoints(out / "checkpoints")), None))
            batch = make_batch(cfg, groups, rewards, labels, tokenizer, sampled.generated)
            batch.counts.dropped = sampled.rows_dropped
            lr = optimizer.param_groups[0]["lr"]
            stats = update(policy, optimizer, batch, cfg, dist, pad_id, mask_fn, scheduler, step=step)
            require_finite(step, "the loss", stats.loss, applied=True)  # summed over ranks: all stop together
            batch.counts.consumed = stats.consumed
            record = step_record(step, batch, groups, stats, dist, lr, cfg.role, t0, t_roll, sampled)
            if (
                record.rows_generated != record.rows_converted + record.rows_dropped + record.rows_failed
                or record.rows_converted != record.rows_consumed
            ):
                batch.counts.check()  # this rank's view names the numbers, or the summed record another rank's
                raise RuntimeError(f"row-count contract broken on another rank: {record.to_json()}")
            eval_due = bool(cfg.eval.data) and (
                step == cfg.steps or bool(cfg.eval.every and step % cfg.eval.every == 0)
            )
            # The periodic evaluation reads the checkpoint's adapter, so an evaluation step is also a
            # checkpoint step: evaluations keep their own cadence (eval.every = 6 with
            # checkpoint_every = 4 evaluates at 6, 12, ...), not only on steps that are both.
            if step % cfg.checkpoint_every == 0 or step == cfg.steps or eval_due:
                position = {"tasks_seen": step * cfg.rollout.tasks_per_step}
                trainer = (policy, optimizer, scheduler, dist)
                folder = save_checkpoint(out / "checkpoints", step, *trainer, position, cfg.keep_checkpoints)
                if eval_due:
                    if dist.main:
                        record = record.with_evaluation(
                            *_evaluate(cfg, folder / "adapter", out / "eval" / f"step-{step:06d}", rollouts))
                    dist.wait_for_main(f"evaluation at step {step}")  # bounded by eval.wait_s
            log.write(record.to_json())
            if dist.main:
                echo(_step_line(record, cfg.steps))
            # Every rank holds the same summed record, so all ranks stop at the same step.
            if guard is not None and (reason := guard.observe(record)) is not None:
                stop_collapsed(guard, reason, record.step, out, dist)
        rollouts.close()
        log.close()
        return finish_run(
            policy, out, {"steps": cfg.steps, "role": cfg.role, "world_size": dist.world, "note": note}, dist
        )
    finally:
        dist.close()
