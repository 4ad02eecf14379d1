"""``memsearch pipeline``: the end-to-end recipes (prepare, train, merge, evaluate, report), resumable.

Every command imports what it needs inside its body, so ``memsearch --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memsearch.cli.common import Overrides, command_group, friendly, out_folder

pipeline_app = command_group("End-to-end pipelines: prepare, train, merge, evaluate, report (resumable).")

PipelineOut = Annotated[Path, typer.Option(
    "--out", help="Pipeline folder: created, or continued (one this pipeline made; finished stages are skipped).",
    callback=out_folder)]
PipelineConfig = Annotated[Path, typer.Option(
    "--config", help="Pipeline config, e.g. configs/memagent.toml or configs/memory_policy_cpu.toml.")]


_CONFIG_CLASSES = {"memagent": "MemAgentPipeline", "memory_policy": "MemoryPolicyPipeline"}


def _run_pipeline(kind: str, config: Path, out: Path, overrides: list[str] | None, entry: str | None = None) -> None:
    """Load the config of pipeline ``kind`` (file and --set) and run ``memsearch.pipelines.<kind>``
    (its ``run_<kind>_pipeline``, or the function named ``entry``)."""
    import importlib

    from memsearch.config import load_config

    model = getattr(importlib.import_module(f"memsearch.pipelines.{kind}.config"), _CONFIG_CLASSES[kind])
    run = getattr(importlib.import_module(f"memsearch.pipelines.{kind}.pipeline"), entry or f"run_{kind}_pipeline")
    cfg = load_config(config, overrides, model=model)
    from memsearch.devices import apply_training_layout

    # First, before any stage touches CUDA: every stage of this process then runs on the trainer's GPUs.
    apply_training_layout(cfg.devices)
    run(cfg, out, echo=typer.echo)


@pipeline_app.command("memagent")
@friendly
def memagent(config: PipelineConfig, out: PipelineOut, set_: Overrides = None) -> None:
    """MemAgent: RULER-HQA sets, GRPO (memagent role), merge, base vs trained at every N, report."""
    _run_pipeline("memagent", config, out, set_)


@pipeline_app.command("memory-policy")
@friendly
def memory_policy(
    config: PipelineConfig,
    out: PipelineOut,
    set_: Overrides = None,
    validation_only: Annotated[bool, typer.Option(
        "--validation-only", help="Pilot: prepare, teacher, each seed's SFT and GRPO stage 1 with its periodic "
        "evaluation on the validation split; no held-out row is run (continue the same --out without it later).")
    ] = False,
) -> None:
    """Memory policy: teacher + SFT, GRPO stage 1, merge, optional stage 2 (controller), A-D on held-out dev, report."""
    _run_pipeline("memory_policy", config, out, set_, "run_validation_only" if validation_only else None)
