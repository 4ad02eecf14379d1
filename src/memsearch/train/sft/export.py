"""SFT data from teacher trajectories: one chat-format JSON line per policy call of one role.

    memsearch export-sft --trajectories runs/oracle/trajectories.jsonl \\
        --metrics runs/oracle/metrics.jsonl --role memory --out sft/memory.jsonl [--min-f1 0.8]

or ``export_sft(trajectories, metrics, role, out, min_f1)`` from Python. Input is a run folder
written by ``memsearch eval`` (``config.json`` and ``run.json`` next to ``trajectories.jsonl``);
typically a run of the ``oracle`` teacher on a *train* split.

Each output line (compact JSON, in task order, then call order)::

    {"messages": [{"role": "system", ...}, {"role": "user", ...}],  # the prompt, as sent
     "completion": "...",      # the policy's text, exactly as it must be emitted
     "task_id": "...", "role": "memory", "step": 0,
     "source": {"run": "runs/oracle", "group": "", "backend": "oracle", "memory_mode": "decision",
                "split": "train"}}

``source.run`` is the run folder as given, ``source.group`` the trajectory's group, ``backend``
the kind of backend that answered the role in that run, ``memory_mode`` the run's memory mode and
``split`` its data split (always ``train``: `train sft` checks it). Memory-role rows of a
decision-mode run also carry ``"memory_sources"``: the evidence ids the memory held when the call
was made (the step's ``memory`` event, ``sources_before``), which the prompt does not show under
``agent.memory_sources = "hidden"``; ``train.sft.row_selection`` reads them. Not shown to the model.

Task order is the order of ``metrics.jsonl`` (the data's task order), not the order of
``trajectories.jsonl``, which an eval appends as episodes finish and so differs from run to run
under concurrency: the same teacher run gives the same file, so the rows a seeded selection
samples and the batches a seeded SFT draws do not depend on thread timing.

What is exported, and what is skipped (counted by reason, per policy call):

- ``task_status``: the task's trajectory is not ``status == "ok"`` (request errors, a crash);
- ``below_min_f1``: the task's metrics row has ``f1 < min_f1``;
- ``request_error``: the call itself failed (``error`` set);
- ``invalid``: the parsed action was not valid (``valid`` is not true);
- ``truncated``: the completion hit the token limit (``finish_reason == "length"``): a cut-off
  text is not what a policy should learn to emit, even when it happened to parse.

Refusals (nothing is written): a run on a split other than ``train`` (``run.json``); a memory-role
export from a run not in ``decision`` mode (summary and overwrite outputs are rewritten notes, not
operation batches); a missing ``config.json``; a trajectory without a metrics row, or whose metrics
row disagrees with it (prediction, status: the metrics come from another run); metrics whose folder
holds a different ``config.json`` / ``run.json``; an existing output file; nothing left to export.
Malformed input lines are reported as ``file:line: field: message``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from memsearch.data.dataset import validation_problems
from memsearch.errors import InputError, Problem
from memsearch.io import dumps_line, file_kind_problem, iter_jsonl
from memsearch.records.events import EventKind
from memsearch.records.trajectory import CALL_ROLES, Trajectory
from memsearch.registry import MEMORY_MODES

SKIP_REASONS = ("task_status", "below_min_f1", "request_error", "invalid", "truncated")


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str


# The pydantic models check the fields export reads on the line as written, so a malformed line is
# named by file, line and field; the checked line is then read as a ``Trajectory``.
class _Event(BaseModel):
    """Any event: its type and role say whether export checks it as a ``_PolicyCall``."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Any = None
    role: Any = None


class _Trajectory(BaseModel):
    """The fields of a trajectory line that export reads (others are allowed and ignored)."""

    model_config = ConfigDict(extra="allow", strict=True)
    task_id: str
    status: str
    group: str = ""
    prediction: str | None = None
    events: list[_Event]


class _PolicyCall(BaseModel):
    """The fields of a ``policy_call`` event of the exported role that export reads."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: str
    step: int
    messages: list[_Message]
    text: str
    finish_reason: str
    error: str | None = None
    valid: bool | None = None


class _MetricsRow(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    task_id: str
    status: str
    prediction: str | None = None
    f1: float


@dataclass
class ExportReport:
    """What ``export_sft`` did: rows written, calls skipped by reason, tasks kept."""

    out: Path
    role: str
    exported: int = 0
    skipped: Counter = field(default_factory=Counter)
    tasks: int = 0
    tasks_kept: int = 0  # tasks with status ok that passed --min-f1 (all ok tasks without it)
    min_f1: float | None = None

    def lines(self) -> list[str]:
        """Human-readable counts, for the CLI."""
        skipped = ", ".join(f"{reason} {self.skipped[reason]}" for reason in SKIP_REASONS if self.skipped[reason])
        out = [
            f"wrote {self.out}: {self.exported} {self.role} rows from {self.tasks} tasks",
            f"skipped calls: {skipped or 'none'}",
        ]
        if self.min_f1 is not None:
            out.append(f"tasks kept by --min-f1 {self.min_f1:g}: {self.tasks_kept}/{self.tasks}")
        return out


def _validate(model: type[BaseModel], obj: Any, file: str, line: int, prefix: str, problems: list[Problem]):
    """``model`` of ``obj``, or ``None`` with its problems (field paths under ``prefix``) added."""
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        for p in validation_problems(file, line, exc):
            problems.append(Problem(p.file, p.line, f"{prefix}.{p.field}" if prefix else p.field, p.message))
        return None


def _read_json(path: Path, why: str) -> dict[str, Any]:
    if (problem := file_kind_problem(path)) is not None:
        raise InputError(f"{path}: {problem}; {why}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError([Problem(str(path), exc.lineno, "json", f"invalid JSON ({exc.msg})")]) from None


def _load_metrics(path: Path) -> dict[str, tuple[int, _MetricsRow]]:
    problems: list[Problem] = []
    rows: dict[str, tuple[int, _MetricsRow]] = {}
    for lineno, obj in iter_jsonl(path):
        row = _validate(_MetricsRow, obj, str(path), lineno, "", problems)
        if row is None:
            continue
        if row.task_id in rows:
            problems.append(
                Problem(
                    str(path),
                    lineno,
                    "task_id",
                    f"duplicate task {row.task_id!r} (first on line {rows[row.task_id][0]})",
                )
            )
        rows[row.task_id] = (lineno, row)
    if problems:
        raise InputError(problems)
    return rows


def _check_same_run(run_dir: Path, metrics: Path) -> None:
    """Metrics kept in another run folder must come from the same config and data."""
    other = metrics.parent
    if other.resolve() == run_dir.resolve():
        return
    for name in ("config.json", "run.json"):
        mine, theirs = run_dir / name, other / name
        if theirs.is_file() and (not mine.is_file() or mine.read_bytes() != theirs.read_bytes()):
            raise InputError(
                f"{metrics}: comes from another run ({theirs} differs from {mine}); "
                "pass the metrics.jsonl written with these trajectories"
            )


def _write_new_file(out: Path, lines) -> None:
    """Write ``lines`` to a temporary sibling and rename it to ``out`` only when all went well,
    so a failed export leaves nothing behind and never replaces an existing file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    # Not mkstemp: its 0600 mode would survive the rename; "x" keeps the umask's mode.
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "x", encoding="utf-8", newline="\n") as fh:
            fh.writelines(line + "\n" for line in lines)
        if out.exists():
            raise InputError(f"{out}: output file appeared while writing; nothing was written")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def export_sft(
    trajectories: str | Path, metrics: str | Path, role: str, out: str | Path, min_f1: float | None = None
) -> ExportReport:
    """Write the SFT rows of ``role`` from a run's trajectories to the new file ``out``.

    See the module docstring for the row format, the skip reasons and the refusals. Raises
    ``InputError`` (nothing written) on bad input.
    """
    trajectories, metrics, out = Path(trajectories), Path(metrics), Path(out)
    if role not in CALL_ROLES:
        raise InputError(f"--role {role!r}: expected one of {', '.join(CALL_ROLES)}")
    if out.exists():
        raise InputError(f"{out}: output file already exists; choose a new file (nothing was written)")
    run_dir = trajectories.parent
    config = _read_json(
        run_dir / "config.json",
        f"export-sft reads the run config written by `memsearch eval` next to {trajectories.name} "
        "(it says which memory mode produced the trajectories)",
    )
    mode = config.get("agent", {}).get("memory")
    if role == "memory" and not (mode in MEMORY_MODES and MEMORY_MODES.get(mode).operations):
        raise InputError(
            f"{run_dir / 'config.json'}: agent.memory is {mode!r}; memory-role SFT rows need a "
            "decision-mode run, because summary and overwrite outputs are rewritten notes, "
            "not memory operation batches"
        )
    backend = config.get("backends", {}).get(role, {}).get("kind")
    run_info = _read_json(
        run_dir / "run.json",
        f"export-sft reads the run record written by `memsearch eval` next to "
        f"{trajectories.name} (it says which data split the run used)",
    )
    split = run_info.get("data", {}).get("split")
    if split != "train":
        # Training rows from dev questions would leak the evaluation set into the policy.
        raise InputError(
            f"{run_dir / 'run.json'}: data split is {split!r}; SFT rows come from a run on a train "
            "split only (docs/design.md §9); nothing was written"
        )
    _check_same_run(run_dir, metrics)
    metric_rows = _load_metrics(metrics)
    report = ExportReport(out=out, role=role, min_f1=min_f1)
    problems: list[Problem] = []
    seen: dict[str, int] = {}

    def checked(obj: Any, where: tuple[str, int]) -> Trajectory | None:
        """The line as a trajectory, or ``None`` with its problems added (module doc)."""
        line = _validate(_Trajectory, obj, *where, "", problems)
        if line is None:
            return None
        before = len(problems)
        for i, event in enumerate(line.events):
            if event.type == EventKind.POLICY_CALL and event.role == role:
                _validate(_PolicyCall, event.model_dump(), *where, f"events.{i}", problems)
        if len(problems) > before:
            return None
        try:
            return Trajectory.from_json(obj)
        except (ValueError, TypeError) as exc:
            problems.append(Problem(*where, "events", str(exc)))
            return None

    def rows():
        for lineno, obj in iter_jsonl(trajectories):
            where = (str(trajectories), lineno)
            traj = checked(obj, where)
            if traj is None:
                continue
            calls = traj.policy_calls([role])
            # what the memory cited when each memory call was made (decision mode records it)
            held = {e.step: list(e.sources_before) for e in traj.memory_events if e.sources_before is not None}
            task = traj.task_id
            if task in seen:
                problems.append(Problem(*where, "task_id", f"duplicate task {task!r} (first on line {seen[task]})"))
                continue
            seen[task] = lineno
            if task not in metric_rows:
                problems.append(
                    Problem(
                        *where,
                        "task_id",
                        f"task {task!r} has no row in {metrics}; "
                        "pass the metrics.jsonl written with these trajectories",
                    )
                )
                continue
            mline, mrow = metric_rows[task]
            if (mrow.prediction, mrow.status) != (traj.prediction, traj.status):
                problems.append(
                    Problem(
                        *where,
                        "task_id",
                        f"task {task!r}: its metrics row ({metrics}:{mline}) does "
                        "not match this trajectory (prediction or status): metrics from another run?",
                    )
                )
                continue
            report.tasks += 1
            if traj.status != "ok":
                report.skipped["task_status"] += len(calls)
                continue
            if min_f1 is not None and mrow.f1 < min_f1:
                report.skipped["below_min_f1"] += len(calls)
                continue
            report.tasks_kept += 1
            for call in calls:
                reason = (
                    "request_error"
                    if call.error is not None
                    else "invalid"
                    if call.valid is not True
                    else "truncated"
                    if call.finish_reason == "length"
                    else None
                )
                if reason:
                    report.skipped[reason] += 1
                    continue
                report.exported += 1
                row = {
                    "messages": [dict(m) for m in call.messages],
                    "completion": call.text,
                    "task_id": task,
                    "role": role,
                    "step": call.step,
                    "source": {
                        "run": str(run_dir),
                        "group": traj.run_label,
                        "backend": backend,
                        "memory_mode": mode,
                        "split": split,
                    },
                    # what the memory cited when the call was made (module doc); memory rows only
                    **({"memory_sources": held[call.step]} if role == "memory" and call.step in held else {}),
                }
                yield mline, dumps_line(row)
        # Checked inside the writer so that a bad line anywhere leaves no output behind.
        if problems:
            raise InputError(problems)
        if not report.exported:
            raise InputError(
                f"{trajectories}: nothing to export for role {role!r} ("
                + "; ".join(report.lines()[1:])
                + "); nothing was written"
            )

    # sorted() consumes every row (and raises on any problem) before a byte is written; it is
    # stable, so a task's calls keep their step order.
    ordered = sorted(rows(), key=lambda numbered: numbered[0])
    _write_new_file(out, (line for _, line in ordered))
    return report
