"""Loading a local ``transformers`` causal LM for the ``hf`` backend.

- ``load_gguf_model``: a GGUF file dequantized into a plain float model (used once, to build the
  cached folder of the embedded model, see ``memsearch.embedded.model_dir``).
- ``load_model``: ``"embedded"`` or a local Hugging Face folder, on a device and dtype, with an
  optional PEFT LoRA adapter; returns the model (eval mode) and its tokenizer.

Nothing here reaches for a hub: paths must be local folders and ``HF_HUB_OFFLINE`` is set.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def load_gguf_model(path: str | Path, dtype: torch.dtype = torch.float32):
    """A GGUF checkpoint as a plain (dequantized) ``transformers`` model that ``save_pretrained`` accepts.

    With ``accelerate`` installed this goes through ``from_pretrained(gguf_file=...)``; then the
    model carries a GGUF quantizer marker although its weights are already dequantized, so the
    marker is cleared (or ``save_pretrained`` refuses). Without ``accelerate`` (which
    ``from_pretrained`` insists on for GGUF) the config is read from the GGUF file, the model is
    built from it and the dequantized tensors are loaded with transformers' own GGUF reader. Both
    routes give identical weights.
    """
    _offline()
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import is_accelerate_available

    path = Path(path)
    if is_accelerate_available():
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
        packed = [n for n, m in model.named_modules() if type(m).__name__.lower().startswith("gguf")]
        if packed:  # weights kept in GGUF blocks (the ``kernels`` package): not a plain model
            raise RuntimeError(f"GGUF weights were kept packed in {packed[:3]}...; cannot save a plain copy")
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    else:
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model, torch_dtype=dtype)[
            "tensors"
        ]
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
        if set(missing) - tied or unexpected:
            raise RuntimeError(f"GGUF tensors do not match the model: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
    model.config.dtype = dtype
    return model.eval()


def resolve_model_path(model: str | Path) -> Path:
    """``"embedded"`` (the cached conversion of the shipped GGUF) or a local model folder."""
    if str(model) == "embedded":
        from memsearch.embedded import model_dir

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
        raise ValueError(f"unknown dtype {dtype!r}")
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
