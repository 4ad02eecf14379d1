"""Bookkeeping every pipeline (``memagent``, ``memory_policy``) does the same way: the
fingerprint of a source file its prepare stage reads, and the record of each invocation in its
output folder."""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel

from memsearch.errors import InputError
from memsearch.io import dumps_line, sha256_file


def source_sha256(path: str) -> str:
    """SHA-256 of a HotpotQA source file named by the pipeline config (``data.dev`` /
    ``data.train``); an ``InputError`` when there is no such file, before any stage starts."""
    if not Path(path).is_file():
        raise InputError(f"{path}: no such HotpotQA file (data.dev / data.train of the pipeline config)")
    return sha256_file(path)


def record_invocation(out: str | Path, cfg: BaseModel) -> Path:
    """Create the output folder ``out`` if needed and append this invocation's resolved config to
    ``out/invocations.jsonl``, so what each re-run asked for stays on record. Returns ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "invocations.jsonl", "a", encoding="utf-8") as fh:
        fh.write(
            dumps_line({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "config": cfg.model_dump(mode="json")}) + "\n"
        )
    return out
