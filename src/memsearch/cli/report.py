"""``memsearch report``: a self-contained HTML report of runs, and the static plots.

Every command imports what it needs inside its body, so ``memsearch --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from memsearch.cli.common import command_group, friendly, out_file, out_folder

report_app = command_group("Browse runs in a self-contained HTML report; write the static plots.")

Force = Annotated[bool, typer.Option("--force", help="Replace an existing output (a symlink there is replaced, "
                                                     "never written through).")]

RunPaths = Annotated[list[Path], typer.Argument(
    help="A run folder or a matrix folder; a second run folder turns on compare mode.")]
ReportData = Annotated[Path, typer.Option(
    "--data", help="The data folder the run(s) were made on (its fingerprint must match run.json).")]
TrainLogs = Annotated[Optional[list[Path]], typer.Option(
    "--train-log", help="A train_log.jsonl (repeatable: several seeds form a band).")]


@report_app.command("view")
@friendly
def view(
    runs: RunPaths,
    data: ReportData,
    out: Annotated[Path, typer.Option("--out", help="The HTML file to write (new, unless --force).",
                                      callback=out_file)],
    train_log: TrainLogs = None,
    force: Force = False,
) -> None:
    """One self-contained HTML file: run header, task table, episodes, compare mode, training curves."""
    from memsearch.errors import InputError
    from memsearch.report.html import write_report

    if len(runs) > 2:
        raise InputError(f"expected RUN [RUN_B], got {len(runs)} runs")
    path = write_report(runs, data, out, train_log, force=force)
    # as_uri percent-encodes: a URL with a space or a `$(...)` in its path is still one word
    typer.echo(f"report: {path} ({path.stat().st_size / 1e6:.2f} MB); open it in a browser ({path.resolve().as_uri()})")


@report_app.command("plots")
@friendly
def plots(
    out: Annotated[Path, typer.Option("--out", help="New folder for the PNG files (with --force: an existing one).",
                                      callback=out_folder)],
    runs: Annotated[Optional[list[Path]], typer.Argument(help="Run or matrix folders (optional).")] = None,
    data: Annotated[Optional[Path], typer.Option(
        "--data", help="With runs: the data folder they were made on.")] = None,
    train_log: TrainLogs = None,
    force: Force = False,
) -> None:
    """Static PNG plots (matplotlib) for docs/results: metrics with CIs per run, reward curves."""
    from memsearch.errors import InputError
    from memsearch.report.plots import write_plots

    if runs and data is None:
        raise InputError("runs need --data, the data folder they were made on")
    for path in write_plots(runs or [], data, out, train_log, force=force):
        typer.echo(f"wrote {path}")
