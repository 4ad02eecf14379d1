"""Unfinished stages: which stage records of a run folder finished, and which this invocation
left open, so that a command whose tasks did not all succeed ends incomplete.

A stage whose tasks did not all succeed (an eval or matrix with failed or missing tasks) stays
unfinished: the same command retries those tasks, and ``unfinished_stages`` names it so the
command ends incomplete (exit 3), never "finished". The records themselves are
``pipelines.stage_record``.
"""

from __future__ import annotations

import json
from pathlib import Path

from memsearch.pipelines.stage_record import _RUN_FOLDER, RECORD, Stage, read_stage_record


def stage_states(out: Path) -> dict[str, bool]:
    """Every stage record under ``out`` by name (``seed-1/matrix``), with whether it finished."""
    states = {}
    for path in sorted(Path(out).glob("**/*.stage.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            record = {}
        states[path.relative_to(out).as_posix().removesuffix(".stage.json")] = bool(
            isinstance(record, dict) and record.get("complete"))
    return states


# Stage records this process left open because tasks failed (``leave_open``), by run folder: what
# makes a command end incomplete. A record left open by an interrupted earlier invocation, or by a
# stage this one no longer runs (another seed list), is no failed task of this invocation.
_LEFT_OPEN: dict[Path, set[Path]] = {}


def leave_open(stage: Stage) -> None:
    """Note that ``stage`` ends this invocation unfinished because some of its tasks failed or are
    missing (its record stays open: the next run of the same command resumes it)."""
    out = _RUN_FOLDER.get()
    if out is not None:
        _LEFT_OPEN.setdefault(Path(out).resolve(), set()).add(stage.record_path.resolve())


def unfinished_stages(out: Path) -> list[str]:
    """The stages of ``out`` (by record name, ``seed-1/matrix``) this process left open with
    failed or missing tasks (``leave_open``) and that are still not finished, in name order."""
    root = Path(out).resolve()
    names = []
    for path in _LEFT_OPEN.get(root, ()):
        record = read_stage_record(path) if path.is_file() else None
        if record is not None and not record.get("complete"):
            names.append(path.relative_to(root).as_posix().removesuffix(".stage.json").removesuffix(f"/{RECORD}"))
    return sorted(names)


def raise_if_unfinished(out: Path) -> None:
    """``IncompleteResult`` naming every unfinished stage under ``out``: called when a command's
    stages all ran, so these are the ones with failed or missing tasks; its exit status is 3."""
    from memsearch.errors import IncompleteResult

    if unfinished := unfinished_stages(out):
        raise IncompleteResult(f"{len(unfinished)} stage(s) have failed or missing tasks, so the report is not a "
                               f"result: {', '.join(unfinished)}\nrun the same command again: it keeps every "
                               "finished stage and task and retries only those tasks")
