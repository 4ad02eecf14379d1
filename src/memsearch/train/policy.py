"""The trainable policy: a base causal LM with a LoRA adapter (PEFT), and its optimizer.

- ``load_policy``: base model (``"embedded"`` or a local folder) + a fresh LoRA adapter, or
  an existing adapter loaded *trainable* (weights only: optimizer, schedule and step start
  fresh, and the returned note says so). The base weights are frozen.
- The KL reference is the base model with the adapter disabled (``model.disable_adapter()``).
- ``make_optimizer``: AdamW over the trainable parameters in name order (the order is part of a
  checkpoint) with linear warm-up and a constant / linear / cosine decay.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from memsearch.train.config import LoraSettings, OptimSettings


def load_policy(model: str, adapter: str | None, lora: LoraSettings, device: str = "auto", dtype: str = "float32",
                seed: int = 0) -> tuple[Any, Any, str]:
    """``(peft_model, tokenizer, note)``; ``note`` says where the adapter weights came from."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from memsearch.backends.hf_model import load_model

    base, tokenizer, folder = load_model(model, device=device, dtype=dtype)
    if adapter is not None:
        path = Path(adapter)
        if not (path / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{adapter}: not a LoRA adapter folder (no adapter_config.json)")
        policy = PeftModel.from_pretrained(base, str(path), is_trainable=True)
        saved = json.loads((path / "adapter_config.json").read_text())
        note = (f"LoRA initialized from {adapter} (weights only: optimizer, schedule and step start fresh; "
                f"its r={saved.get('r')}, alpha={saved.get('lora_alpha')} apply, the config's [lora] is ignored)")
    else:
        torch.manual_seed(seed)  # LoRA A matrices are random; B starts at 0 (the policy starts as the base)
        config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM")
        policy = get_peft_model(base, config)
        note = f"new LoRA adapter r={lora.r} alpha={lora.alpha} on {', '.join(lora.target_modules)} of {folder.name}"
    policy.eval()  # dropout off for rollouts; the update toggles train mode itself
    return policy, tokenizer, note


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    """Trainable parameters in a fixed (name) order."""
    return [p for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]) if p.requires_grad]


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
