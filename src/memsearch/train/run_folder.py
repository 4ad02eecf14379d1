"""The run folder of a trainer: created new (never overwritten) or resumed with the same config,
and the final adapter + summary written by the main rank.

``check_run_folder`` runs first and ``prepare_run_folder`` only once everything that can be
refused (config, model, LoRA target modules, data) has been: a folder left by a refused start
would block the corrected command ("already exists").
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from memsearch.config import config_json
from memsearch.errors import InputError
from memsearch.io import write_json
from memsearch.train.distributed import Dist
from memsearch.train.policy import save_adapter


def check_run_folder(cfg, out: Path, resume: bool, dist: Dist) -> None:
    """Refuse (main rank) what ``prepare_run_folder`` would refuse, creating nothing. A resume
    must have the same config up to ``train.config.PLACEMENT_FIELDS`` (the GPUs it runs on,
    activation checkpointing), which change no number of the run."""
    from memsearch.train.config import without_placement

    resolved = without_placement(config_json(cfg))
    if dist.main:
        if out.exists() and not resume:
            raise InputError(
                f"{out}: output folder already exists; pass --resume to continue that run, or choose a new folder"
            )
        if resume:
            saved = out / "config.json"
            if not saved.is_file():
                raise InputError(f"{out}: nothing to resume (no config.json)")
            if without_placement(saved_config(type(cfg), json.loads(saved.read_text()))) != resolved:
                raise InputError(
                    f"{out}: config differs from the run being resumed ({saved}); resume with the same config"
                )


def saved_config(model: type, saved: Any) -> Any:
    """A run's saved ``config.json`` (``saved``, as read) dumped as ``model`` dumps a config now,
    so a folder saved in an earlier spelling (``train.config_keys``) still resumes; a saved config
    the model no longer reads is returned as it is (it then differs). Its episode is taken as
    saved, already composed: ``episode_config`` is not read again (it may have changed or gone)."""
    if not isinstance(saved, dict):
        return saved
    try:
        config = model.model_validate({**saved, "episode_config": None} if "episode_config" in saved else saved)
    except ValueError:  # pydantic's ValidationError, KeyProblems
        return saved
    dump = config_json(config)
    return {**dump, "episode_config": saved["episode_config"]} if "episode_config" in saved else dump


def prepare_run_folder(cfg, out: Path, resume: bool, dist: Dist) -> None:
    """New folder with ``config.json``; or, with ``resume``, check the saved config is identical."""
    check_run_folder(cfg, out, resume, dist)
    if dist.main and not resume:
        out.mkdir(parents=True)
        write_json(out / "config.json", config_json(cfg))
    dist.barrier()


def drop_lost_steps(out: Path, start: int, dist: Dist) -> None:
    """Remove the periodic evaluations (``eval/step-N``, SFT's ``eval/adapter-step-N``) of the
    steps a resume from step ``start`` runs again (after ``start``; step 0 too when starting from
    0), as ``TrainLog`` drops their log lines: they belong to the steps that were lost (a fall-back
    past a damaged checkpoint, a crash between checkpoints), and the evaluation refuses an
    existing folder, so the resume would stop there."""
    if dist.main and (out / "eval").is_dir():
        for path in (out / "eval").iterdir():
            match = re.fullmatch(r"(?:adapter-)?step-(\d+)", path.name)
            if match and path.is_dir() and (int(match[1]) > start or start == 0):
                shutil.rmtree(path)
    dist.barrier()


def finish_run(policy, out: Path, summary: dict[str, Any], dist: Dist) -> dict[str, Any]:
    """Save the final adapter to ``out/adapter`` and ``summary.json`` (main rank)."""
    if dist.main:
        save_adapter(policy, out / "adapter")
        summary["adapter"] = str(out / "adapter")
        write_json(out / "summary.json", summary)
    return summary
