"""The trainable policy: a base causal LM with a LoRA adapter (PEFT), and its optimizer.

- ``load_policy``: base model (``"embedded"`` or a local folder) + a fresh LoRA adapter, or
  an existing adapter loaded *trainable* (weights only: optimizer, schedule and step start
  fresh, and the returned note says so). The base weights are frozen.
- The KL reference (``reference_policy``): started from an adapter (e.g. an SFT run) with
  ``keep_reference``, a frozen second copy of that adapter loaded under the name
  ``REFERENCE_ADAPTER``, so the KL keeps the policy near where training started, not near the
  pre-SFT base; otherwise the base model with the adapter disabled. The copy is never trainable,
  never in the optimizer, and never saved (``save_adapter`` writes the trained adapter only).
- ``make_optimizer``: AdamW over the trainable parameters in name order (the order is part of a
  checkpoint) with linear warm-up and a constant / linear / cosine decay.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from memsearch.train.config import LoraSettings, OptimSettings

TRAINED_ADAPTER = "default"  # PEFT's name for the adapter it creates or loads first
REFERENCE_ADAPTER = "reference"


def load_policy(model: str, adapter: str | None, lora: LoraSettings, device: str = "auto", dtype: str = "float32",
                seed: int = 0, keep_reference: bool = False) -> tuple[Any, Any, str]:
    """``(peft_model, tokenizer, note)``; ``note`` says where the adapter weights came from.

    With ``adapter`` and ``keep_reference``, the adapter is loaded a second time, frozen, as
    the KL reference (``reference_policy``)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from memsearch.backends.hf.model import load_model

    base, tokenizer, folder = load_model(model, device=device, dtype=dtype)
    if adapter is not None:
        path = Path(adapter)
        if not (path / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{adapter}: not a LoRA adapter folder (no adapter_config.json)")
        from memsearch.assets.adapter import verify_adapter

        verify_adapter(path, base_model=model)  # a fingerprinted (shipped) adapter must match its fingerprint
        policy = PeftModel.from_pretrained(base, str(path), is_trainable=True)
        saved = json.loads((path / "adapter_config.json").read_text())
        note = (f"LoRA initialized from {adapter} (weights only: optimizer, schedule and step start fresh; "
                f"its r={saved.get('r')}, alpha={saved.get('lora_alpha')} apply, the config's [lora] is ignored)")
        if keep_reference:
            policy.load_adapter(str(path), adapter_name=REFERENCE_ADAPTER, is_trainable=False)
            policy.set_adapter(TRAINED_ADAPTER)  # keeps the trained adapter active and the copy frozen
            note += "; a frozen copy of it is the KL reference"
    else:
        torch.manual_seed(seed)  # LoRA A matrices are random; B starts at 0 (the policy starts as the base)
        config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM")
        policy = get_peft_model(base, config)
        note = f"new LoRA adapter r={lora.r} alpha={lora.alpha} on {', '.join(lora.target_modules)} of {folder.name}"
    policy.eval()  # dropout off for rollouts; the update toggles train mode itself
    return policy, tokenizer, note


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    """Trainable parameters in a fixed (name) order (never the frozen KL reference)."""
    return [p for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0])
            if p.requires_grad and f".{REFERENCE_ADAPTER}." not in name]


@contextmanager
def reference_policy(model) -> Iterator[None]:
    """Inside, ``model`` computes the KL reference: the frozen starting adapter when one was
    kept (``load_policy(keep_reference=True)``), else the base model (adapter disabled).
    Call it under ``torch.no_grad()``; the trained adapter is active again on exit."""
    if REFERENCE_ADAPTER not in getattr(model, "peft_config", {}):
        with model.disable_adapter():
            yield
        return
    model.set_adapter(REFERENCE_ADAPTER, inference_mode=True)  # inference_mode: the copy stays frozen
    try:
        yield
    finally:
        model.set_adapter(TRAINED_ADAPTER)  # trainable again (PEFT's set_adapter freezes all others)


def save_adapter(model, folder: str | Path) -> None:
    """Save the trained adapter only (not the KL reference copy), loadable by the hf backend."""
    model.save_pretrained(str(folder), selected_adapters=[TRAINED_ADAPTER])


def lr_factor(step: int, total: int, optim: OptimSettings) -> float:
    """Multiplier of the peak learning rate for optimizer step ``step`` (0-based)."""
    if optim.warmup_steps and step < optim.warmup_steps:
        return (step + 1) / optim.warmup_steps
    if optim.schedule == "constant":
        return 1.0
    span = max(1, total - optim.warmup_steps)
    progress = min(1.0, (step - optim.warmup_steps) / span)
    if optim.schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model, optim: OptimSettings, total_steps: int):
    """AdamW + LambdaLR scheduler (stepped once per optimizer step)."""
    params = trainable_parameters(model)
    if not params:
        raise ValueError("the model has no trainable parameters (no LoRA adapter?)")
    optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total_steps, optim))
    return optimizer, scheduler
