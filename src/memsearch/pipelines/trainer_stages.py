"""Trainer stages: a fingerprinted, resumable GRPO or SFT run into a stage folder, shared by every
pipeline (``grpo_stage``, ``sft_stage``), and a GRPO stage stopped by the collapse guard finished
with its newest checkpoint (``finish_stopped_by_guard``).

The trainer runs in this process, or under torchrun when its config asks for more than one rank
(``pipelines.torchrun``). A finished stage's adapter is checked against the hash its record
keeps. The record and fingerprint are ``pipelines.stage_record``.
"""

from __future__ import annotations

import json
import shutil
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal

from memsearch.config import config_json
from memsearch.errors import InputError
from memsearch.io import write_json
from memsearch.pipelines.stage_record import Stage, folder_sha256
from memsearch.pipelines.torchrun import train_under_torchrun

OnCollapse = Literal["stop", "score_last_checkpoint"]


def grpo_stage(folder: Path, record: Path, grpo: Any, upstream: dict[str, Any], echo=print, around=None,
               on_collapse: OnCollapse = "stop") -> Path:
    """A fingerprinted ``train_grpo`` run into ``folder`` (resumed after a crash); returns the
    final adapter. Shared by every pipeline: ``grpo`` is the trainer config, ``upstream`` the
    fingerprints and hashes of what it was made from. ``around`` (a context-manager factory) is
    entered only while training runs, e.g. a model server the rollouts call (skipped stages start
    nothing). ``on_collapse``: what a stop of the collapse guard does; ``"stop"`` raises
    (``CollapseError``), ``"score_last_checkpoint"`` finishes the stage with the newest checkpoint's
    adapter and records the stop in the stage's outputs (``finish_stopped_by_guard``)."""
    from memsearch.train.grpo.collapse import CollapseError
    from memsearch.train.grpo.trainer import train_grpo

    label = (f"GRPO role={grpo.role}, {grpo.steps} steps x {grpo.rollout.tasks_per_step} questions x group "
             f"{grpo.rollout.group_size}")
    try:
        return _trainer_stage(folder, record, "grpo", grpo, upstream, train_grpo, label, echo, around)
    except CollapseError:
        if on_collapse != "score_last_checkpoint":
            raise
        return finish_stopped_by_guard(folder, _trainer_record(folder, record, "grpo", grpo, upstream), echo)


def finish_stopped_by_guard(folder: Path, stage: Stage, echo=print) -> Path:
    """Finish a GRPO stage that the collapse guard stopped, with the adapter of its newest
    checkpoint (verified against its checksums) copied to ``folder/adapter``. The stage's
    outputs keep ``collapse`` (the guard's step and reason, and the checkpoint used) so that every
    report and re-run sees the stage did not end normally. The checkpoint of the stop's step is
    the policy at the stop when the stop falls on a checkpoint step (an evaluation step always is);
    otherwise it is the newest one before it, and ``collapse.checkpoint`` names which."""
    from memsearch.train.checkpoint import checkpoints, verify_checkpoint

    record = json.loads((folder / "collapse.json").read_text())
    found = checkpoints(folder / "checkpoints")
    if not found or not verify_checkpoint(found[-1]):
        raise InputError(f"{folder}: the collapse guard stopped GRPO at step {record['step']} and no complete, "
                         "intact checkpoint is left to score; change the recipe or delete the stage to train again")
    newest = found[-1]
    shutil.rmtree(folder / "adapter", ignore_errors=True)
    shutil.copytree(newest / "adapter", folder / "adapter")
    collapse = {"step": record["step"], "reason": record["reason"], "checkpoint": newest.relative_to(folder).as_posix()}
    write_json(folder / "summary.json", {"adapter": str(folder / "adapter"), "stopped_by_collapse_guard": collapse})
    stage.finish({"adapter": "adapter", "adapter_sha256": folder_sha256(folder / "adapter"), "collapse": collapse})
    echo(f"{folder.name}: the collapse guard stopped it at step {record['step']} ({record['reason']}); "
         f"scoring {collapse['checkpoint']} as the stage's adapter (on_collapse = 'score_last_checkpoint')")
    return folder / "adapter"


def sft_stage(folder: Path, record: Path, sft: Any, upstream: dict[str, Any], echo=print) -> Path:
    """A fingerprinted ``train_sft`` run into ``folder`` (resumed after a crash); returns the adapter."""
    from memsearch.train.sft.trainer import train_sft

    return _trainer_stage(folder, record, "sft", sft, upstream, train_sft, "LoRA SFT", echo)


def _trainer_record(folder: Path, record: Path, key: str, cfg: Any, upstream: dict[str, Any]) -> Stage:
    """A trainer stage's record, fingerprinted by its trainer config and what it was made from
    (one definition: the stage that trains and the one that finishes a guard stop must agree)."""
    from memsearch.train.config import without_placement

    # Placement (GPUs, checkpointing) changes no number: a stage re-run on another node still matches.
    return Stage(folder, folder.name, {key: without_placement(config_json(cfg)), **upstream}, record)


def _trainer_stage(
    folder: Path, record: Path, key: str, cfg: Any, upstream: dict[str, Any], train, label: str, echo, around=None
) -> Path:
    stage = _trainer_record(folder, record, key, cfg, upstream)
    if stage.done():
        _check_adapter(folder, stage)
        echo(f"{folder.name}: done ({folder})")
        return folder / "adapter"
    resume = stage.started() and (folder / "config.json").is_file()
    from memsearch.train.launch import training_ranks

    ranks = training_ranks(cfg)  # > 1: the trainer runs under torchrun, a child of this process
    # `around` first: a server that fails to start or is refused leaves no record behind.
    with around() if around is not None else nullcontext():
        stage.start()
        echo(f"{folder.name}: {label}" + (f" on {ranks} ranks (torchrun)" if ranks > 1 else "")
             + (" (resuming)" if resume else ""))
        # The trainer owns the folder's config.json / checkpoints; it refuses a changed config on resume.
        if ranks > 1:
            train_under_torchrun(folder, key, cfg, resume, ranks)
        else:
            train(cfg, folder, resume=resume, echo=echo)
    return _finish_adapter(folder, stage)


def _check_adapter(folder: Path, stage: Stage) -> None:
    if folder_sha256(folder / "adapter") != stage.record()["outputs"]["adapter_sha256"]:
        raise InputError(
            f"{folder / 'adapter'}: missing or changed since training finished; delete {folder} and "
            f"{stage.record_path} to train again, or choose a new --out"
        )


def _finish_adapter(folder: Path, stage: Stage) -> Path:
    if not (folder / "adapter" / "adapter_config.json").is_file():
        raise InputError(f"{folder}: training ended without an adapter")
    stage.finish({"adapter": "adapter", "adapter_sha256": folder_sha256(folder / "adapter")})
    return folder / "adapter"
