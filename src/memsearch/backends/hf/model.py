"""Loading a local ``transformers`` causal LM for the ``hf`` backend.

- ``load_model``: ``"embedded"`` or a local Hugging Face folder, on a device and dtype, with an
  optional PEFT LoRA adapter; returns the model (eval mode) and its tokenizer.

Nothing here reaches for a hub: paths must be local folders and ``HF_HUB_OFFLINE`` is set.
Reading the shipped GGUF file is ``memsearch.assets.embedded``'s job (it sits below the backends,
docs/design.md §11, since the tokenizer needs it too); this module only loads folders.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from memsearch.errors import InputValueError


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def resolve_model_path(model: str | Path) -> Path:
    """``"embedded"`` (the cached conversion of the shipped GGUF) or a local model folder."""
    if str(model) == "embedded":
        from memsearch.assets.embedded import model_dir

        return model_dir()
    path = Path(model)
    if not path.is_dir():
        raise FileNotFoundError(f"{model}: expected 'embedded' or a local Hugging Face model folder")
    return path


def pick_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``"auto"``/``None``: float32 on CPU, bfloat16 on a GPU that supports it (else float16)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if not hasattr(torch, str(dtype)) or not isinstance(getattr(torch, str(dtype)), torch.dtype):
        raise InputValueError(f"unknown dtype {dtype!r}: expected a torch dtype name, e.g. float32, bfloat16, float16")
    return getattr(torch, str(dtype))


def load_model(
    model: str | Path = "embedded",
    adapter: str | Path | None = None,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype | None = "auto",
    merge_adapter: bool = True,
) -> tuple[Any, Any, Path]:
    """Load ``(model, tokenizer, folder)``; the model is in eval mode on ``device``.

    ``adapter``: a local PEFT LoRA adapter folder. ``peft`` is imported only then. With
    ``merge_adapter`` the LoRA weights are merged into the base weights (faster decoding).
    """
    _offline()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if adapter is not None and Path(adapter).is_dir():
        from memsearch.assets.adapter import verify_adapter

        # Before the base loads: a fingerprinted (shipped) adapter whose files changed is refused at once.
        verify_adapter(adapter, base_model=str(model))
    folder = resolve_model_path(model)
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    lm = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dt)
    if adapter is not None:
        adapter_path = Path(adapter)
        if not adapter_path.is_dir():
            raise FileNotFoundError(f"{adapter}: no such adapter folder (expected a PEFT LoRA adapter folder)")
        try:
            from peft import PeftModel
        except ImportError as exc:
            raise ImportError("loading a LoRA adapter needs the `peft` package (pip install peft)") from exc
        lm = PeftModel.from_pretrained(lm, str(adapter_path))
        if merge_adapter:
            lm = lm.merge_and_unload()
    lm = lm.to(dev).eval()
    lm.requires_grad_(False)
    return lm, tokenizer, folder


# Causal LMs whose forward computes logits as a plain ``lm_head(hidden)``.
PLAIN_HEAD_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3"})


def plain_head(model) -> tuple[Any, torch.nn.Linear] | None:
    """``(decoder, lm_head)`` of a causal LM whose logits are exactly ``lm_head(decoder(x))`` (no
    bias, scaling or soft-capping), so a caller may run the head only where it needs logits; None
    otherwise. ``model`` is the transformers model itself (unwrap a PEFT model first: its LoRA
    layers live inside the decoder's modules, so calling the decoder keeps the active adapter)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    body = getattr(model, "model", None)
    if (getattr(model.config, "model_type", None) in PLAIN_HEAD_MODELS and type(model).__name__.endswith("ForCausalLM")
            and isinstance(head, torch.nn.Linear) and head.bias is None and body is not None):
        return body, head
    return None
