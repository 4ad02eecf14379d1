"""Recomputing completion log-probs of training rows with a model forward pass.

Rows are packed into micro-batches (sorted by length, at most ``max_tokens`` padded tokens),
left-padded exactly as the rollout decoder pads them (position ids start at 0 on each row's
first real token), and only the logits that predict completion tokens are computed
(``logits_to_keep``). Completions are right-aligned in a (rows, C) layout, so column j of every
row lines up with the logits window.

Log-probs are taken under the distribution the rollout sampled from: logits divided by the
sampling temperature and, for schema-mode rows, restricted to the tokens the constraint allowed
at that position (the mask is replayed from the constraint and the completion ids), then
renormalized. With the same weights in fp32 they equal the rollout log-probs up to float
round-off (batching and padding change summation order; ``tests/train`` states the tolerance).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from memsearch.train.rows import Row

MaskFn = Callable[[Row], "torch.Tensor | None"]


def micro_batches(rows: Sequence[Row], max_tokens: int) -> list[list[int]]:
    """Indices of ``rows`` packed into micro-batches of at most ``max_tokens`` padded tokens
    (a longer row gets a batch of its own). Deterministic: sorted by length, then index."""
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i].prompt_ids) + len(rows[i].completion_ids), i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        n = len(rows[i].prompt_ids) + len(rows[i].completion_ids)
        if current and max(longest, n) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


@dataclass
class Scored:
    """Per-token results of one micro-batch, right-aligned: (rows, C)."""

    logprobs: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor | None


def completion_logprobs(
    model,
    rows: Sequence[Row],
    pad_id: int,
    temperature: float = 1.0,
    mask_fn: MaskFn | None = None,
    with_entropy: bool = False,
) -> Scored:
    """Log-probs (and optionally entropies) of each row's completion tokens under ``model``.

    Gradients flow when called outside ``torch.no_grad()``.
    """
    device = next(model.parameters()).device
    lengths = [len(r.prompt_ids) + len(r.completion_ids) for r in rows]
    width = max(lengths)
    c_max = max(len(r.completion_ids) for r in rows)
    if c_max == 0:
        zeros = torch.zeros((len(rows), 0), device=device)
        return Scored(zeros, zeros.bool(), zeros if with_entropy else None)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        seq = row.prompt_ids + row.completion_ids
        ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        attn[i, width - len(seq):] = 1
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    ids, attn, positions = ids.to(device), attn.to(device), positions.to(device)
    out = model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=False, logits_to_keep=c_max + 1)
    # Window position k predicts the token at padded position width - c_max + k: the first
    # c_max positions of the window predict the right-aligned completion columns.
    return masked_logprobs(out.logits[:, :c_max, :].float(), rows, c_max, temperature, mask_fn, with_entropy)


def masked_logprobs(logits: torch.Tensor, rows: Sequence[Row], c_max: int, temperature: float,
                    mask_fn: MaskFn | None, with_entropy: bool) -> Scored:
    """Log-probs (and entropies) of the rows' completion tokens from (rows, C, V) logits that
    predict them, right-aligned: temperature, the replayed schema mask, then log-softmax."""
    device = logits.device
    targets = torch.zeros((len(rows), c_max), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), c_max), dtype=torch.bool)
    for i, row in enumerate(rows):
        c = len(row.completion_ids)
        if c:
            targets[i, c_max - c:] = torch.tensor(row.completion_ids, dtype=torch.long)
            loss_mask[i, c_max - c:] = torch.tensor(row.loss_mask, dtype=torch.bool)
    targets, loss_mask = targets.to(device), loss_mask.to(device)
    if temperature != 1.0:
        logits = logits / temperature
    if mask_fn is not None:
        allowed = _allowed(rows, mask_fn, c_max, logits.shape[-1], device)
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    token_lp = logp.gather(-1, targets[..., None])[..., 0]
    token_lp = torch.where(loss_mask, token_lp, torch.zeros_like(token_lp))
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = torch.special.entr(logp.exp()).sum(-1) * loss_mask
    return Scored(token_lp, loss_mask, entropy)


def _allowed(rows: Sequence[Row], mask_fn: MaskFn, c_max: int, vocab: int, device) -> torch.Tensor | None:
    """(rows, C, V) allowed-token masks, right-aligned; None when no row has a constraint."""
    per_row = [mask_fn(r) if r.constraint_id else None for r in rows]
    if all(m is None for m in per_row):
        return None
    allowed = torch.ones((len(rows), c_max, vocab), dtype=torch.bool, device=device)
    for i, m in enumerate(per_row):
        if m is None:
            continue
        c = len(rows[i].completion_ids)
        if m.shape[0] != c:
            raise ValueError(f"constraint mask has {m.shape[0]} positions for {c} completion tokens")
        block = torch.zeros((c, vocab), dtype=torch.bool, device=device)
        block[:, : min(vocab, m.shape[1])] = m[:, :vocab].to(device)
        allowed[i, c_max - c:] = block
    return allowed
