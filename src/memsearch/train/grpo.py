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
   trajectory inside its group, expanded to its rows without dropping any (``rows.build_batch``);
4. recompute log-probs (the schema mask replayed), clipped policy loss (+ k3 KL to the
   reference: the frozen starting adapter, or the base), micro-batched backward, gradients
   summed over ranks and divided by the global denominator, clip, AdamW step and LR-schedule
   step, once per mini-batch and epoch (``update``);
5. check the row-count contract, log (with the decision view: ``decisions``), stop if the
   collapse guard trips (``collapse``), checkpoint, evaluate.

``--resume`` continues from the newest intact checkpoint exactly (weights, optimizer,
scheduler, RNG, data position are functions of the step; a damaged one is named and skipped:
``train.checkpoint``). A non-finite loss, gradient norm or weight stops the run
(``train.finite``). The old log-probs of the ratio are
the trainer's own dropout-free forward pass before the first optimizer step (with one step per
batch, the detached new log-probs: the ratio is exactly 1); the rollout log-probs are kept and
their largest deviation from that recomputation, over the tokens in the loss, is logged
(``logprob_mismatch``: float round-off, < 1e-4 in float32, when sampler and trainer agree).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from memsearch.devices import apply_training_layout
from memsearch.engine.episode import derived_seed
from memsearch.errors import InputError
from memsearch.io import write_jsonl
from memsearch.train.checkpoint import resume_checkpoint, save_checkpoint
from memsearch.train.collapse import guard_for_run, stop_collapsed
from memsearch.train.config import GRPOConfig
from memsearch.train.decisions import mark_decisions, mask_invalid_decisions
from memsearch.train.distributed import Dist
from memsearch.train.dynamic_sampling import sample_step
from memsearch.train.finite import require_finite, require_finite_weights
from memsearch.train.log import TrainLog
from memsearch.train.logprobs import completion_logprobs, micro_batches
from memsearch.train.loss import assign_weights, policy_loss, split_mini_batches
from memsearch.train.rows import TRAINED_CALL_ROLES, Batch, Row, build_batch
from memsearch.train.run_folder import check_run_folder, drop_lost_steps, finish_run, prepare_run_folder
from memsearch.train.shared_prompt import shared_completion_logprobs, shared_micro_batches
from memsearch.train.state_credit import build_state_batch
from memsearch.train.step_record import UpdateStats, step_record


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


def _mask_fn(tokenizer):
    """Replays schema-mode masks from the constraint id and the completion ids."""
    from memsearch.backends.hf.constraint import compile_constraint, constraint_by_id

    def masks(row):
        return compile_constraint(constraint_by_id(row.constraint_id), tokenizer).masks_for(row.completion_ids)

    return masks


def update(
    model, optimizer, batch: Batch, cfg: GRPOConfig, dist: Dist, pad_id: int, mask_fn=None, scheduler=None,
    step: int = 0,
) -> UpdateStats:
    """``cfg.epochs`` passes over this rank's rows, ``cfg.mini_batches_per_step`` optimizer steps
    each (all ranks call it together); ``scheduler`` (if given) is stepped after every optimizer
    step, so a schedule sized ``steps * epochs * mini_batches_per_step`` ends where it should.
    A non-finite gradient norm (before the optimizer step) or weight (after it) stops training
    with a ``NonFiniteError`` naming ``step`` (``train.finite``).

    Mini-batches (``loss.split_mini_batches``): each rank deals its own trajectories, whole and
    in order, into ``mini_batches_per_step`` parts; optimizer step k is the loss over the union of
    every rank's part k, normalised by that union's denominator (the aggregation's D summed over
    the ranks by ``reduce_gradients``), i.e. exactly one process training on those rows. Every
    rank calls ``reduce_gradients`` once per part, empty or not, so the collectives stay in step;
    a step whose global denominator is 0 is skipped but still counts for the schedule (the
    learning rate is a function of the step number, which keeps ``--resume`` exact). So is a step
    none of whose rows (on any rank) has a non-zero advantage: it changes no weight and no
    optimizer state, and ``skipped_steps`` counts it.

    Old log-probs (when the ratio can depart from 1: epochs > 1 or mini-batches) and reference
    log-probs are taken once, before the first optimizer step, without dropout (eval mode). The
    update itself runs without dropout too unless ``cfg.disable_dropout`` is off. Statistics are
    those of the first epoch (over all its mini-batches).
    """
    from memsearch.train.policy import trainable_named_parameters

    rows = batch.rows
    named = trainable_named_parameters(model)
    params = [p for _, p in named]
    plan = _plan_mini_batches(rows, cfg)
    off_policy = cfg.epochs > 1 or cfg.mini_batches_per_step > 1
    fixed = _fixed_logprobs(model, rows, plan, cfg, pad_id, mask_fn, off_policy)
    signal = _signal(rows, plan, dist)
    model.train(not cfg.disable_dropout)
    first = _FirstEpoch.start(len(plan), fixed.gap)
    skipped = 0
    for epoch in range(cfg.epochs):
        tally = first if epoch == 0 else None
        for k, part in enumerate(plan):
            optimizer.zero_grad(set_to_none=False)
            for g, idx in enumerate(part.micro_batches):
                sub = [rows[i] for i in idx]
                _backward(model, sub, fixed, (k, g), cfg, pad_id, mask_fn, off_policy, tally)
            denominator = dist.reduce_gradients(params, part.local_denominator)
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm or float("inf"))
            # the all-reduced gradients are the same on every rank: all ranks stop together
            require_finite(step, f"the gradient norm (epoch {epoch + 1}, mini-batch {k + 1})", float(norm))
            # No row with an advantage: nothing to learn. AdamW would still move every weight
            # (momentum, weight decay) and advance its state, so the step is skipped outright.
            takes_step = denominator > 0 and signal[k]
            if takes_step:
                optimizer.step()
                require_finite_weights(step, named)
            else:
                skipped += 1
            if scheduler is not None:
                scheduler.step()
            if tally is not None:
                tally.stepped(k, denominator, float(norm), updated=takes_step)
    model.eval()
    stats = first.reduce(dist)
    stats.skipped_steps = skipped
    return stats


def _signal(rows: list[Row], plan: list[_MiniBatch], dist: Dist) -> list[bool]:
    """Per mini-batch: does any rank's part hold a row with a non-zero advantage and a token?"""
    local = {
        f"signal/{k}": float(sum(1 for g in part.micro_batches for i in g
                                 if rows[i].advantage != 0 and rows[i].completion_tokens))
        for k, part in enumerate(plan)
    }
    total = dist.all_sum_named(local)
    return [total[f"signal/{k}"] > 0 for k in range(len(plan))]


@dataclass
class _MiniBatch:
    """One optimizer step's share of this rank's rows."""

    local_denominator: float  # this rank's part of the aggregation's D
    micro_batches: list[list[int]]  # indices into the batch's rows


def _plan_mini_batches(rows: list[Row], cfg: GRPOConfig) -> list[_MiniBatch]:
    """This rank's rows dealt into ``cfg.mini_batches_per_step`` parts (some may be empty), each
    weighted by the aggregation and cut into micro-batches of at most ``micro_batch_tokens``."""
    plan = []
    for part in split_mini_batches(rows, cfg.mini_batches_per_step):
        sub = [rows[i] for i in part]
        local_denominator = assign_weights(sub, cfg.aggregation, cfg.aggregation_tokens)
        packer = shared_micro_batches if cfg.share_prompts else micro_batches
        micros = [[part[j] for j in idx] for idx in packer(sub, cfg.micro_batch_tokens)]
        plan.append(_MiniBatch(local_denominator, micros))
    return plan


@dataclass
class LogprobGap:
    """|recomputed - rollout| log-probs of the sampled tokens in the loss: the largest
    (``logprob_mismatch``), their sum and count (``logprob_mismatch_mean``). Float32 sampler and
    trainer agree to round-off (< 1e-4); a bf16 base leaves a bf16 round-off gap (largest ~0.3,
    mean ~0.005 on a v2 step: docs/results/grpo_speed.md), which the mean tells from a bug.

    A token out of the loss (``loss_mask`` 0: ``mask_invalid_decisions``) has no recomputed
    log-prob (``masked_logprobs`` writes 0 there) and is not compared: until 2026-12 it was, and
    the logged figure was the size of a masked token's rollout log-prob, not a gap between sampler
    and trainer (docs/training.md, "logprob_mismatch")."""

    worst: float = 0.0
    total: float = 0.0
    tokens: int = 0

    def add(self, logprobs: torch.Tensor, rows) -> None:
        """The rows' completion tokens (right-aligned in ``logprobs``)."""
        c_max = logprobs.shape[1]
        for k, row in enumerate(rows):
            c = len(row.completion_ids)
            if c:
                got = logprobs[k, c_max - c :].detach().cpu()
                keep = torch.tensor(row.loss_mask, dtype=torch.bool)
                if bool(keep.any()):
                    gap = (got - torch.tensor(row.rollout_logprobs, dtype=got.dtype)).abs()[keep]
                    self.worst = max(self.worst, float(gap.max()))
                    self.total += float(gap.sum())
                    self.tokens += int(gap.numel())


@dataclass
class _FixedLogprobs:
    """Log-probs taken before the first optimizer step, by (mini-batch, micro-batch)."""

    old: dict[tuple[int, int], torch.Tensor]  # of the policy that sampled (off-policy updates only)
    ref: dict[tuple[int, int], torch.Tensor]  # of the KL reference (kl_coef > 0 only)
    gap: LogprobGap  # |old - rollout| log-probs in the loss (empty when not off-policy)


def _fixed_logprobs(model, rows, plan: list[_MiniBatch], cfg: GRPOConfig, pad_id: int, mask_fn,
                    off_policy: bool) -> _FixedLogprobs:
    """Old and reference log-probs of the function the rollouts sampled from: eval mode, no dropout."""
    from memsearch.train.policy import reference_policy

    fixed = _FixedLogprobs({}, {}, LogprobGap())
    model.eval()
    with torch.no_grad():
        for k, part in enumerate(plan):
            for g, idx in enumerate(part.micro_batches):
                sub = [rows[i] for i in idx]
                if off_policy:
                    fixed.old[k, g] = _scorer(cfg)(model, sub, pad_id, cfg.temperature, mask_fn).logprobs
                    fixed.gap.add(fixed.old[k, g], sub)
                if cfg.kl_coef > 0:
                    with reference_policy(model):
                        fixed.ref[k, g] = _scorer(cfg)(model, sub, pad_id, cfg.temperature, mask_fn).logprobs
    return fixed


def _scorer(cfg: GRPOConfig):
    """How rows are scored: each prompt once per micro-batch (``share_prompts``), or row by row."""
    return shared_completion_logprobs if cfg.share_prompts else completion_logprobs


def _backward(model, sub, fixed: _FixedLogprobs, key: tuple[int, int], cfg: GRPOConfig, pad_id: int, mask_fn,
              off_policy: bool, tally: _FirstEpoch | None) -> None:
    """Backpropagate one micro-batch's weighted loss sum; ``tally`` (first epoch only) adds its
    statistics."""
    scored = _scorer(cfg)(model, sub, pad_id, cfg.temperature, mask_fn, with_entropy=tally is not None)
    old_lp = fixed.old[key] if off_policy else scored.logprobs.detach()
    adv = torch.tensor([r.advantage for r in sub], device=scored.logprobs.device)
    weights = torch.tensor([r.weight for r in sub], device=scored.logprobs.device)
    loss_sum, st = policy_loss(scored.logprobs, old_lp, adv, scored.mask, weights, cfg.clip_low, cfg.clip_high,
                               fixed.ref.get(key), cfg.kl_coef, cfg.dual_clip)
    if loss_sum.requires_grad:  # else every token is forced by the schema or out of the loss: no gradient
        loss_sum.backward()
    if tally is None:
        return
    tally.consumed += len(sub)
    tally.sums[_part_loss(key[0])] += loss_sum.item()
    for name in ("tokens", "clipped", "kl", "ratio"):
        tally.sums[name] += st[name]
    tally.sums["entropy"] += float(scored.entropy.sum()) if scored.entropy is not None else 0.0
    c_max = scored.logprobs.shape[1]
    for k, row in enumerate(sub):
        first_column = c_max - len(row.completion_ids)
        for pos in row.decision_positions:
            if not row.loss_mask[pos]:  # masked (mask_invalid_decisions): its entropy reads 0, not the policy's
                continue
            tally.sums["decision_entropy"] += float(scored.entropy[k, first_column + pos])
            tally.sums["decisions"] += 1
    if not off_policy:  # the first (and only) pass is before any update
        tally.gap.add(scored.logprobs.detach(), sub)


def _part_loss(k: int) -> str:
    return f"loss/{k}"


@dataclass
class _FirstEpoch:
    """What the first epoch adds up on this rank; ``reduce`` makes the update's ``UpdateStats``."""

    sums: dict[str, float]  # token statistics and each mini-batch's loss sum, summed over ranks by name
    denominators: list[float]  # each mini-batch's global denominator
    norms: list[float] = field(default_factory=list)  # gradient norms of the steps that updated
    consumed: int = 0
    gap: LogprobGap = field(default_factory=LogprobGap)

    @classmethod
    def start(cls, parts: int, gap: LogprobGap) -> _FirstEpoch:
        sums = {_part_loss(k): 0.0 for k in range(parts)}
        sums.update(dict.fromkeys(("tokens", "clipped", "kl", "entropy", "ratio", "decision_entropy", "decisions"),
                                  0.0))
        return cls(sums, [0.0] * parts, gap=gap)

    def stepped(self, k: int, denominator: float, norm: float, updated: bool) -> None:
        self.denominators[k] = denominator
        if updated:
            self.norms.append(norm)

    def reduce(self, dist: Dist) -> UpdateStats:
        """Sums over ranks; the loss is the mean over the first epoch's optimizer steps of each
        step's normalised loss, the token statistics are means per completion token."""
        total = dist.all_sum_named({**self.sums, "gap_total": self.gap.total, "gap_tokens": self.gap.tokens})
        losses = [total[_part_loss(k)] for k in range(len(self.denominators))]
        stepped = [loss / d for loss, d in zip(losses, self.denominators, strict=True) if d > 0]
        tokens = total["tokens"]
        stats = UpdateStats(
            loss=sum(stepped) / len(stepped) if stepped else 0.0,
            tokens=tokens,
            grad_norm=sum(self.norms) / len(self.norms) if self.norms else 0.0,
            consumed=self.consumed,
            denominator=sum(self.denominators),
        )
        if tokens:
            stats.clip_fraction = total["clipped"] / tokens
            stats.kl = total["kl"] / tokens
            stats.entropy = total["entropy"] / tokens
            stats.ratio_mean = total["ratio"] / tokens
        if total["decisions"]:
            stats.decision_entropy = total["decision_entropy"] / total["decisions"]
        stats.logprob_mismatch = dist.all_max([self.gap.worst])[0]
        if total["gap_tokens"]:
            stats.logprob_mismatch_mean = total["gap_total"] / total["gap_tokens"]
        return stats


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
            max_batch_size=cfg.max_batch_size,
            seed=cfg.seed,
            name="hf-policy",
            share_prompts=fast,
        )
        self.backends = self.shared.backends_with({role: self.policy_backend for role in self.trained})

    def config_for(self, step: int, k: int, round_: int = 0):
        """The episode config of rollout ``k`` at ``step``: trained roles sample at T with their own
        seed (an extra round of dynamic sampling has seeds of its own)."""
        from memsearch.config import RunConfig

        data = trained_role_backends(self.cfg, self.cfg.episode.model_dump(mode="json"))
        seed_parts = (self.cfg.seed, "rollout", step, k) + (("round", round_) if round_ else ())
        for role in self.trained:
            data["backends"][role]["sampling"] = {
                "temperature": self.cfg.temperature,
                "top_p": self.cfg.top_p,
                "seed": derived_seed(*seed_parts),
            }
        return RunConfig.model_validate(data)

    def run(self, tasks, step: int, round_: int = 0) -> list[list[dict[str, Any]]]:
        """``group_size`` trajectories per task, grouped by task (task order, then rollout index)."""
        from memsearch.engine.episode import run_episode
        from memsearch.train.policy import release_cached_memory

        if self.sampler is not None:
            with self.policy_backend.decoder.paused():  # no decode run sees half-copied weights
                self.sampler.refresh()  # the adapter as it is at this step
        envs = [
            self.shared.environment(self.config_for(step, k, round_), "grpo", answered_by=self.backends,
                                    branches=self.cfg.state_group_size if self.cfg.credit == "state" else 1)
            for k in range(self.cfg.group_size)
        ]

        async def all_episodes():
            return await asyncio.gather(*(run_episode(t, env) for t in tasks for env in envs))

        answered = self.policy_backend.completed
        before = sum(answered[role] for role in self.trained)
        flat = asyncio.run(all_episodes()) if tasks else []
        release_cached_memory(self.policy)  # the rollouts' KV caches: free for the update's activations
        # rows generated, counted where the calls are answered (not re-read from the trajectories)
        self.generated = sum(answered[role] for role in self.trained) - before
        g = self.cfg.group_size
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


def trained_role_backends(cfg: GRPOConfig, data: dict[str, Any], adapter: Path | None = None) -> dict[str, Any]:
    """``data`` (a dumped episode config) with the trained roles on the hf policy, sampled the
    way training samples them: the one place rollouts and periodic evaluation take it from, so
    the evaluated policy is the trained one (``schema_mode`` included)."""
    for role in TRAINED_CALL_ROLES[cfg.role]:
        data["backends"][role].update(kind="hf", schema_mode=cfg.schema_mode and role == "memory")
        if adapter is not None:
            data["backends"][role].update(model=cfg.model, adapter=str(adapter))
    return data


def _evaluate(cfg: GRPOConfig, adapter: Path, out: Path, rollouts: Rollouts) -> dict[str, Any]:
    """Greedy evaluation of the adapter through the eval runner (the same code path and records as
    `memsearch eval` of ``adapter``), the trained roles answered by the live policy, which holds
    that adapter's weights now: no second model is loaded (``train.live_eval``)."""
    from memsearch.config import RunConfig
    from memsearch.train.live_eval import evaluate_live

    data = trained_role_backends(cfg, cfg.episode.model_dump(mode="json"), adapter)
    data["limit"] = cfg.eval.limit
    summary = evaluate_live(RunConfig.model_validate(data), rollouts.trained, rollouts.evaluation_model(),
                            rollouts.tokenizer, cfg.eval.data, out)
    record = {
        "eval_" + k: v
        for k, v in summary["metrics"].items()
        if k in ("f1", "em", "sub_em", "boxed_em", "invalid_action_rate", "memory_support_recall",
                 "memory_support_precision")
    }
    if summary.get("memory_ops"):  # greedy decoding's ops: what the collapse guard's eval check reads
        record["eval_ops"] = {k.removeprefix("ops_"): v for k, v in summary["memory_ops"].items()}
    return record


def make_batch(cfg: GRPOConfig, groups, rewards, labels, tokenizer, generated: int) -> Batch:
    """A step's training rows from its trajectories (by task) and their rewards: advantages by
    ``cfg.credit``, decision tokens marked, invalid decisions masked by
    ``cfg.invalid_decision_credit``. ``generated``: completions the policy backend returned."""
    if cfg.credit == "state":
        batch = build_state_batch(groups, rewards, labels, cfg.state_reward, std_scale=cfg.std_scale,
                                  global_weight=cfg.global_weight, generated=generated)
    else:
        batch = build_batch(groups, rewards, cfg.role, cfg.credit, cfg.std_scale, generated=generated)
    mark_decisions(batch.rows, tokenizer)
    if cfg.invalid_decision_credit != "all":
        batch.masked_decision_tokens = mask_invalid_decisions(
            batch.rows, keep_over_budget=cfg.invalid_decision_credit == "over_budget")
    return batch


def train_grpo(cfg: GRPOConfig, out: str | Path, resume: bool = False, echo=print,
               fast_rollouts: bool = True) -> dict[str, Any]:
    """Train (or resume) a GRPO run into ``out``; returns the final summary. ``fast_rollouts``
    off samples from the PEFT policy itself with every prompt prefilled (``Rollouts``): slower,
    the same run up to float round-off, kept to check that claim."""
    from memsearch.data.dataset import load_dataset
    from memsearch.train.memory_plan import check_device_memory
    from memsearch.train.policy import load_policy, make_optimizer, save_adapter
    from memsearch.train.reward import trajectory_reward

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
            keep_reference=cfg.kl_coef > 0 and cfg.kl_reference == "start",
            gradient_checkpointing=cfg.gradient_checkpointing,
        )
        optimizer, scheduler = make_optimizer(policy, cfg.optim, cfg.steps * cfg.epochs * cfg.mini_batches_per_step)
        prepare_run_folder(cfg, out, resume, dist)  # only now: everything above may refuse the start
        if dist.main:
            echo(note)
        start = 0
        if resume:
            start, _ = resume_checkpoint(out / "checkpoints", policy, optimizer, scheduler, dist, echo)
            drop_lost_steps(out, start, dist)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        mask_fn = _mask_fn(tokenizer) if cfg.schema_mode else None
        rollouts = Rollouts(cfg, dataset, policy, tokenizer, fast=fast_rollouts)
        log = TrainLog(out, enabled=dist.main, resume_step=start if resume else None)
        guard = guard_for_run(cfg.collapse_guard, out, start, dist)
        if cfg.eval.data and cfg.eval.at_start and start == 0:
            if dist.main:
                save_adapter(policy, out / "adapter-step0")
                log.write({"step": 0, **_evaluate(cfg, out / "adapter-step0", out / "eval" / "step-000000",
                                                   rollouts)})
            dist.wait_for_main("evaluation of the starting adapter")  # bounded by eval.wait_s
        for step in range(start + 1, cfg.steps + 1):
            t0 = time.perf_counter()
            positions = step_task_positions(
                step, cfg.tasks_per_step, len(dataset.tasks), cfg.seed, dist.rank, dist.world
            )

            def roll(tasks, round_, step=step):
                groups = rollouts.run(tasks, step, round_)
                return groups, rollouts.generated

            def score(groups):
                return [[trajectory_reward(tr, labels[tr["task_id"]], cfg.reward, cfg.role) for tr in grp]
                        for grp in groups]

            sampled = sample_step(positions, dataset.tasks, roll, score, filter_groups=cfg.dynamic_sampling.enabled,
                                  max_extra_rounds=cfg.dynamic_sampling.max_extra_rounds, seed=cfg.seed, step=step,
                                  rank=dist.rank, role=cfg.role)
            groups, rewards = sampled.groups, sampled.rewards
            t_roll = time.perf_counter() - t0
            batch = make_batch(cfg, groups, rewards, labels, tokenizer, sampled.generated)
            batch.counts.dropped = sampled.rows_dropped
            lr = optimizer.param_groups[0]["lr"]
            stats = update(policy, optimizer, batch, cfg, dist, pad_id, mask_fn, scheduler, step=step)
            require_finite(step, "the loss", stats.loss, applied=True)  # summed over ranks: all stop together
            batch.counts.consumed = stats.consumed
            record = step_record(step, batch, groups, stats, dist, lr, cfg.role, t0, t_roll, sampled)
            if (
                record["rows_generated"] != record["rows_converted"] + record["rows_dropped"]
                or record["rows_converted"] != record["rows_consumed"]
            ):
                batch.counts.check()  # this rank's view names the numbers ...
                raise RuntimeError(f"row-count contract broken on another rank: {record}")  # ... or another rank's
            if cfg.save_rollouts:
                (out / "rollouts").mkdir(exist_ok=True)
                write_jsonl(
                    out / "rollouts" / f"step-{step:06d}.rank{dist.rank}.jsonl",
                    [dict(tr, reward=r) for grp, rs in zip(groups, rewards) for tr, r in zip(grp, rs)],
                )
            eval_due = bool(cfg.eval.data) and (
                step == cfg.steps or bool(cfg.eval.every and step % cfg.eval.every == 0)
            )
            # The periodic evaluation reads the checkpoint's adapter, so an evaluation step is also a
            # checkpoint step: evaluations keep their own cadence (eval.every = 6 with
            # checkpoint_every = 4 evaluates at 6, 12, ...), not only on steps that are both.
            if step % cfg.checkpoint_every == 0 or step == cfg.steps or eval_due:
                position = {"tasks_seen": step * cfg.tasks_per_step}
                trainer = (policy, optimizer, scheduler, dist)
                folder = save_checkpoint(out / "checkpoints", step, *trainer, position, cfg.keep_checkpoints)
                if eval_due:
                    if dist.main:
                        record.update(_evaluate(cfg, folder / "adapter", out / "eval" / f"step-{step:06d}", rollouts))
                    dist.wait_for_main(f"evaluation at step {step}")  # bounded by eval.wait_s
            log.write(record)
            if dist.main:
                echo(
                    f"step {step}/{cfg.steps}: reward {record['reward_mean']:.3f} (std {record['reward_std']:.3f}), "
                    f"zero-variance groups {record['zero_variance_groups']}/{record['groups']}, rows "
                    f"{record['rows_consumed']}, "
                    f"invalid {record['invalid_rate']:.2f}, {record['step_s']:.1f}s"
                )
            # Every rank holds the same summed record, so all ranks stop at the same step.
            if guard is not None and (reason := guard.observe(record)) is not None:
                stop_collapsed(guard, reason, record["step"], out, dist)
        rollouts.close()
        log.close()
        return finish_run(
            policy, out, {"steps": cfg.steps, "role": cfg.role, "world_size": dist.world, "note": note}, dist
        )
    finally:
        dist.close()
