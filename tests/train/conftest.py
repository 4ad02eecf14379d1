"""Training fixtures: a LoRA adapter with non-zero weights on the tiny real Llama (``tests/conftest``)
and a prepared HotpotQA train sample."""

from __future__ import annotations

import pytest

from memsearch.assets.samples import HOTPOT_TRAIN, samples_dir
from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot


def lora_policy(model_dir, seed: int, dropout: float = 0.0, targets=("q_proj", "v_proj")):
    """``(policy, tokenizer)``: a fresh LoRA on ``model_dir`` whose B matrices are set to seeded
    non-zero values, so the policy differs from the base (a fresh LoRA starts equal to it)."""
    import torch

    from memsearch.train.config import LoraSettings
    from memsearch.train.policy import load_policy

    policy, tokenizer, _ = load_policy(str(model_dir), None, LoraSettings(r=4, alpha=8, dropout=dropout,
                                                                          target_modules=list(targets)),
                                       device="cpu", seed=1)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return policy, tokenizer


@pytest.fixture(scope="session")
def nonzero_lora():
    """``lora_policy`` for tests (conftest functions are reached through fixtures here)."""
    return lora_policy


@pytest.fixture(scope="session")
def tiny_adapter_dir(tiny_model_dir, tmp_path_factory):
    """A LoRA adapter on the tiny model whose B matrices are non-zero (so policy != reference)."""
    policy, _ = lora_policy(tiny_model_dir, seed=2)
    out = tmp_path_factory.mktemp("adapters") / "tiny-lora"
    policy.save_pretrained(str(out))
    return out


def _short_sft_config(model, rows, **extra):
    import json

    from memsearch.config import load_config
    from memsearch.train.config import SFTConfig

    fields = {"model": str(model), "data": [str(rows)], "epochs": 1.0, "micro_batch_rows": 2,
              "grad_accumulation": 1, "checkpoint_every": 2, "keep_checkpoints": 2, "lora.r": 4,
              "optim.lr": 1e-2, "optim.warmup_steps": 0, **extra}
    return load_config(None, [f"{k}={json.dumps(v)}" for k, v in fields.items()], model=SFTConfig)


@pytest.fixture(scope="session")
def short_sft_config():
    """``config(model, rows, **fields)``: an SFTConfig of 6 one-row-pair steps over the short rows,
    checkpoints every 2 steps (two kept); ``fields`` are dotted config keys."""
    return _short_sft_config


@pytest.fixture(scope="session")
def hotpot_train_dir(tmp_path_factory):
    """The first 12 real HotpotQA train questions, prepared with split = train."""
    out = tmp_path_factory.mktemp("data") / "hotpot-train-12"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_TRAIN, split="train", limit=12), out)
    return out


def _run_torchrun(*args: str, n: int = 2, timeout: float = 300):
    """``python -m torch.distributed.run --nproc_per_node n ... ARGS`` on a free loopback port, one
    thread per rank (two ranks share this machine's cores); the completed process is returned."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "--master_addr=127.0.0.1",
           f"--master_port={port}", *[str(a) for a in args]]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )


@pytest.fixture(scope="session")
def torchrun():
    """``torchrun(*args, n=2, timeout=300)``: launch a script (or ``-m module ...``) on n gloo ranks."""
    return _run_torchrun
