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


def _run_pipeline(model, run, config: Path, out: Path, overrides: list[str] | None) -> None:
    """Load the pipeline config ``model`` (file and --set) and ``run`` it into ``out``."""
    from memsearch.config import load_config
    from memsearch.devices import apply_training_layout

    cfg = load_config(config, overrides, model=model)
    # First, before any stage touches CUDA: every stage of this process then runs on the trainer's GPUs.
    apply_training_layout(cfg.devices)
    run(cfg, out, echo=typer.echo)


@pipeline_app.command("memagent")
@friendly
def memagent(config: PipelineConfig, out: PipelineOut, set_: Overrides = None) -> None:
    """MemAgent: RULER-HQA sets, GRPO (memagent role), merge, base vs trained at every N, report."""
    from memsearch.pipelines.memagent.config import MemAgentPipeline
    from memsearch.pipelines.memagent.pipeline import run_memagent_pipeline

    _run_pipeline(MemAgentPipeline, run_memagent_pipeline, config, out, set_)


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
    from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline
    from memsearch.pipelines.memory_policy.pipeline import run_memory_policy_pipeline, run_validation_only

    run = run_validation_only if validation_only else run_memory_policy_pipeline
    _run_pipeline(MemoryPolicyPipeline, run, config, out, set_)
