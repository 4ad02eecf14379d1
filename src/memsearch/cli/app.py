"""memsearch: data, retrieval and memory for budgeted multi-hop QA agents.

The root command: the two entry commands (``demo``, ``walkthrough``) and ``devices`` (a config's
GPU layout for shell recipes), then one group per noun in the order a user meets them (data,
retrieval, eval, train, pipeline, experiment, report, verl), then the hidden old names of renamed commands.
Every command imports what it needs inside its body, so ``memsearch --help`` stays instant. Bad
input ends with ``error: <file:line: field: problem>`` lines and exit status 2; anything
unexpected with a traceback and status 1.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from memsearch.cli.common import EXIT_INCOMPLETE, EXIT_INPUT, EXIT_STORAGE, command_group, friendly, out_folder
from memsearch.cli.data import add_renamed_data_commands, data_app
from memsearch.cli.devices import devices as devices_command
from memsearch.cli.eval import add_renamed_eval_commands, eval_app
from memsearch.cli.experiment import experiment_app
from memsearch.cli.pipeline import pipeline_app
from memsearch.cli.report import report_app
from memsearch.cli.retrieval import add_renamed_retrieval_commands, retrieval_app
from memsearch.cli.train import add_renamed_train_commands, train_app
from memsearch.cli.verl import verl_app

__all__ = ["EXIT_INCOMPLETE", "EXIT_INPUT", "EXIT_STORAGE", "app", "main"]

app = command_group(__doc__.split("\n\n")[0])


@app.command("demo")
@friendly
def demo(
    backend: Annotated[str, typer.Option(help="hf (the embedded model, CPU) or rules (seconds).")] = "hf",
    limit: Annotated[int, typer.Option(help="Number of dev questions (about 45 s each on a 2-core CPU).")] = 4,
    out: Annotated[Optional[Path], typer.Option(
        help="New output folder (default: a fresh runs/demo-* folder).", callback=out_folder)] = None,
    adapter: Annotated[Optional[Path], typer.Option(
        help="hf: the trained memory-policy adapter of the B-trained row (default: models/memory-policy-cpu, "
             "or MEMSEARCH_MEMORY_POLICY_ADAPTER); must match its fingerprint.json.")] = None,
) -> None:
    """The four-group matrix (A-D) on real HotpotQA questions with the embedded model, plus B-trained
    (group B with the shipped trained memory-policy adapter)."""
    from memsearch.pipelines.demo import run_demo

    run_demo(backend=backend, limit=limit, out=out, echo=typer.echo, adapter=adapter)


@app.command("walkthrough")
@friendly
def walkthrough(
    out: Annotated[Optional[Path], typer.Option(
        help="New output folder (default: a fresh runs/walkthrough-* folder).", callback=out_folder)] = None,
) -> None:
    """The walk-through on the shipped samples: prepare, validate, index, search, long contexts."""
    from memsearch.pipelines.walkthrough import run_walkthrough

    run_walkthrough(out, echo=typer.echo)


# A lookup for shell recipes (which GPUs a config gives a use); typer lists commands before groups.
app.command("devices")(devices_command)

# `memsearch --help` lists the groups in this order.
for name, group in (("data", data_app), ("retrieval", retrieval_app), ("eval", eval_app), ("train", train_app),
                    ("pipeline", pipeline_app), ("experiment", experiment_app), ("report", report_app),
                    ("verl", verl_app)):
    app.add_typer(group, name=name)

for add_renamed_commands in (add_renamed_data_commands, add_renamed_retrieval_commands, add_renamed_eval_commands,
                             add_renamed_train_commands):
    add_renamed_commands(app)


def main() -> None:  # pragma: no cover - console entry for `python -m memsearch.cli.app`
    app(prog_name="memsearch")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
