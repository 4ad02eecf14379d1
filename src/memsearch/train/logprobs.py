"""Recomputing completion log-probs of training rows with a model forward pass.

Rows are packed into micro-batches (sorted by length, at most ``max_tokens`` padded tokens),
left-padded exactly as the rollout decoder pads them (position ids start at 0 on each row's
first real token), and only the logits that predict completion tokens are computed
(``logits_to_keep``). Completions are right-aligned in a (rows, C) layout, so column j of every
row lines up with the logits window.

Log-probs are taken under the distribution the rollout sampled from: logits divided by the
sampling temperature and, for schema-mode rows, restricted to the tokens the constraint allowed
at that position (the mask is replayed from the constraint and the completion ids), then
renormalized. The LM head runs only at the positions whose log-prob is needed
(``scored_positions``): not over the prompt, not at a token the schema forces. With the same
weights in fp32 they equal the rollout log-probs up to float round-off (batching and padding
change summation order; ``tests/train`` states the tolerance).
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


# Positions whose entropy is computed at once (scored_positions): bounds its (chunk, V) temporaries.
ENTROPY_CHUNK = 256


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
    # Right-aligned column j of every row is predicted by padded position width - c_max - 1 + j.
    index_b = torch.arange(len(rows))[:, None].expand(len(rows), c_max)
    index_t = (width - c_max - 1 + torch.arange(c_max))[None, :].expand(len(rows), c_max)
    inputs = {"input_ids": ids.to(device), "attention_mask": attn.to(device), "position_ids": positions.to(device)}
    return scored_positions(model, inputs, index_b, index_t, rows, c_max, temperature, mask_fn, with_entropy)


def scored_positions(model, inputs: dict[str, torch.Tensor], index_b: torch.Tensor, index_t: torch.Tensor,
                     rows: Sequence[Row], c_max: int, temperature: float, mask_fn: MaskFn | None,
                     with_entropy: bool) -> Scored:
    """Log-probs (and entropies) of the rows' completion tokens, right-aligned (rows, C), from one
    forward pass of ``model`` over ``inputs``; (``index_b``, ``index_t``)[i, j] is the position
    whose logits predict row i's column j.

    The distribution is the one the rollout sampled from: logits / temperature, the replayed
    schema mask, log-softmax. The LM head runs only where a log-prob is needed: at tokens in the
    loss (``loss_mask``) whose position allows more than one token. A token the schema forces
    (one allowed token, the one taken) has log-prob exactly 0 under the renormalized
    distribution, entropy 0 and no gradient, so it is written as 0 without computing the
    vocabulary-wide logits; a token out of the loss reads 0 as before. Models whose logits are
    not a plain head over the decoder's last hidden state (``_head``) compute every logit and
    take the same positions from them.
    """
    device = next(model.parameters()).device
    targets = torch.zeros((len(rows), c_max), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), c_max), dtype=torch.bool)
    need = torch.zeros((len(rows), c_max), dtype=torch.bool)
    allowed_rows = []  # (V,) bool masks of the needed positions of constrained rows, in order
    for i, row in enumerate(rows):
        c = len(row.completion_ids)
        if not c:
            continue
        targets[i, c_max - c:] = torch.tensor(row.completion_ids, dtype=torch.long)
        in_loss = torch.tensor(row.loss_mask, dtype=torch.bool)
        loss_mask[i, c_max - c:] = in_loss
        allowed = mask_fn(row) if mask_fn is not None and row.constraint_id else None
        if allowed is None:
            need[i, c_max - c:] = in_loss
            continue
        if allowed.shape[0] != c:
            raise ValueError(f"constraint mask has {allowed.shape[0]} positions for {c} completion tokens")
        ids = torch.tensor(row.completion_ids, dtype=torch.long)
        in_vocab = ids < allowed.shape[1]
        target_allowed = allowed.gather(1, ids.clamp(max=allowed.shape[1] - 1)[:, None])[:, 0] & in_vocab
        forced = (allowed.sum(-1) == 1) & target_allowed
        keep = in_loss & ~forced
        need[i, c_max - c:] = keep
        allowed_rows.append((i, allowed[keep]))
    sel_i, sel_j = need.nonzero(as_tuple=True)
    logits = _logits_at(model, inputs, index_b[sel_i, sel_j].to(device), index_t[sel_i, sel_j].to(device)).float()
    if temperature != 1.0:
        logits = logits / temperature
    if allowed_rows:
        vocab = logits.shape[-1]
        allowed = torch.ones((len(sel_i), vocab), dtype=torch.bool)
        constrained = dict(allowed_rows)
        start = 0
        for i in sel_i.unique_consecutive().tolist():  # nonzero walks rows in order
            n = int(need[i].sum())
            if i in constrained:
                m = constrained[i]
                block = torch.zeros((n, vocab), dtype=torch.bool)
                block[:, : min(vocab, m.shape[1])] = m[:, :vocab]
                allowed[start : start + n] = block
            start += n
        logits = logits.masked_fill(~allowed.to(device), float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, targets[sel_i, sel_j].to(device)[:, None])[:, 0]
    flat = (sel_i * c_max + sel_j).to(device)
    token_lp = torch.zeros(len(rows) * c_max, device=device, dtype=picked.dtype).index_put((flat,), picked)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            # -sum p log p with the log-probs at hand (entr would take the log again, ~4 % of
            # an update); a schema-masked token has p = 0 and log p = -inf: it adds 0.
            # In chunks of positions: exp, clamp and their product are (N, V) float32 each, which
            # alive together beside the logits and log-softmax were the update's largest tensors
            # (train.memory_plan); a chunk's row sums are the same numbers.
            floor = torch.finfo(logp.dtype).min
            ent = torch.cat([-(part.exp() * part.clamp(min=floor)).sum(-1) for part in logp.split(ENTROPY_CHUNK)])
            entropy = torch.zeros(len(rows) * c_max, device=device, dtype=ent.dtype).index_put((flat,), ent)
            entropy = entropy.view(len(rows), c_max)
    return Scored(token_lp.view(len(rows), c_max), loss_mask.to(device), entropy)


def _logits_at(model, inputs: dict[str, torch.Tensor], index_b: torch.Tensor, index_t: torch.Tensor) -> torch.Tensor:
    """(N, V) logits of the positions (``index_b``, ``index_t``) of one forward pass over ``inputs``."""
    parts = _head(model)
    if parts is None:
        out = model(**inputs, use_cache=False)
        return out.logits[index_b, index_t]
    body, head = parts
    hidden = body(**inputs, use_cache=False).last_hidden_state
    return head(hidden[index_b, index_t])


def _head(model):
    """``(decoder, lm_head)`` of ``model`` (under a PEFT wrapper or not) when its logits are a plain
    head over the decoder (``backends.hf.model.plain_head``); None otherwise."""
    from memsearch.backends.hf.model import plain_head

    return plain_head(model.get_base_model() if hasattr(model, "get_base_model") else model)
