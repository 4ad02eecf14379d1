"""Rows that share a prompt, scored with the prompt once (``train.grpo.shared_prompt``): log-probs,
entropies and the gradient of the GRPO loss equal the row-by-row computation (to 1e-5) on the
tiny real Llama with a non-zero LoRA, in schema mode too, and the micro-batches keep prompt
groups whole."""

from __future__ import annotations

from dataclasses import replace

import torch

from memsearch.train.grpo.loss import policy_loss
from memsearch.train.grpo.shared_prompt import (
    packed_length,
    prompt_groups,
    shared_completion_logprobs,
    shared_micro_batches,
)
from memsearch.train.logprobs import completion_logprobs
from memsearch.train.rows import Row


def make_rows(vocab: int) -> list[Row]:
    """Three prompts: one shared by 3 rows, one by 2 (of unequal completions), one alone."""
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (9, 5, 7)]
    shapes = [(0, 4), (1, 6), (0, 2), (2, 5), (0, 7), (1, 1)]
    rows = []
    for k, (p, c) in enumerate(shapes):
        ids = torch.randint(0, vocab, (c,), generator=gen).tolist()
        rows.append(Row(prompts[p], ids, [0.0] * c, [1] * c, k, p, "memory", 0, advantage=0.3 * (k - 2)))
    return rows


def test_prompt_groups_and_micro_batches_keep_groups_whole():
    rows = make_rows(50)
    assert prompt_groups(rows) == [[0, 2, 4], [1, 5], [3]]
    assert packed_length(rows, [0, 2, 4]) == 9 + 4 + 2 + 7
    batches = shared_micro_batches(rows, max_tokens=24)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for b in batches:  # a prompt group is never split across micro-batches
        assert all(set(g) <= set(b) or not set(g) & set(b) for g in prompt_groups(rows))


def loss_and_grads(policy, rows, score, pad_id):
    policy.zero_grad(set_to_none=True)
    scored = score(policy, rows, pad_id, 1.0, None, with_entropy=True)
    adv = torch.tensor([r.advantage for r in rows])
    loss, _ = policy_loss(scored.logprobs, scored.logprobs.detach() - 0.05, adv, scored.mask,
                          torch.ones(len(rows)), 0.2, 0.2)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}
    return scored, grads


def test_shared_scoring_equals_row_by_row_to_1e5(tiny_model_dir, nonzero_lora):
    policy, tokenizer = nonzero_lora(tiny_model_dir, seed=4)
    policy.eval()
    rows = make_rows(len(tokenizer))
    pad = tokenizer.eos_token_id
    alone, g_alone = loss_and_grads(policy, rows, completion_logprobs, pad)
    shared, g_shared = loss_and_grads(policy, rows, shared_completion_logprobs, pad)
    assert torch.equal(alone.mask, shared.mask)
    assert torch.allclose(alone.logprobs, shared.logprobs, atol=1e-5)
    assert torch.allclose(alone.entropy, shared.entropy, atol=1e-5)
    assert g_alone.keys() == g_shared.keys() and g_alone
    for name in g_alone:
        assert torch.allclose(g_alone[name], g_shared[name], atol=1e-5, rtol=1e-4), name
    assert any(float(g.abs().max()) > 1e-4 for g in g_alone.values())  # the comparison is not of zeros


def test_shared_scoring_replays_schema_masks(tiny_model_dir, nonzero_lora):
    """A row with a constraint id gets its replayed mask in either path (positions line up)."""
    policy, tokenizer = nonzero_lora(tiny_model_dir, seed=5)
    rows = make_rows(len(tokenizer))
    vocab = len(tokenizer)

    def masks(row):  # allow the row's own tokens and 3 others at every position
        m = torch.zeros((len(row.completion_ids), vocab), dtype=torch.bool)
        for j, t in enumerate(row.completion_ids):
            m[j, [t, 1, 2, 3]] = True
        return m

    rows = [replace(r, constraint_id="test") if k % 2 == 0 else r for k, r in enumerate(rows)]
    with torch.no_grad():
        alone = completion_logprobs(policy, rows, tokenizer.eos_token_id, 1.0, masks)
        shared = shared_completion_logprobs(policy, rows, tokenizer.eos_token_id, 1.0, masks)
    assert torch.allclose(alone.logprobs, shared.logprobs, atol=1e-5)
    assert float(alone.logprobs[0].sum()) > float(completion_logprobs(policy, rows[:1], 0).logprobs.sum())


def test_rows_without_completion_score_nothing(tiny_model_dir, nonzero_lora):
    policy, _ = nonzero_lora(tiny_model_dir, seed=4)
    rows = [Row([5, 6], [], [], [], 0, 0, "memory", 0)] * 2
    assert shared_completion_logprobs(policy, rows, 0).logprobs.shape == (2, 0)
