"""``memsearch eval``: run one agent over a data folder, or the A-D matrix under identical budgets.

Every command imports what it needs inside its body, so ``memsearch --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from memsearch.cli.common import (
    EXIT_INCOMPLETE,
    DataDir,
    HelpGroup,
    Limit,
    Overrides,
    add_renamed,
    command_group,
    friendly,
    out_folder,
    say_renamed,
)


class EvalGroup(HelpGroup):
    """The ``eval`` group. ``memsearch eval --config ...`` (options where a subcommand belongs) is
    the old single ``eval`` command: it says so and runs ``eval run`` with the same arguments."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0].startswith("-") and args[0] not in ctx.help_option_names:
            say_renamed("eval", "eval run")
            args = ["run", *args]
        return super().parse_args(ctx, args)


eval_app = command_group("Evaluate agents: one run over a data folder, or the A-D matrix with paired bootstrap CIs.",
                         cls=EvalGroup)

ConfigFile = Annotated[Path, typer.Option("--config", help="TOML run config, e.g. configs/rules.toml.")]
RunOut = Annotated[Path, typer.Option("--out", help="New run folder (or the one to --resume).", callback=out_folder)]
RunResume = Annotated[bool, typer.Option(
    help="Finish a crashed run in OUT (a folder `eval run` made): missing tasks only.")]
MatrixOut = Annotated[Path, typer.Option(
    "--out", help="New folder: one subfolder per group plus matrix.json / matrix.md.", callback=out_folder)]
MatrixResume = Annotated[bool, typer.Option(help="Finish the groups of a crashed matrix in OUT (a folder `eval matrix` "
                                                 "made).")]


def _run_config(path: Path, overrides: list[str] | None, limit: int | None, matrix: bool = False) -> Any:
    """The resolved run config: file (a run config or a pipeline config), then ``--set``
    overrides, then ``--limit``. Prints a notice for each table the run uses that the config
    leaves to defaults."""
    from memsearch.config import apply_overrides, defaulted_sections
    from memsearch.errors import InputError
    from memsearch.pipelines.config import load_run_config, run_config_tables

    # `--limit 0` must not mean "no limit": on a paid API that is every question of the folder.
    if limit is not None and limit < 1:
        raise InputError(f"--limit {limit}: expected a positive number of tasks")
    overrides = list(overrides or []) + ([f"limit={limit}"] if limit is not None else [])
    config = load_run_config(path, overrides)
    tables = apply_overrides(run_config_tables(path), overrides)
    for section in defaulted_sections(tables, uses_controller=matrix or config.agent.controller == "policy"):
        what = ("that role runs the default backend (kind = 'rules')" if section.startswith("backends.")
                else "it takes the defaults")
        typer.echo(f"notice: {path} has no [{section}] table: {what}", err=True)
    return config


def report_hint(run: Path, data: Path) -> str:
    """The command that writes (and names) the HTML report of a run or matrix folder."""
    from memsearch.pipelines.demo import report_command

    return report_command(run, data)


@eval_app.command("run")
@friendly
def run(config: ConfigFile, data: DataDir, out: RunOut, limit: Limit = None, resume: RunResume = False,
        set_: Overrides = None) -> None:
    """Run one agent over a data folder: trajectories, per-task metrics, summary."""
    from memsearch.eval.runner import run_eval

    summary = run_eval(_run_config(config, set_, limit), data, out, resume=resume)
    m = summary.metrics
    typer.echo(f"{out}: {summary.tasks.scored}/{summary.tasks.expected} tasks, "
               f"F1 {m['f1']:.3f}, EM {m['em']:.3f}, invalid-action rate {m['invalid_action_rate'] or 0:.3f}, "
               f"request errors {summary.request_errors}")
    if summary.note:
        typer.echo(summary.note, err=True)
    typer.echo(report_hint(out, data))
    if not summary.complete:
        raise typer.Exit(EXIT_INCOMPLETE)


@eval_app.command("matrix")
@friendly
def matrix(config: ConfigFile, data: DataDir, out: MatrixOut, limit: Limit = None, resume: MatrixResume = False,
           set_: Overrides = None) -> None:
    """Groups A-D (memory x controller) under identical budgets, with paired bootstrap CIs."""
    from memsearch.eval.matrix import run_matrix

    result = run_matrix(_run_config(config, set_, limit, matrix=True), data, out, resume=resume)
    typer.echo(result["table"])
    if not result["usable_for_comparison"]:
        typer.echo("NOT USABLE FOR COMPARISON: some group has failed tasks, request errors or calls the server's "
                   "context cut short (see its summary.json note)", err=True)
    typer.echo(report_hint(out, data))
    incomplete = [g for g, s in result["groups"].items() if not s["complete"]]
    if incomplete:
        typer.echo(f"INCOMPLETE: group(s) {', '.join(incomplete)} have missing or failed tasks; not a result", err=True)
        raise typer.Exit(EXIT_INCOMPLETE)


def add_renamed_eval_commands(root: typer.Typer) -> None:
    """The old top-level ``matrix``, hidden (the old ``eval`` lives on in ``EvalGroup``)."""
    add_renamed(root, "matrix", "eval matrix", matrix)
