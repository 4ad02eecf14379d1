"""The clipped policy loss of GRPO, as pure functions (docs/design.md §7).

Per completion token t of a row with advantage A::

    ratio_t = exp(clamp(logp_new_t - logp_old_t, -20, 20))
    pg_t    = -min(ratio_t * A, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A)
    pg_t    = min(pg_t, -A * c)          if A < 0 and dual_clip c is set (dual-clip PPO)
    d_t     = clamp(ref_t - new_t, -20, 20)
    kl_t    = clamp(exp(d_t) - d_t - 1, -10, 10)       (k3 estimator, >= 0; only if kl_coef > 0)
    loss_t  = pg_t + kl_coef * kl_t

The clamps are verl's (``kl_penalty`` "low_var_kl", and its clamp of the log-ratio): a token whose
log-prob moved by more than 20 nats would overflow ``exp`` in float32 and turn the loss, and then
every gradient, into inf/nan; where a clamp is active the token's gradient is 0. The dual clip
(verl's ``clip_ratio_c``) bounds the loss of a negative-advantage token whose ratio has grown far
above 1, which only happens once the ratio departs from 1 (mini-batches, epochs > 1).

Aggregation is a per-token weight w_t and a denominator D, so that loss = sum_t w_t loss_t / D:

- ``trajectory`` (default): w_t = 1 / (generated tokens of its trajectory), D = trajectories
  with at least one generated token -> every trajectory counts once, however many rows or tokens;
- ``token``: w_t = 1, D = all generated tokens;
- ``sequence``: w_t = 1 / (tokens of its row), D = rows with at least one token;
- ``constant``: w_t = 1 / L for a constant L (``aggregation_tokens``), D = trajectories with at
  least one generated token: Dr. GRPO's length-unbiased form (arXiv 2503.20783; verl's
  ``seq-mean-token-sum-norm`` normalises by a constant the same way). Under ``trajectory`` a
  token's weight is 1 / (its trajectory's tokens), so the op token of a 39-token all-NOOP
  trajectory is pushed ~3x harder than the same token in a 120-token one; here every token of
  every trajectory has the same weight, and L scales the loss, never its direction.

Writing it as sums with a separate denominator is what makes gradient accumulation over
micro-batches and across ranks exact: each micro-batch adds ``sum_t w_t loss_t``; the ranks
all-reduce the sums of gradients and of D, then divide (``distributed.reduce_gradients``), which
equals one process training on the union of the rows. With mini-batches (``split_mini_batches``)
the weights and D are those of the mini-batch: each optimizer step is this loss over its rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from memsearch.train.rows import Row

AGGREGATIONS = ("trajectory", "token", "sequence", "constant")
LOG_RATIO_CLAMP = 20.0  # verl: log-ratios clamped to +-20 before exp (finite in float32)
K3_CLAMP = 10.0  # verl's "low_var_kl": the k3 value clamped to +-10


def split_mini_batches(rows: Sequence[Row], count: int) -> list[list[int]]:
    """Indices of ``rows`` in ``count`` mini-batches of whole trajectories, in trajectory order.

    A trajectory's rows always stay together, so its normalisation (``trajectory`` aggregation)
    and its advantage are those of one optimizer step. The distinct trajectories are dealt into
    ``count`` consecutive, nearly equal parts (sizes differ by at most one, larger parts first);
    parts may be empty (fewer trajectories than mini-batches) and are still returned, because
    every rank must take part in every optimizer step's gradient reduction.
    """
    order: list[int] = []
    members: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        if row.trajectory not in members:
            members[row.trajectory] = []
            order.append(row.trajectory)
        members[row.trajectory].append(i)
    size, extra = divmod(len(order), count)
    out, start = [], 0
    for k in range(count):
        end = start + size + (1 if k < extra else 0)
        out.append([i for t in order[start:end] for i in members[t]])
        start = end
    return out


def aggregation_weights(rows: Sequence[Row], aggregation: str, constant_tokens: int = 256
                        ) -> tuple[list[float], float]:
    """Each row's per-token weight for ``aggregation`` (in ``rows`` order) and this rank's denominator.

    ``constant_tokens`` is L of the ``constant`` aggregation (unused by the others). The weights
    belong to one mini-batch's deal of rows, not to a row, so they are returned, not stored."""
    if aggregation == "constant":
        return [1.0 / constant_tokens] * len(rows), float(len({r.trajectory for r in rows if r.completion_tokens}))
    if aggregation == "token":
        return [1.0] * len(rows), float(sum(r.completion_tokens for r in rows))
    if aggregation == "sequence":
        return ([1.0 / r.completion_tokens if r.completion_tokens else 0.0 for r in rows],
                float(sum(1 for r in rows if r.completion_tokens)))
    if aggregation == "trajectory":
        tokens: dict[int, int] = {}
        for row in rows:
            tokens[row.trajectory] = tokens.get(row.trajectory, 0) + row.completion_tokens
        return ([1.0 / tokens[r.trajectory] if tokens[r.trajectory] else 0.0 for r in rows],
                float(sum(1 for n in tokens.values() if n)))
    raise ValueError(f"unknown aggregation {aggregation!r}: expected one of {', '.join(AGGREGATIONS)}")


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    clip_low: float,
    clip_high: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``sum_t w_t loss_t`` over a padded (rows, tokens) micro-batch, and summed statistics.

    Args:
        new_logprobs: (B, T) log-probs under the weights being trained (with grad).
        old_logprobs: (B, T) log-probs of the policy that sampled (no grad).
        advantages: (B,) one advantage per row.
        mask: (B, T) 1 for completion tokens in the loss, 0 for padding.
        weights: (B,) per-token weight of each row (``aggregation_weights``).
        ref_logprobs: (B, T) reference log-probs, needed when ``kl_coef > 0``.
        dual_clip: the dual-clip bound c > 1 for negative advantages (None or 0: no dual clip).

    Returns the weighted loss sum (divide by the global denominator) and sums over masked
    tokens: ``tokens``, ``clipped`` (tokens where the clip is active), ``dual_clipped`` (tokens
    where the dual clip is active), ``kl``, ``ratio``.
    """
    mask = mask.to(new_logprobs.dtype)
    adv = advantages[:, None].to(new_logprobs.dtype)
    ratio = torch.exp(torch.clamp(new_logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    dual = torch.zeros_like(per_token, dtype=torch.bool)
    if dual_clip:
        bound = -adv * dual_clip
        dual = (adv < 0) & (per_token > bound)
        per_token = torch.where(dual, bound.expand_as(per_token), per_token)
    kl = None
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        delta = torch.clamp(ref_logprobs - new_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl = torch.clamp(torch.exp(delta) - delta - 1.0, -K3_CLAMP, K3_CLAMP)
        per_token = per_token + kl_coef * kl
    loss_sum = (per_token * mask * weights[:, None].to(new_logprobs.dtype)).sum()
    with torch.no_grad():
        stats = {
            "tokens": float(mask.sum()),
            "clipped": float(((clipped < unclipped).to(mask.dtype) * mask).sum()),
            "dual_clipped": float((dual.to(mask.dtype) * mask).sum()),
            "kl": float((kl * mask).sum()) if kl is not None else 0.0,
            "ratio": float((ratio * mask).sum()),
        }
    return loss_sum, stats
