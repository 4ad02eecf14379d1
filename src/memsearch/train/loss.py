"""The clipped policy loss of GRPO, as pure functions (docs/design.md §7).

Per completion token t of a row with advantage A::

    ratio_t = exp(logp_new_t - logp_old_t)
    pg_t    = -min(ratio_t * A, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A)
    kl_t    = exp(ref_t - new_t) - (ref_t - new_t) - 1      (k3 estimator, >= 0; only if kl_coef > 0)
    loss_t  = pg_t + kl_coef * kl_t

Aggregation is a per-token weight w_t and a denominator D, so that loss = sum_t w_t loss_t / D:

- ``trajectory`` (default): w_t = 1 / (generated tokens of its trajectory), D = trajectories
  with at least one generated token -> every trajectory counts once, however many rows or tokens;
- ``token``: w_t = 1, D = all generated tokens;
- ``sequence``: w_t = 1 / (tokens of its row), D = rows with at least one token.

Writing it as sums with a separate denominator is what makes gradient accumulation over
micro-batches and across ranks exact: each micro-batch adds ``sum_t w_t loss_t``; the ranks
all-reduce the sums of gradients and of D, then divide (``distributed.reduce_gradients``), which
equals one process training on the union of the rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from memsearch.train.rows import Row

AGGREGATIONS = ("trajectory", "token", "sequence")


def assign_weights(rows: Sequence[Row], aggregation: str) -> float:
    """Set ``row.weight`` (the per-token weight) for ``aggregation``; return this rank's denominator."""
    if aggregation == "token":
        for row in rows:
            row.weight = 1.0
        return float(sum(r.completion_tokens for r in rows))
    if aggregation == "sequence":
        for row in rows:
            row.weight = 1.0 / row.completion_tokens if row.completion_tokens else 0.0
        return float(sum(1 for r in rows if r.completion_tokens))
    if aggregation == "trajectory":
        tokens: dict[int, int] = {}
        for row in rows:
            tokens[row.trajectory] = tokens.get(row.trajectory, 0) + row.completion_tokens
        for row in rows:
            row.weight = 1.0 / tokens[row.trajectory] if tokens[row.trajectory] else 0.0
        return float(sum(1 for n in tokens.values() if n))
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
) -> tuple[torch.Tensor, dict[str, float]]:
    """``sum_t w_t loss_t`` over a padded (rows, tokens) micro-batch, and summed statistics.

    Args:
        new_logprobs: (B, T) log-probs under the weights being trained (with grad).
        old_logprobs: (B, T) log-probs of the policy that sampled (no grad).
        advantages: (B,) one advantage per row.
        mask: (B, T) 1 for completion tokens in the loss, 0 for padding.
        weights: (B,) per-token weight of each row (``assign_weights``).
        ref_logprobs: (B, T) reference log-probs, needed when ``kl_coef > 0``.

    Returns the weighted loss sum (divide by the global denominator) and sums over masked
    tokens: ``tokens``, ``clipped`` (tokens where the clip is active), ``kl``, ``ratio``.
    """
    mask = mask.to(new_logprobs.dtype)
    adv = advantages[:, None].to(new_logprobs.dtype)
    ratio = torch.exp(new_logprobs - old_logprobs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl = None
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        delta = ref_logprobs - new_logprobs
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + kl_coef * kl
    loss_sum = (per_token * mask * weights[:, None].to(new_logprobs.dtype)).sum()
    with torch.no_grad():
        stats = {
            "tokens": float(mask.sum()),
            "clipped": float(((clipped < unclipped).to(mask.dtype) * mask).sum()),
            "kl": float((kl * mask).sum()) if kl is not None else 0.0,
            "ratio": float((ratio * mask).sum()),
        }
    return loss_sum, stats
