"""``memsearch verl``: scale out on upstream verl: export the parquet, print the Hydra overrides
(docs/verl.md).

Every command imports what it needs inside its body, so ``memsearch --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from memsearch.cli.common import DataDir, Overrides, command_group, friendly, out_file

verl_app = command_group("Scale out on upstream verl: export the parquet, print the Hydra overrides (docs/verl.md).")
GRPOOrPipelineConfigFile = Annotated[Path, typer.Option(
    "--config", help="GRPO config (configs/train/*.toml) or a MemAgent pipeline config.")]


@verl_app.command("export-data")
@friendly
def export_data(
    data: DataDir,
    out: Annotated[Path, typer.Option("--out", help="The parquet file to write (data.train_files / val_files).",
                                      callback=out_file)],
    role: Annotated[Optional[str], typer.Option(help="Record the trained role (memory, controller, memagent); the "
                                                     "loop refuses a config that trains another.")] = None,
) -> None:
    """The parquet verl reads: the question as prompt, labels only in reward_model, no documents."""
    from memsearch.errors import InputError
    from memsearch.integrations.verl.data import export_parquet
    from memsearch.train.rows import TRAINED_CALL_ROLES

    if role is not None and role not in TRAINED_CALL_ROLES:
        raise InputError(f"--role {role!r}: expected one of {', '.join(TRAINED_CALL_ROLES)}")
    typer.echo(f"wrote {out}: {export_parquet(data, out, role)} rows")


@verl_app.command("config")
@friendly
def hydra_config(
    config: GRPOOrPipelineConfigFile,
    train_files: Annotated[str, typer.Option(
        "--train-files", help="The train parquet (export-data).")] = "train.parquet",
    val_files: Annotated[Optional[str], typer.Option("--val-files", help="The validation parquet.")] = None,
    data: Annotated[Optional[Path], typer.Option(
        "--data", help="The prepared train folder the parquet came from.")] = None,
    agent_loops: Annotated[Path, typer.Option(
        "--agent-loops", help="Write the agent-loop YAML here.")] = Path("agent_loops.yaml"),
    gpus: Annotated[Optional[int], typer.Option(
        help="GPUs per node [default: the config's devices.train GPUs, else 8]; another number than the layout's is "
             "refused.", show_default=False)] = None,
    nodes: Annotated[int, typer.Option(help="Nodes.")] = 1,
    rollout_tp: Annotated[int, typer.Option(
        "--rollout-tp", help="Tensor-parallel size of each vLLM/SGLang rollout replica "
                             "(actor_rollout_ref.rollout.tensor_model_parallel_size, verl's default 2); GPUs per node "
                             "x nodes must be divisible by it.")] = 2,
    logger: Annotated[str, typer.Option(
        "--logger", help="verl's trainer.logger, comma-separated (e.g. console,wandb,tensorboard); wandb needs "
                         "WANDB_API_KEY.")] = "console",
    rows_per_session: Annotated[Optional[float], typer.Option(
        "--rows-per-session", help="Expected trained calls per session, which size verl's mini-batch [default: "
                                   "max_searches; MemAgent: the chunks of the data's contexts + 1].",
        show_default=False)] = None,
    set_: Overrides = None,
) -> None:
    """verl Hydra overrides for a memsearch GRPO config (one per line); refuses options verl cannot run,
    a rollout TP size that does not divide the GPUs, and a --gpus other than the config's [devices] layout."""
    from memsearch.integrations.verl.config import agent_loop_yaml, load_grpo_config, training_gpus, verl_overrides

    cfg = load_grpo_config(config, set_, str(data) if data else None)
    loggers = tuple(name.strip() for name in logger.split(",") if name.strip())
    overrides, notes = verl_overrides(cfg, str(agent_loops.resolve()), train_files, val_files,
                                      training_gpus(cfg, gpus), nodes, tensor_parallel=rollout_tp, loggers=loggers,
                                      rows=rows_per_session)
    # Ray workers may start elsewhere: the YAML names the config and data by absolute path.
    agent_loops.parent.mkdir(parents=True, exist_ok=True)
    yaml = agent_loop_yaml(str(config.resolve()), str(Path(cfg.data).resolve()), set_)
    agent_loops.write_text(yaml, encoding="utf-8")
    for note in notes:
        typer.echo(f"# note: {note}", err=True)
    typer.echo("\n".join(overrides))
