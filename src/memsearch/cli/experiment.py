"""``memsearch experiment``: the whole path on one node in one command (docs/server.md).

Every command imports what it needs inside its body, so ``memsearch --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from memsearch.cli.common import Overrides, command_group, friendly, out_folder

experiment_app = command_group("One command on a GPU node: data, model servers, training, deployment, the A-D "
                               "comparison and the report (resumable).")

ExperimentConfigFile = Annotated[Path, typer.Option(
    "--config", help="Experiment settings, a copy of configs/experiment.example.toml.")]
ExperimentFolder = Annotated[Path, typer.Option(
    "--out", help="Experiment folder: created, or continued (one this command made; finished stages are skipped).",
    callback=out_folder)]
Profile = Annotated[Optional[str], typer.Option(
    "--profile", help="Apply the config's [profile.NAME] overrides, e.g. cpu (the embedded model, `transformers "
    "serve`, a few questions).")]


@experiment_app.command("run")
@friendly
def run(config: ExperimentConfigFile, out: ExperimentFolder, profile: Profile = None, set_: Overrides = None) -> None:
    """Download the data, start the reader, evaluate the baseline, train stage 1, deploy it, train stage 2
    against it, run the A-D matrix and write the report; every server is stopped however it ends."""
    from memsearch.experiment.config import load_experiment
    from memsearch.experiment.run import run_experiment

    cfg = load_experiment(config, set_, profile)
    run_experiment(cfg, out, echo=typer.echo, profile=profile)
