"""``memsearch merge-adapter``: a LoRA adapter merged into its base, saved as a plain Hugging Face
checkpoint (safetensors + config + tokenizer) that the ``hf`` backend, ``transformers serve`` and
vLLM load without PEFT. Stage 2 serves the frozen stage-1 memory policy this way.

The folder's ``memsearch_merge.json`` records the base (``base``: what A/C's baseline memory is
traced back to, ``config.run._merged_base``), the adapter by content (``adapter_sha256``) and the
dtype: not where the adapter lay nor its folder's name, so the same weights merged from another
folder give the same bytes (the merged folder's hash is part of later stages' fingerprints).
A folder merged before recorded the adapter's path as given (``adapter``); nothing reads it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from memsearch.errors import InputError
from memsearch.io import atomic_output_dir, sha256_file, write_json

MERGE_RECORD = "memsearch_merge.json"


def adapter_sha256(folder: Path) -> str:
    """One SHA-256 over every file of the adapter ``folder`` (relative names and contents,
    sorted): what ``pipelines.stage_record.folder_sha256`` gives for an adapter folder (it holds no stage
    record), computed here because training sits below the pipelines (docs/design.md §11)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + sha256_file(path).encode() + b"\0")
    return digest.hexdigest()


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
        write_json(tmp / MERGE_RECORD, {"base": str(model), "adapter_sha256": adapter_sha256(adapter), "dtype": dtype})
    return out
