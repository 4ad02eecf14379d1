"""``memsearch train``: SFT rows from a run, LoRA SFT, multi-turn GRPO, and merging an adapter.

Every command imports what it needs inside its body, so ``memsearch --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from memsearch.cli.common import Overrides, add_renamed, command_group, friendly, out_file, out_folder

train_app = command_group("Train policies: SFT rows from a run, LoRA SFT, multi-turn GRPO (torchrun for several "
                          "devices), merged checkpoints.")

TrainOut = Annotated[Path, typer.Option("--out", help="New run folder (or the one to --resume).", callback=out_folder)]
TrainResume = Annotated[bool, typer.Option(
    help="Continue the run in OUT from its newest complete checkpoint, exactly.")]


@train_app.command("export-sft")
@friendly
def export_sft(
    trajectories: Annotated[Path, typer.Option(
        help="trajectories.jsonl of an eval run (config.json must sit next to it).")],
    metrics: Annotated[Path, typer.Option(help="metrics.jsonl written with those trajectories.")],
    role: Annotated[str, typer.Option(help="Policy role to export: memory, controller or reader.")],
    out: Annotated[Path, typer.Option(help="New JSON-lines file (must not exist).", callback=out_file)],
    min_f1: Annotated[Optional[float], typer.Option(help="Keep only tasks whose metrics row has f1 >= this.")] = None,
) -> None:
    """Chat-format SFT rows (messages, completion) from the valid policy calls of one role."""
    from memsearch.train.sft.export import export_sft as export

    for line in export(trajectories, metrics, role, out, min_f1=min_f1).lines():
        typer.echo(line)


def _train(kind: str, config: Path, out: Path, resume: bool, adapter: Path | None, overrides: list[str] | None,
           dry_run: bool = False, gpu_memory: float | None = None) -> None:
    """Load the trainer config (file, --set, --adapter) and run ``memsearch.train.<kind>.trainer``, or
    with ``dry_run`` only its memory pre-flight."""
    import json

    from memsearch.config import load_config
    from memsearch.train.config import GRPOConfig, SFTConfig

    extra = list(overrides or []) + ([f"adapter={json.dumps(str(adapter))}"] if adapter else [])
    cfg = load_config(config, extra, model={"sft": SFTConfig, "grpo": GRPOConfig}[kind])
    if dry_run:
        _dry_run(cfg, gpu_memory)
        return
    if gpu_memory is not None:
        from memsearch.errors import InputError

        raise InputError("--gpu-memory is for --dry-run; a run checks the memory of the GPU it gets")
    if kind == "sft":
        from memsearch.train.sft.trainer import train_sft as train
    else:
        from memsearch.train.grpo.trainer import train_grpo as train
    summary = train(cfg, out, resume=resume, echo=typer.echo)
    if "adapter" in summary:
        typer.echo(f"adapter: {summary['adapter']}")


def _dry_run(cfg, gpu_memory: float | None) -> None:
    """Print the step's memory estimate per GPU and check it against ``gpu_memory`` GiB, else the
    smallest visible GPU; reads the model's config.json only and creates nothing."""
    from memsearch.errors import InputError
    from memsearch.train.memory_plan import GIB, check_memory, estimate_for_run, gib, needed_bytes

    estimate = estimate_for_run(cfg)
    for line in estimate.lines():
        typer.echo(line)
    if gpu_memory is not None:
        device_bytes, where = int(gpu_memory * GIB), f"--gpu-memory {gpu_memory:g}"
    else:
        import torch

        if not torch.cuda.is_available():
            raise InputError("no GPU found: give --gpu-memory GIB, the memory of the GPU the step will run on "
                             "(e.g. 79.6 for an 80 GB H100)")
        sizes = {torch.cuda.get_device_properties(i).total_memory: i for i in range(torch.cuda.device_count())}
        device_bytes = min(sizes)
        where = f"cuda:{sizes[device_bytes]} ({torch.cuda.get_device_name(sizes[device_bytes])})"
    check_memory(estimate, device_bytes, where)
    typer.echo(f"fits: needs {gib(needed_bytes(estimate.total_bytes))} of {gib(device_bytes)} ({where})")


DryRun = Annotated[bool, typer.Option(
    "--dry-run", help="Only print the step's memory estimate per GPU from the model's config.json and check it "
    "(exit 2 with the fix when it does not fit); creates nothing.")]
GpuMemory = Annotated[Optional[float], typer.Option(
    "--gpu-memory", min=0.5, help="With --dry-run: the GPU's memory in GiB (default: the smallest visible GPU's).")]
StartAdapter = Annotated[Optional[Path], typer.Option(
    "--adapter", help="Start from this LoRA adapter, e.g. an SFT run (weights only).")]
SFTConfigFile = Annotated[Path, typer.Option("--config", help="TOML SFT config, e.g. configs/train/sft_cpu.toml.")]
GRPOConfigFile = Annotated[Path, typer.Option("--config", help="TOML GRPO config, e.g. configs/train/grpo_cpu.toml.")]


@train_app.command("sft")
@friendly
def sft(config: SFTConfigFile, out: TrainOut, resume: TrainResume = False, adapter: StartAdapter = None,
        set_: Overrides = None, dry_run: DryRun = False, gpu_memory: GpuMemory = None) -> None:
    """LoRA SFT on completion tokens of `train export-sft` data; checkpoints, periodic engine eval."""
    _train("sft", config, out, resume, adapter, set_, dry_run, gpu_memory)


@train_app.command("grpo")
@friendly
def grpo(config: GRPOConfigFile, out: TrainOut, resume: TrainResume = False, adapter: StartAdapter = None,
         set_: Overrides = None, dry_run: DryRun = False, gpu_memory: GpuMemory = None) -> None:
    """Multi-turn GRPO through the episode engine (role memory, controller or memagent)."""
    _train("grpo", config, out, resume, adapter, set_, dry_run, gpu_memory)


@train_app.command("merge-adapter")
@friendly
def merge_adapter(
    model: Annotated[str, typer.Option(help="Base model: 'embedded' or a local Hugging Face folder.")],
    adapter: Annotated[Path, typer.Option(help="LoRA adapter folder (e.g. RUN/adapter).")],
    out: Annotated[Path, typer.Option(help="New folder for the merged Hugging Face checkpoint.",
                                      callback=out_folder)],
    dtype: Annotated[str, typer.Option(help="Saved weights dtype: float32, bfloat16, float16.")] = "float32",
) -> None:
    """Merge a LoRA adapter into its base: a plain checkpoint for the hf backend, transformers serve or vLLM."""
    from memsearch.train.merge import merge_adapter as merge

    typer.echo(f"merged model: {merge(model, adapter, out, dtype)}")


def add_renamed_train_commands(root: typer.Typer) -> None:
    """The old top-level names ``export-sft`` and ``merge-adapter``, hidden."""
    add_renamed(root, "export-sft", "train export-sft", export_sft)
    add_renamed(root, "merge-adapter", "train merge-adapter", merge_adapter)
