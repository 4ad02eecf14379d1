"""Training fixtures: a tiny *real* Llama (random weights, the embedded tokenizer) for fast numeric
tests, a LoRA adapter with non-zero weights, and a prepared HotpotQA train sample."""

from __future__ import annotations

import pytest

from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.samples import HOTPOT_TRAIN, samples_dir


def make_tiny_model(seed: int = 0):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from memsearch.embedded import tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
                         initializer_range=0.2)  # spread-out logits, so a LoRA can move them visibly
    return LlamaForCausalLM(config).eval(), tokenizer


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer, 32-wide Llama with random weights and the embedded tokenizer, saved as a local folder."""
    model, tokenizer = make_tiny_model()
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def tiny_adapter_dir(tiny_model_dir, tmp_path_factory):
    """A LoRA adapter on the tiny model whose B matrices are non-zero (so policy != reference)."""
    import torch

    from memsearch.train.config import LoraSettings
    from memsearch.train.policy import load_policy

    policy, _, _ = load_policy(str(tiny_model_dir), None, LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
                               device="cpu", seed=1)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    out = tmp_path_factory.mktemp("adapters") / "tiny-lora"
    policy.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def hotpot_train_dir(tmp_path_factory):
    """The first 12 real HotpotQA train questions, prepared with split = train."""
    out = tmp_path_factory.mktemp("data") / "hotpot-train-12"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_TRAIN, split="train", limit=12), out)
    return out
