"""``memsearch merge-adapter``: a LoRA adapter merged into its base, saved as a plain Hugging Face
checkpoint (safetensors + config + tokenizer) that the ``hf`` backend, ``transformers serve`` and
vLLM load without PEFT. Stage 2 serves the frozen stage-1 memory policy this way.
"""

from __future__ import annotations

from pathlib import Path

from memsearch.errors import InputError
from memsearch.io import atomic_output_dir, write_json


def merge_adapter(model: str, adapter: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    """Merge ``adapter`` into ``model`` (``"embedded"`` or a local folder) and save to ``out``."""
    from memsearch.backends.hf.model import load_model

    adapter, out = Path(adapter), Path(out)
    if not (adapter / "adapter_config.json").is_file():
        raise InputError(f"{adapter}: not a LoRA adapter folder (no adapter_config.json)")
    if out.exists():
        raise InputError(f"{out}: output folder already exists; choose a new folder")
    merged, tokenizer, base = load_model(model, adapter=adapter, device="cpu", dtype=dtype, merge_adapter=True)
    with atomic_output_dir(out) as tmp:
        merged.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        write_json(tmp / "memsearch_merge.json", {"base": str(model), "adapter": str(adapter), "dtype": dtype})
    return out
