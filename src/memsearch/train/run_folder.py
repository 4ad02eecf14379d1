"""The run folder of a trainer: created new (never overwritten) or resumed with the same config,
and the final adapter + summary written by the main rank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memsearch.errors import InputError
from memsearch.io import write_json
from memsearch.train.distributed import Dist
from memsearch.train.policy import save_adapter


def prepare_run_folder(cfg, out: Path, resume: bool, dist: Dist) -> None:
    """New folder with ``config.json``; or, with ``resume``, check the saved config is identical."""
    resolved = cfg.model_dump(mode="json")
    if dist.main:
        if out.exists() and not resume:
            raise InputError(
                f"{out}: output folder already exists; pass --resume to continue that run, or choose a new folder"
            )
        if resume:
            saved = out / "config.json"
            if not saved.is_file():
                raise InputError(f"{out}: nothing to resume (no config.json)")
            if json.loads(saved.read_text()) != resolved:
                raise InputError(
                    f"{out}: config differs from the run being resumed ({saved}); resume with the same config"
                )
        else:
            out.mkdir(parents=True)
            write_json(out / "config.json", resolved)
    dist.barrier()


def finish_run(policy, out: Path, summary: dict[str, Any], dist: Dist) -> dict[str, Any]:
    """Save the final adapter to ``out/adapter`` and ``summary.json`` (main rank)."""
    if dist.main:
        save_adapter(policy, out / "adapter")
        summary["adapter"] = str(out / "adapter")
        write_json(out / "summary.json", summary)
    return summary
