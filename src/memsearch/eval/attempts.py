"""Failed tasks run again on ``--resume``, and their failed attempts are kept (docs/design.md §10).

A task whose trajectory says ``status != "ok"`` (a request error after the backend's retries, a
crash) is not finished: a server outage must not leave a run that ``--resume`` can never
complete. On resume, ``supersede_failed`` moves each failed task's line out of
``trajectories.jsonl`` into ``failed_attempts.jsonl`` (appended, never rewritten), and the task
runs again; its new trajectory carries ``attempt`` (1 + the failed attempts on record), so
nothing is lost and ``trajectories.jsonl`` keeps one line per task.

Order, so a kill at any point loses nothing: the failed lines are appended to
``failed_attempts.jsonl`` and synced first, then ``trajectories.jsonl`` is replaced whole
(``run_folder.replacing``) by its other lines, byte for byte. A kill between the two leaves the
failed line in both files; the next resume finds that exact line already recorded and does not
record it twice.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from memsearch.eval.run_folder import FAILED_ATTEMPTS, replacing
from memsearch.records.trajectory import Trajectory

__all__ = ["FAILED_ATTEMPTS", "cut_torn_tail", "failed_attempt_counts", "supersede_failed"]


def cut_torn_tail(path: Path) -> bytes:
    """The file's bytes without a torn last line (a crash mid-write), which is cut off the file
    itself too, so appending continues from a clean line; ``b""`` for a missing file."""
    if not path.is_file():
        return b""
    raw = path.read_bytes()
    keep = raw if raw.endswith(b"\n") or not raw else raw[: raw.rfind(b"\n") + 1]
    if keep != raw:
        path.write_bytes(keep)
    return keep


def _task_id(line: bytes) -> Any:
    try:
        obj = json.loads(line)
    except ValueError:
        return None  # not ours to judge here: the line is kept as it is
    return obj.get("task_id") if isinstance(obj, dict) else None


def failed_attempt_counts(out: Path) -> Counter[str]:
    """Failed attempts on record in ``out/failed_attempts.jsonl``, by task id."""
    raw = cut_torn_tail(out / FAILED_ATTEMPTS)
    return Counter(tid for line in raw.splitlines() if isinstance(tid := _task_id(line), str))


def supersede_failed(out: Path, finished: dict[str, Trajectory]) -> list[str]:
    """Move the lines of the failed tasks among ``finished`` (``runner.read_finished`` of
    ``out/trajectories.jsonl``, already checked) to ``out/failed_attempts.jsonl`` (module doc);
    returns their task ids, in file order. Nothing is written when no task failed."""
    failed = {tid for tid, traj in finished.items() if not traj.ok}
    if not failed:
        return []
    traj_path, record = out / "trajectories.jsonl", out / FAILED_ATTEMPTS
    lines = cut_torn_tail(traj_path).splitlines(keepends=True)
    moved = [line for line in lines if _task_id(line) in failed]
    recorded = set(cut_torn_tail(record).splitlines(keepends=True))
    new = [line for line in moved if line not in recorded]
    if new:
        with open(record, "ab") as fh:
            fh.write(b"".join(new))
            fh.flush()
            os.fsync(fh.fileno())
    with replacing(traj_path) as tmp, open(tmp, "xb") as fh:
        fh.write(b"".join(line for line in lines if _task_id(line) not in failed))
        fh.flush()
        os.fsync(fh.fileno())
    return [tid for line in moved if isinstance(tid := _task_id(line), str)]
