"""Shared fixtures: small real prepared data folders built from the shipped samples, and a tiny
*real* Llama (random weights, the embedded tokenizer) for fast training and pipeline tests."""

from __future__ import annotations

import pytest

from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.samples import HOTPOT_DEV, samples_dir


@pytest.fixture(scope="session")
def hotpot_dev_dir(tmp_path_factory):
    """The first 40 real dev questions, prepared (a real data folder, shared by the session)."""
    out = tmp_path_factory.mktemp("data") / "hotpot-dev-40"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_DEV, split="dev", limit=40), out)
    return out


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
def rewrite_data_file():
    """``rewrite(folder, name, records)``: replace one data file of a prepared folder and record
    its new SHA-256 in the manifest, as a re-run of `prepare-*` would (a folder edited without
    that is refused at load)."""
    return _rewrite_data_file


def _rewrite_data_file(folder, name: str, records) -> None:
    import json

    from memsearch.io import sha256_file, write_json, write_jsonl

    write_jsonl(folder / name, records)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    manifest["files"][name] = sha256_file(folder / name)
    write_json(folder / "manifest.json", manifest)
