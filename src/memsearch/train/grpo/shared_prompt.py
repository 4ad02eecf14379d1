"""Log-probs of rows that share a prompt, with the prompt computed once (``share_prompts``).

The rows of a state group (``train.grpo.state_credit``), and the first memory calls of a task's
rollouts, have the same ~330-token prompt and differ in a ~40-token completion. Scoring them one
row at a time runs the prompt through the model G times. Here each set of rows with one prompt
is *packed* into one sequence ``prompt, completion_1, ..., completion_G`` with a block attention
mask: every completion attends to the prompt and, causally, to itself, never to another
completion; its position ids continue the prompt's (``P, P+1, ...``), exactly the positions it
has when scored alone. A packed sequence of P + sum(c_i) tokens replaces G sequences of P + c_i,
and the log-probs (and gradients) equal the unshared computation up to float round-off
(``tests/train/grpo/test_shared_prompt.py`` checks gradients to 1e-5).

The result has the layout of ``logprobs.completion_logprobs`` (rows, C), right-aligned, in the
order of the rows given, so the loss code does not know which path computed it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from memsearch.train.logprobs import MaskFn, Scored, scored_positions
from memsearch.train.rows import Row


def prompt_groups(rows: Sequence[Row]) -> list[list[int]]:
    """Indices of ``rows`` grouped by identical prompt ids, groups in order of first appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(tuple(row.prompt_ids), []).append(i)
    return list(groups.values())


def packed_length(rows: Sequence[Row], members: Sequence[int]) -> int:
    """Tokens of one packed sequence: the shared prompt once, then every completion."""
    return len(rows[members[0]].prompt_ids) + sum(len(rows[i].completion_ids) for i in members)


def shared_micro_batches(rows: Sequence[Row], max_tokens: int) -> list[list[int]]:
    """Indices of ``rows`` in micro-batches of whole prompt groups, at most ``max_tokens`` padded
    packed tokens each (a longer group gets a batch of its own). Deterministic."""
    groups = sorted(prompt_groups(rows), key=lambda g: (packed_length(rows, g), g[0]))
    batches: list[list[int]] = []
    current: list[int] = []
    count = longest = 0
    for members in groups:
        n = packed_length(rows, members)
        if current and max(longest, n) * (count + 1) > max_tokens:
            batches.append(current)
            current, count, longest = [], 0, 0
        current.extend(members)
        count += 1
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


def shared_completion_logprobs(model, rows: Sequence[Row], pad_id: int, temperature: float = 1.0,
                               mask_fn: MaskFn | None = None, with_entropy: bool = False) -> Scored:
    """``completion_logprobs`` of ``rows``, each distinct prompt computed once (module doc)."""
    device = next(model.parameters()).device
    c_max = max(len(r.completion_ids) for r in rows)
    if c_max == 0:
        zeros = torch.zeros((len(rows), 0), device=device)
        return Scored(zeros, zeros.bool(), zeros if with_entropy else None)
    groups = prompt_groups(rows)
    width = max(packed_length(rows, g) for g in groups)
    ids = torch.full((len(groups), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(groups), width), dtype=torch.long)
    # segment[b, t]: 0 = prompt, k >= 1 = completion k of the group, -1 = padding
    segment = torch.full((len(groups), width), -1, dtype=torch.long)
    # For each row: (packed row, index of the position that predicts its first completion token).
    where: list[tuple[int, int, int]] = [(0, 0, 0)] * len(rows)  # (packed row, completion start, prompt length)
    for b, members in enumerate(groups):
        prompt = rows[members[0]].prompt_ids
        p = len(prompt)
        ids[b, :p] = torch.tensor(prompt, dtype=torch.long)
        positions[b, :p] = torch.arange(p)
        segment[b, :p] = 0
        at = p
        for k, i in enumerate(members, start=1):
            c = len(rows[i].completion_ids)
            ids[b, at:at + c] = torch.tensor(rows[i].completion_ids, dtype=torch.long)
            positions[b, at:at + c] = torch.arange(p, p + c)
            segment[b, at:at + c] = k
            where[i] = (b, at, p)
            at += c
    # Query t may attend to key s when s <= t and s is the prompt or t's own completion; a padding
    # query attends to itself only (no row of the mask is empty).
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    same = segment[:, :, None] == segment[:, None, :]
    prompt_key = (segment == 0)[:, None, :] & (segment >= 0)[:, :, None]
    allowed = causal & (same | prompt_key)
    allowed |= torch.eye(width, dtype=torch.bool)
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[:, None]
    inputs = {"input_ids": ids.to(device), "attention_mask": mask.to(device), "position_ids": positions.to(device)}
    # Completion token j of a row is predicted by the position before it: the prompt's last
    # position for j = 0, else the row's own token j - 1. Gathered into the (rows, C) layout.
    index_b = torch.zeros((len(rows), c_max), dtype=torch.long)
    index_t = torch.zeros((len(rows), c_max), dtype=torch.long)
    for i, row in enumerate(rows):
        b, at, p = where[i]
        c = len(row.completion_ids)
        if c:
            index_b[i, c_max - c:] = b
            index_t[i, c_max - c] = p - 1
            index_t[i, c_max - c + 1:] = torch.arange(at, at + c - 1)
    return scored_positions(model, inputs, index_b, index_t, rows, c_max, temperature, mask_fn, with_entropy)
