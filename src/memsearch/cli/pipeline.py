"""``memsearch pipeline``: the end-to-end recipes (prepare, train, merge, evaluate, report), resumable.

Every command imports what it needs inside its body, so ``memsearch --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memsearch.cli.common import Overrides, command_group, friendly

pipeline_app = command_group("End-to-end pipelines: prepare, train, merge, evaluate, report (resumable).")

PipelineOut = Annotated[Path, typer.Option(
    "--out", help="Pipeline folder: created, or continued (finished stages are skipped).")]


@pipeline_app.command("memagent")
@friendly
def memagent(
    config: Annotated[Path, typer.Option("--config", help="Pipeline config, e.g. configs/memagent.toml.")],
    out: PipelineOut,
    set_: Overrides = None,
) -> None:
    """MemAgent: RULER-HQA sets, GRPO (overwrite role), merge, base vs trained at every N, report."""
    from memsearch.config import load_config
    from memsearch.pipelines.memagent.config import MemAgentPipeline
    from memsearch.pipelines.memagent.pipeline import run_memagent_pipeline

    run_memagent_pipeline(load_config(config, set_, model=MemAgentPipeline), out, echo=typer.echo)


@pipeline_app.command("memory-policy")
@friendly
def memory_policy(
    config: Annotated[Path, typer.Option("--config", help="Pipeline config, e.g. configs/memory_policy_cpu.toml.")],
    out: PipelineOut,
    set_: Overrides = None,
) -> None:
    """Memory policy: teacher + SFT, GRPO stage 1, merge, optional stage 2 (controller), A-D on held-out dev, report."""
    from memsearch.config import load_config
    from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline
    from memsearch.pipelines.memory_policy.pipeline import run_memory_policy_pipeline

    run_memory_policy_pipeline(load_config(config, set_, model=MemoryPolicyPipeline), out, echo=typer.echo)
