"""Rollout log-probs (the hf decoder, KV cache, batched, left-padded) equal the trainer's
recomputation (one full forward pass, other padding) under the same weights, in fp32.

Tolerance: 1e-4 absolute per token (observed differences are float round-off, ~1e-6)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memsearch.backends.base import GenerationRequest, SamplingParams
from memsearch.train.config import LoraSettings
from memsearch.train.logprobs import completion_logprobs, micro_batches
from memsearch.train.policy import load_policy
from memsearch.train.rows import Row

TOL = 1e-4
PROMPTS = ["Question: who wrote Hamlet?", "Memory: (empty)\nNew evidence: [d1:0] Paris is the capital of France. " * 3,
           "Reply with one JSON object.", "x"]


def rows_from(results):
    return [
        Row(
            list(r.prompt_ids), list(r.completion_ids), list(r.logprobs), [1] * len(r.completion_ids), i, i, "memory", 0
        )
        for i, r in enumerate(results)
    ]


def rollout_and_recompute(model_spec, adapter, temperature):
    from memsearch.backends.hf.backend import HFBackend

    policy, tokenizer, _ = load_policy(model_spec, adapter, LoraSettings(), device="cpu")
    backend = HFBackend(model=model_spec, loaded=(policy, tokenizer), max_batch_size=4)
    requests = [
        GenerationRequest(
            role="memory",
            messages=({"role": "user", "content": p},),
            sampling=SamplingParams(temperature=temperature, max_tokens=24, seed=10 + i),
        )
        for i, p in enumerate(PROMPTS)
    ]
    results = backend.generate_sync(requests)
    assert all(r.ok and r.completion_ids for r in results)
    rows = rows_from(results)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    import torch

    worst = 0.0
    with torch.no_grad():
        for idx in micro_batches(rows, 10_000):  # all rows in one padded batch: different padding than the decoder
            sub = [rows[i] for i in idx]
            scored = completion_logprobs(policy, sub, pad, temperature=temperature)
            c_max = scored.logprobs.shape[1]
            for k, row in enumerate(sub):
                got = scored.logprobs[k, c_max - len(row.completion_ids) :]
                worst = max(worst, float((got - torch.tensor(row.rollout_logprobs)).abs().max()))
    return worst, policy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_equal_recomputed_tiny_lora(tiny_model_dir, tiny_adapter_dir, temperature):
    worst, policy = rollout_and_recompute(str(tiny_model_dir), str(tiny_adapter_dir), temperature)
    assert worst < TOL
    # the adapter is live (non-zero B): the check is on the policy, not on the bare base model
    assert any(float(p.abs().sum()) > 0 for n, p in policy.named_parameters() if "lora_B" in n)


@pytest.mark.slow
def test_rollout_logprobs_equal_recomputed_embedded_model():
    worst, _ = rollout_and_recompute("embedded", None, 1.0)
    assert worst < TOL


def test_micro_batches_pack_by_padded_tokens():
    rows = [Row([0] * n, [1] * 2, [0.0] * 2, [1, 1], i, i, "memory", 0) for i, n in enumerate([8, 2, 30, 5])]
    batches = micro_batches(rows, 24)
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3]  # every row exactly once
    for b in batches:
        longest = max(len(rows[i].prompt_ids) + 2 for i in b)
        assert len(b) == 1 or longest * len(b) <= 24


@pytest.mark.slow
def test_schema_mode_rollout_logprobs_equal_recomputed_with_replayed_mask(tiny_model_dir, tiny_adapter_dir):
    """Schema mode: the decoder samples from the distribution renormalized on the tokens the ops
    schema allows; the trainer replays the mask from (constraint id, completion ids) and gets
    the same log-probs. Without the mask the recomputation would differ."""
    import torch

    from memsearch.backends.hf.backend import HFBackend
    from memsearch.memory.action_format import MEMORY_OPS
    from memsearch.train.grpo.trainer import schema_mask_fn

    policy, tokenizer, _ = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), LoraSettings(), device="cpu")
    backend = HFBackend(model="tiny", loaded=(policy, tokenizer), max_batch_size=4)
    requests = [
        GenerationRequest(
            role="memory",
            messages=({"role": "user", "content": p},),
            constraint=MEMORY_OPS,
            sampling=SamplingParams(temperature=1.0, max_tokens=24, seed=3 + i),
        )
        for i, p in enumerate(PROMPTS[:3])
    ]
    results = backend.generate_sync(requests)
    assert all(r.ok and r.constraint_id == MEMORY_OPS.id for r in results)
    rows = [replace(row, constraint_id=MEMORY_OPS.id) for row in rows_from(results)]
    pad = tokenizer.eos_token_id
    with torch.no_grad():
        masked = completion_logprobs(policy, rows, pad, mask_fn=schema_mask_fn(tokenizer))
        plain = completion_logprobs(policy, rows, pad)
    c_max = masked.logprobs.shape[1]
    worst_masked = worst_plain = 0.0
    for k, row in enumerate(rows):
        ref = torch.tensor(row.rollout_logprobs)
        c = len(row.completion_ids)
        worst_masked = max(worst_masked, float((masked.logprobs[k, c_max - c :] - ref).abs().max()))
        worst_plain = max(worst_plain, float((plain.logprobs[k, c_max - c :] - ref).abs().max()))
    assert worst_masked < TOL
    assert worst_plain > 0.1  # the mask matters: a random model puts most mass outside the schema


def _reference_logprobs(policy, row, mask_fn, temperature: float):
    """One row's completion log-probs the plain way: one unpadded forward pass, every logit of
    every completion position, the replayed schema mask, log-softmax; 0 where out of the loss."""
    import torch

    ids = torch.tensor([row.prompt_ids + row.completion_ids])
    logits = policy(input_ids=ids).logits[0, len(row.prompt_ids) - 1 : -1].float() / temperature
    allowed = mask_fn(row)
    logits = logits.masked_fill(~allowed[:, : logits.shape[-1]], float("-inf"))
    lp = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(row.completion_ids)[:, None])[:, 0]
    return lp * torch.tensor(row.loss_mask, dtype=lp.dtype)


@pytest.mark.slow
def test_head_only_where_needed_equals_every_logit_with_gradients(tiny_model_dir, tiny_adapter_dir):
    """``scored_positions`` runs the LM head only at free tokens in the loss; forced tokens (one
    token allowed) and tokens out of the loss read 0. Values and LoRA gradients equal the plain
    computation over every logit, row by row and packed (shared prompts), and through the
    fallback for models without a plain head."""
    import torch

    from memsearch.backends.hf.backend import HFBackend
    from memsearch.memory.action_format import MEMORY_OPS
    from memsearch.train import logprobs
    from memsearch.train.grpo.shared_prompt import shared_completion_logprobs
    from memsearch.train.grpo.trainer import schema_mask_fn
    from memsearch.train.policy import trainable_parameters

    policy, tokenizer, _ = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), LoraSettings(), device="cpu")
    backend = HFBackend(model="tiny", loaded=(policy, tokenizer), max_batch_size=4)
    requests = [GenerationRequest(role="memory", messages=({"role": "user", "content": PROMPTS[i % 2]},),
                                  constraint=MEMORY_OPS,
                                  sampling=SamplingParams(temperature=0.8, max_tokens=24, seed=i))
                for i in range(4)]  # two prompts, two completions each: packed groups of two
    rows = [replace(row, constraint_id=MEMORY_OPS.id) for row in rows_from(backend.generate_sync(requests))]
    mask_fn = schema_mask_fn(tokenizer)
    rows[1].loss_mask[2] = 0  # a token out of the loss (decisions.DecisionRule)
    forced = sum(int((mask_fn(r).sum(-1) == 1).sum()) for r in rows)
    assert forced > 0  # the schema forces tokens here: the skipped path is exercised
    params = trainable_parameters(policy)

    def grads(loss):
        policy.zero_grad()
        loss.backward()
        return [p.grad.clone() for p in params]

    want = [_reference_logprobs(policy, r, mask_fn, 0.8) for r in rows]
    want_grads = grads(sum(lp.sum() for lp in want))
    plain_head = logprobs._head
    for scorer, head in ((logprobs.completion_logprobs, plain_head), (shared_completion_logprobs, plain_head),
                         (logprobs.completion_logprobs, lambda model: None)):
        logprobs._head = head
        try:
            scored = scorer(policy, rows, tokenizer.eos_token_id, 0.8, mask_fn)
        finally:
            logprobs._head = plain_head
        c_max = scored.logprobs.shape[1]
        for k, row in enumerate(rows):
            got = scored.logprobs[k, c_max - len(row.completion_ids):]
            assert torch.allclose(got, want[k], atol=1e-5)
        for g, w in zip(grads(scored.logprobs.sum()), want_grads, strict=True):
            # gradients reach ~40 here: a sum of products in another order differs in the 6th digit
            assert torch.allclose(g, w, rtol=1e-4, atol=1e-5)
    assert any(float(w.abs().max()) > 0 for w in want_grads)


def test_entropy_is_that_of_the_masked_distribution(tiny_model_dir, tiny_adapter_dir):
    """The logged token entropy (free tokens in the loss) is -sum p log p of the distribution
    sampled from: schema-masked tokens (p = 0, log p = -inf) add 0, not NaN."""
    import torch

    from memsearch.backends.hf.backend import HFBackend
    from memsearch.memory.action_format import MEMORY_OPS
    from memsearch.train.grpo.trainer import schema_mask_fn

    policy, tokenizer, _ = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), LoraSettings(), device="cpu")
    backend = HFBackend(model="tiny", loaded=(policy, tokenizer), max_batch_size=4)
    requests = [GenerationRequest(role="memory", messages=({"role": "user", "content": PROMPTS[i]},),
                                  constraint=MEMORY_OPS,
                                  sampling=SamplingParams(temperature=1.0, max_tokens=24, seed=i))
                for i in range(2)]
    rows = [replace(row, constraint_id=MEMORY_OPS.id) for row in rows_from(backend.generate_sync(requests))]
    mask_fn = schema_mask_fn(tokenizer)
    with torch.no_grad():
        scored = completion_logprobs(policy, rows, tokenizer.eos_token_id, 1.0, mask_fn, with_entropy=True)
        c_max = scored.entropy.shape[1]
        checked = 0
        for k, row in enumerate(rows):
            ids = torch.tensor([row.prompt_ids + row.completion_ids])
            logits = policy(input_ids=ids).logits[0, len(row.prompt_ids) - 1: -1].float()
            allowed = mask_fn(row)[:, : logits.shape[-1]]
            p = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
            want = torch.special.entr(p).sum(-1)
            free = allowed.sum(-1) > 1  # forced tokens read 0 (no head is run there)
            got = scored.entropy[k, c_max - len(row.completion_ids):]
            assert torch.isfinite(got).all()
            assert torch.allclose(got[free], want[free], atol=1e-5)
            assert (got[~free] == 0).all()
            checked += int(free.sum())
    assert checked > 0 and float(want[free].max()) > 0.1
    # Computed in chunks of positions (memory: train.memory_plan's logits): the same numbers at any
    # chunk size, down to one position at a time, up to the summation order of the vocabulary sums.
    import memsearch.train.logprobs as logprobs

    before = logprobs.ENTROPY_CHUNK
    try:
        logprobs.ENTROPY_CHUNK = 1
        with torch.no_grad():
            one = completion_logprobs(policy, rows, tokenizer.eos_token_id, 1.0, mask_fn, with_entropy=True)
    finally:
        logprobs.ENTROPY_CHUNK = before
    assert torch.equal(one.logprobs, scored.logprobs)
    assert torch.allclose(one.entropy, scored.entropy, rtol=1e-6, atol=1e-6), (one.entropy - scored.entropy).abs().max()
