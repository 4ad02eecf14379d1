"""The eval stage: one fingerprinted, resumable ``run_eval`` (``eval_run``). A run with failed or
missing tasks leaves its stage open (``pipelines.unfinished``), so the same command retries them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memsearch.config import config_json
from memsearch.io import sha256_file
from memsearch.pipelines.stage_record import Stage
from memsearch.pipelines.unfinished import leave_open
from memsearch.records.run_summary import RunSummary


def eval_run(
    folder: Path, record: Path, run_config, data: Path, upstream: dict[str, Any], echo=print,
    label: str | None = None, group: str | None = None, show_progress: bool = False,
) -> RunSummary:
    """One fingerprinted ``run_eval`` (resumed after a crash); returns its summary. A run with
    failed or missing tasks is not finished: its record stays open, so the next run of the same
    command resumes it and retries exactly those tasks (``eval --resume``); the caller reads
    ``summary.complete``, and the command ends incomplete (``unfinished_stages``). ``label``
    names it in what is echoed (default: the folder's name), ``group`` in its trajectories."""
    from memsearch.eval.runner import run_eval

    stage = Stage(
        folder,
        folder.name,
        {
            "run_config": config_json(run_config),
            "data_manifest_sha256": sha256_file(data / "manifest.json"),
            **upstream,
        },
        record,
    )
    label = label or folder.name
    if stage.done() and (folder / "summary.json").is_file():
        echo(f"{label}: done")
        return RunSummary.read(folder / "summary.json")
    resume = stage.started() and folder.exists()
    stage.start()
    if show_progress:
        echo(f"{label}: {'resuming' if resume else 'running'}")
    summary = run_eval(run_config, data, folder, resume=resume, group=group or folder.name,
                       show_progress=show_progress)
    if summary.complete:
        stage.finish({"summary": "summary.json"})
    else:
        leave_open(stage)
        echo(f"{label}: INCOMPLETE, {incomplete_words(summary)}; the same command retries them")
    return summary


def incomplete_words(summary: RunSummary) -> str:
    """How an eval summary is incomplete: ``2 of 3 tasks failed, 0 missing``."""
    tasks = summary.tasks
    return f"{tasks.failed} of {tasks.expected} tasks failed, {tasks.expected - tasks.scored} missing"
