"""Rollout log-probs (the hf decoder, KV cache, batched, left-padded) equal the trainer's
recomputation (one full forward pass, other padding) under the same weights, in fp32.

Tolerance: 1e-4 absolute per token (observed differences are float round-off, ~1e-6)."""

from __future__ import annotations

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
    from memsearch.backends.hf.constraint import MEMORY_OPS
    from memsearch.train.grpo import _mask_fn

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
    rows = rows_from(results)
    for row in rows:
        row.constraint_id = MEMORY_OPS.id
    pad = tokenizer.eos_token_id
    with torch.no_grad():
        masked = completion_logprobs(policy, rows, pad, mask_fn=_mask_fn(tokenizer))
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
