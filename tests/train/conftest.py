"""Training fixtures: a LoRA adapter with non-zero weights on the tiny real Llama (``tests/conftest``)
and a prepared HotpotQA train sample."""

from __future__ import annotations

import pytest

from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.samples import HOTPOT_TRAIN, samples_dir


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
