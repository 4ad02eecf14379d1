"""Bookkeeping every pipeline (``memagent``, ``memory_policy``) does the same way: the
fingerprint of a source file its prepare stage reads, and the record of each invocation in its
output folder, which must be a folder that pipeline made (or a new one it creates)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import BaseModel

from memsearch.config import config_json
from memsearch.errors import InputError
from memsearch.eval.run_folder import claim_folder, hold_folder_lock
from memsearch.io import dumps_line, iter_jsonl, sha256_file
from memsearch.pipelines.stage_record import check_stage_records


def source_sha256(path: str) -> str:
    """SHA-256 of a source file named by the pipeline config (``data.dev`` /
    ``data.train``); an ``InputError`` when there is no such file, before any stage starts."""
    if not Path(path).is_file():
        raise InputError(f"{path}: no such source file (data.dev / data.train of the pipeline config)")
    return sha256_file(path)


def record_invocation(out: str | Path, cfg: BaseModel) -> Path:
    """Append this invocation's resolved config to ``out/invocations.jsonl``, so what each re-run
    asked for stays on record, and return ``out``. A new ``out`` is created, marked as made by
    `memsearch pipeline <cfg.pipeline>`; an existing one must be that pipeline's folder (its
    marker, or ``_earlier_pipeline_folder``), else ``InputError`` and nothing is written. The
    folder is then locked for the rest of the process (``eval.run_folder.hold_folder_lock``): a
    second process on it is refused, naming the holder's pid; a damaged stage record in it is
    refused by name (``pipelines.stage_record.check_stage_records``)."""
    out = Path(out)
    # A pipeline config names its pipeline; any other config (a caller's own) goes by its class.
    name = getattr(cfg, "pipeline", None) or type(cfg).__name__
    claim_folder(out, f"pipeline {name}", lambda folder: _earlier_pipeline_folder(folder, name))
    # One writer per pipeline folder, as per eval run folder: a second process on the same --out
    # would train the same stages at once (interleaved logs, a report over mixed outputs).
    hold_folder_lock(out, "pipeline folder", "then run the pipeline again")
    check_stage_records(out)  # a damaged record is named before this invocation writes anything
    with open(out / "invocations.jsonl", "a", encoding="utf-8") as fh:
        fh.write(
            dumps_line({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "config": config_json(cfg)}) + "\n"
        )
    return out


def _earlier_pipeline_folder(out: Path, name: str) -> bool:
    """A folder of pipeline ``name`` that has no marker: its ``invocations.jsonl`` records only
    that pipeline (an earlier version made it), or, with no invocation yet, it holds stage records
    (a control's folder of stages copied from the recipe's run, docs/memory_policy.md "Controls";
    each stage still refuses outputs made from other inputs)."""
    records = []
    if (out / "invocations.jsonl").is_file():
        try:
            records = [rec for _, rec in iter_jsonl(out / "invocations.jsonl")]
        except InputError:  # not JSON lines: not an invocation record
            return False
    if records:
        return all(isinstance(r, dict) and isinstance(r.get("config"), dict) and r["config"].get("pipeline") == name
                   for r in records)
    return any(_is_stage_record(p) for pattern in ("*.stage.json", "*/*.stage.json", "*/stage.json")
               for p in out.glob(pattern))


def _is_stage_record(path: Path) -> bool:
    """Whether ``path`` holds a record that ``pipelines.stage_record.Stage`` wrote."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and {"stage", "fingerprint", "inputs"} <= set(record)
