"""The GRPO update of one rollout batch (``update``): ``epochs`` passes over this rank's rows,
``mini_batches_per_step`` optimizer steps each, gradients summed over ranks (docs/design.md §7).

Old log-probs of the ratio are the trainer's own dropout-free forward pass before the first
optimizer step (with one step per batch, the detached new log-probs: the ratio is exactly 1);
the rollout log-probs are kept and their largest deviation from that recomputation, over the
tokens in the loss, is logged (``logprob_mismatch``: float round-off, < 1e-4 in float32, when
sampler and trainer agree). ``train.grpo.trainer`` runs the step around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from memsearch.train.config import GRPOConfig
from memsearch.train.distributed import Dist
from memsearch.train.finite import require_finite, require_finite_weights
from memsearch.train.grpo.batch import Batch
from memsearch.train.grpo.loss import aggregation_weights, policy_loss, split_mini_batches
from memsearch.train.grpo.shared_prompt import shared_completion_logprobs, shared_micro_batches
from memsearch.train.grpo.step_record import UpdateStats
from memsearch.train.logprobs import completion_logprobs, micro_batches
from memsearch.train.rows import Row


def update(
    model, optimizer, batch: Batch, cfg: GRPOConfig, dist: Dist, pad_id: int, mask_fn=None, scheduler=None,
    step: int = 0,
) -> UpdateStats:
    """``cfg.update.epochs`` passes over this rank's rows, ``cfg.update.mini_batches_per_step`` optimizer steps
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
    update itself runs without dropout too unless ``cfg.update.disable_dropout`` is off. Statistics are
    those of the first epoch (over all its mini-batches).
    """
    from memsearch.train.policy import trainable_named_parameters

    rows = batch.rows
    named = trainable_named_parameters(model)
    params = [p for _, p in named]
    plan = _plan_mini_batches(rows, cfg)
    off_policy = cfg.update.epochs > 1 or cfg.update.mini_batches_per_step > 1
    fixed = _fixed_logprobs(model, rows, plan, cfg, pad_id, mask_fn, off_policy)
    signal = _signal(rows, plan, dist)
    model.train(not cfg.update.disable_dropout)
    first = _FirstEpoch.start(len(plan), fixed.gap)
    skipped = 0
    for epoch in range(cfg.update.epochs):
        tally = first if epoch == 0 else None
        for k, part in enumerate(plan):
            optimizer.zero_grad(set_to_none=False)
            for g, idx in enumerate(part.micro_batches):
                sub = [rows[i] for i in idx]
                weights = [part.weights[i] for i in idx]
                _backward(model, sub, weights, fixed, (k, g), cfg, pad_id, mask_fn, off_policy, tally)
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
    weights: dict[int, float]  # per-token weight of each of its rows (by index into the batch's rows)


def _plan_mini_batches(rows: list[Row], cfg: GRPOConfig) -> list[_MiniBatch]:
    """This rank's rows dealt into ``cfg.update.mini_batches_per_step`` parts (some may be empty), each
    weighted by the aggregation and cut into micro-batches of at most ``micro_batch_tokens``."""
    plan = []
    for part in split_mini_batches(rows, cfg.update.mini_batches_per_step):
        sub = [rows[i] for i in part]
        weights, local_denominator = aggregation_weights(sub, cfg.loss.aggregation, cfg.loss.aggregation_tokens)
        packer = shared_micro_batches if cfg.update.share_prompts else micro_batches
        micros = [[part[j] for j in idx] for idx in packer(sub, cfg.update.micro_batch_tokens)]
        plan.append(_MiniBatch(local_denominator, micros, dict(zip(part, weights, strict=True))))
    return plan


@dataclass
class LogprobGap:
    """|recomputed - rollout| log-probs of the sampled tokens in the loss: the largest
    (``logprob_mismatch``), their sum and count (``logprob_mismatch_mean``). Float32 sampler and
    trainer agree to round-off (< 1e-4); a bf16 base leaves a bf16 round-off gap (largest ~0.3,
    mean ~0.005 on a CPU-recipe step: docs/results/grpo_speed.md), which the mean tells from a bug.

    A token out of the loss (``loss_mask`` 0: ``decisions.DecisionRule``) has no recomputed
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
                    fixed.old[k, g] = row_scorer(cfg)(model, sub, pad_id, cfg.rollout.temperature, mask_fn).logprobs
                    fixed.gap.add(fixed.old[k, g], sub)
                if cfg.loss.kl_coef > 0:
                    with reference_policy(model):
                        fixed.ref[k, g] = row_scorer(cfg)(model, sub, pad_id, cfg.rollout.temperature, mask_fn).logprobs
    return fixed


def row_scorer(cfg: GRPOConfig):
    """How the update scores rows (public: studies measure the same call): each prompt once per
    micro-batch (``share_prompts``), or row by row."""
    return shared_completion_logprobs if cfg.update.share_prompts else completion_logprobs


def _backward(model, sub, weights: list[float], fixed: _FixedLogprobs, key: tuple[int, int], cfg: GRPOConfig,
              pad_id: int, mask_fn, off_policy: bool, tally: _FirstEpoch | None) -> None:
    """Backpropagate one micro-batch's weighted loss sum (``weights``: its rows' aggregation
    weights); ``tally`` (first epoch only) adds its statistics."""
    scored = row_scorer(cfg)(model, sub, pad_id, cfg.rollout.temperature, mask_fn, with_entropy=tally is not None)
    old_lp = fixed.old[key] if off_policy else scored.logprobs.detach()
    adv = torch.tensor([r.advantage for r in sub], device=scored.logprobs.device)
    loss_sum, st = policy_loss(scored.logprobs, old_lp, adv, scored.mask,
                               torch.tensor(weights, device=scored.logprobs.device), cfg.loss.clip_low,
                               cfg.loss.clip_high, fixed.ref.get(key), cfg.loss.kl_coef, cfg.loss.dual_clip)
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
            if not row.loss_mask[pos]:  # masked (decisions.DecisionRule): its entropy reads 0, not the policy's
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
