"""The ``hf`` backend on the transformers it runs with: in the suite, the locked version; in CI,
again under the floor that pyproject.toml declares (``.ci/run`` overlays ``transformers==FLOOR``
on the locked environment and sets ``MEMSEARCH_EXPECT_TRANSFORMERS``).

What the floor must have, each used here for real: ``from_pretrained(dtype=)`` (``load_model``),
``DynamicCache(config=)`` and ``cache_utils.DynamicLayer`` (``BatchDecoder``'s in-place KV cache,
which rows joining a running batch are stacked into), and the GGUF tokenizer conversion of the
embedded model. The model is a random-init 2-layer Llama; the reference for every decoded token is
one full forward pass without cache or padding.
"""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from memsearch.backends.base import GenerationRequest, SamplingParams

# Prompts of different lengths (left padding), and budgets that end the first row early so the
# third request joins the running batch (max_batch_size=2).
PROMPTS = ([5, 17, 301, 44, 9, 12, 800], [31, 2, 77], [400, 401, 402, 403, 404])
MAX_TOKENS = (3, 9, 6)


def test_the_transformers_under_test_is_the_expected_one():
    import transformers

    expected = os.environ.get("MEMSEARCH_EXPECT_TRANSFORMERS")
    if expected is None:
        pytest.skip("MEMSEARCH_EXPECT_TRANSFORMERS unset: the locked transformers (CI sets it for the floor)")
    assert transformers.__version__ == expected


@pytest.mark.slow
def test_batched_cached_decoding_matches_full_forward_passes(tmp_path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from memsearch.assets.embedded import tokenizer_dir
    from memsearch.backends.hf.backend import HFBackend

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=True, initializer_range=0.2)
    LlamaForCausalLM(config).save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))

    backend = HFBackend(str(tmp_path), device="cpu", dtype="float32", max_batch_size=2, ignore_eos=True)
    try:
        assert backend.model.dtype == torch.float32
        assert backend.decoder._mergeable  # plain DynamicLayer caches: the in-place (slab) layers are used
        requests = [GenerationRequest(role="policy", prompt_ids=tuple(p), sampling=SamplingParams(max_tokens=n))
                    for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)]
        results = backend.generate_sync(requests)
        # One batch: the third request joined the running batch when the first row finished.
        assert backend.stats()["batches"] == 1, (backend.stats(), [r.error for r in results])
        for prompt, n, result in zip(PROMPTS, MAX_TOKENS, results, strict=True):
            assert result.ok, result.error
            ids = list(prompt) + list(result.completion_ids)
            assert len(result.completion_ids) == n
            with torch.inference_mode():
                logits = backend.model(input_ids=torch.tensor([ids])).logits[0, len(prompt) - 1 : -1].float()
            assert list(result.completion_ids) == logits.argmax(-1).tolist()  # greedy, token by token
            want = torch.log_softmax(logits, -1).gather(1, torch.tensor(result.completion_ids)[:, None])[:, 0]
            assert result.logprobs == pytest.approx(want.tolist(), abs=1e-4)
    finally:
        asyncio.run(backend.aclose())
