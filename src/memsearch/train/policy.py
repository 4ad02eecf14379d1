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
- ``MergedSampler``: what GRPO rollouts sample from, the base with the trained adapter merged in.
- ``release_cached_memory``: the CUDA allocator's cached blocks back to the device after rollouts
  and evaluations.
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
                seed: int = 0, keep_reference: bool = False,
                gradient_checkpointing: bool = False) -> tuple[Any, Any, str]:
    """``(peft_model, tokenizer, note)``; ``note`` says where the adapter weights came from.

    With ``adapter`` and ``keep_reference``, the adapter is loaded a second time, frozen, as
    the KL reference (``reference_policy``). With ``gradient_checkpointing`` every decoder layer
    recomputes its activations in the backward pass whenever grad mode is on, in eval mode too
    (``train.checkpointing``); rollouts and no-grad scoring are unaffected."""
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
        require_finite_adapter(policy, path)
        saved = json.loads((path / "adapter_config.json").read_text())
        note = (f"LoRA initialized from {adapter} (weights only: optimizer, schedule and step start fresh; "
                f"its r={saved.get('r')}, alpha={saved.get('lora_alpha')} apply, the config's [lora] is ignored)")
        if keep_reference:
            policy.load_adapter(str(path), adapter_name=REFERENCE_ADAPTER, is_trainable=False)
            policy.set_adapter(TRAINED_ADAPTER)  # keeps the trained adapter active and the copy frozen
            note += "; a frozen copy of it is the KL reference"
    else:
        require_target_modules(base, lora.target_modules, model)
        torch.manual_seed(seed)  # LoRA A matrices are random; B starts at 0 (the policy starts as the base)
        config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM")
        policy = get_peft_model(base, config)
        note = f"new LoRA adapter r={lora.r} alpha={lora.alpha} on {', '.join(lora.target_modules)} of {folder.name}"
    if gradient_checkpointing:
        from memsearch.train.checkpointing import enable_checkpointing

        enable_checkpointing(policy)
        note += "; gradient checkpointing of the decoder layers"
    policy.eval()  # dropout off for rollouts; the update toggles train mode itself
    return policy, tokenizer, note


def require_target_modules(base, targets: list[str], model: str) -> None:
    """``InputError`` naming ``lora.target_modules`` when one of them matches no module of
    ``base`` (PEFT's rule: the name, or a dotted name ending in it) or matches a module LoRA
    cannot wrap (``LORA_LAYER_TYPES``: e.g. ``mlp``, a whole block), before PEFT fails on it
    half-way through a start; the model's linear layers to choose from are listed."""
    from memsearch.errors import InputError

    modules = list(base.named_modules())
    supported = lora_layer_types()
    missing, unsupported = [], []
    for target in dict.fromkeys(targets):
        matched = [m for n, m in modules if n == target or n.endswith("." + target)]
        if not matched:
            missing.append(target)
        elif bad := sorted({type(m).__name__ for m in matched if not isinstance(m, supported)}):
            unsupported.append(f"{target} ({'/'.join(bad)})")
    if missing or unsupported:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in modules if isinstance(m, torch.nn.Linear)})
        problems = ([f"{', '.join(missing)} not in model {model}"] if missing else []) + (
            [f"{', '.join(unsupported)} not a layer LoRA can wrap (Linear, Embedding, Conv)"] if unsupported else [])
        raise InputError(f"lora.target_modules: {'; '.join(problems)}; expected module names of it, e.g. its "
                         f"linear layers {', '.join(linear)}")


def require_finite_adapter(policy, path: Path) -> None:
    """``InputError`` naming the adapter file and the first weight that is NaN or infinite: a
    damaged or diverged adapter would train on as NaN (every rollout failing) to a NaN result."""
    from memsearch.errors import InputError

    for name, p in trainable_named_parameters(policy):
        if not bool(torch.isfinite(p).all()):
            raise InputError(f"{path / 'adapter_model.safetensors'}: weight {name} is not finite (NaN or inf); "
                             "expected the finite weights of a trained adapter (is it damaged?)")


def lora_layer_types() -> tuple[type, ...]:
    """The module types PEFT's LoRA wraps (its default dispatch: ``peft.tuners.lora.layer``)."""
    from transformers.pytorch_utils import Conv1D

    nn = torch.nn
    return (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention, Conv1D)


def trainable_named_parameters(model) -> list[tuple[str, torch.nn.Parameter]]:
    """Trainable ``(name, parameter)`` pairs in name order (never the frozen KL reference)."""
    return [(name, p) for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0])
            if p.requires_grad and f".{REFERENCE_ADAPTER}." not in name]


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    """Trainable parameters in a fixed (name) order (never the frozen KL reference)."""
    return [p for _, p in trainable_named_parameters(model)]


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
    """Save the trained adapter only (not the KL reference copy), loadable by the hf backend,
    with the same bytes in every process (``stable_adapter_config``)."""
    model.save_pretrained(str(folder), selected_adapters=[TRAINED_ADAPTER])
    stable_adapter_config(Path(folder), model.peft_config[TRAINED_ADAPTER])


def stable_adapter_config(folder: Path, config) -> None:
    """Rewrite ``folder/adapter_config.json`` with the fields PEFT holds as sets (``target_modules``)
    sorted. PEFT writes a set in its iteration order, which string hashing changes per process,
    so two runs with byte-identical weights got different ``adapter_sha256`` records. The format is
    PEFT's own (``json.dumps(indent=2, sort_keys=True)``), so nothing else changes."""
    path = folder / "adapter_config.json"
    saved = json.loads(path.read_text(encoding="utf-8"))
    for key, value in vars(config).items():
        if isinstance(value, (set, frozenset)) and isinstance(saved.get(key), list):
            saved[key] = sorted(saved[key])
    path.write_text(json.dumps(saved, indent=2, sort_keys=True), encoding="utf-8")


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


def release_cached_memory(model) -> None:
    """Hand the CUDA caching allocator's unused blocks back to ``model``'s device (a no-op off
    CUDA). Called after rollouts and evaluations: their KV caches are freed but stay reserved
    by the allocator, in block sizes the update's activations may not fit, and a server beside
    the trainer cannot use them either."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.empty_cache()


class MergedSampler:
    """A plain copy of the base model whose LoRA-targeted weights are ``W + scale * B @ A`` of
    the live policy's trained adapter, refreshed before each step's rollouts (``refresh``).

    Rollouts sample from it instead of the PEFT model: the same function (the merged product
    equals the unmerged sum up to float round-off, checked by ``logprob_mismatch`` every step),
    without the per-layer LoRA modules, in inference mode. Decoding alone on 2 CPU cores a
    12.6-row step took 113 ms on the PEFT model and 94 ms merged (``bench/rollout_decode.py``),
    but inside one GRPO step the merged copy was no faster (docs/results/grpo_speed.md).
    Costs one more copy of the base model's weights; the policy's own weights are never touched
    (merging in place and back would drift the frozen base by round-off).
    """

    def __init__(self, policy, model: str, device, dtype) -> None:
        from memsearch.backends.hf.model import load_model

        self.model, _, _ = load_model(model, device=device, dtype=dtype)
        self.model.eval()
        self.model.requires_grad_(False)
        self._pairs = []  # (LoRA layer of the policy, the sampler's linear it is merged into)
        for name, module in policy.named_modules():
            if TRAINED_ADAPTER in (getattr(module, "lora_A", None) or {}):
                self._pairs.append((module, self.model.get_submodule(name.removeprefix("base_model.model."))))
        if not self._pairs:
            raise ValueError("the policy has no LoRA layers of its trained adapter to merge")

    def refresh(self) -> None:
        """Copy the policy's current weights in (after every optimizer step, before sampling)."""
        with torch.no_grad():
            for lora, linear in self._pairs:
                linear.weight.copy_(lora.base_layer.weight + lora.get_delta_weight(TRAINED_ADAPTER))
