"""Paired comparison of two runs on the same tasks: per-task deltas and the changed sets.

Delta is B minus A, task by task, over the tasks both runs scored. A *regression* is a task A
got right and B wrong by exact match (``em`` 1 then 0); an *improvement* the reverse. These sets
are what the page's ``#filter=regressions`` / ``#filter=improvements`` select, so they are
computed once, here, and tested against hand-computed values.
"""

from __future__ import annotations

from typing import Any

DELTA_METRICS = ("em", "f1", "sub_em")


def compare_runs(tasks_a: list[dict[str, Any]], tasks_b: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-task ``B - A`` deltas, mean deltas, and the regression / improvement task ids (A's order)."""
    by_b = {t["task_id"]: t for t in tasks_b}
    common = [t for t in tasks_a if t["task_id"] in by_b]
    deltas: dict[str, dict[str, float]] = {}
    regressions, improvements = [], []
    for a in common:
        b = by_b[a["task_id"]]
        deltas[a["task_id"]] = {k: round(b[k] - a[k], 6) for k in DELTA_METRICS}
        if a["em"] == 1.0 and b["em"] == 0.0:
            regressions.append(a["task_id"])
        elif a["em"] == 0.0 and b["em"] == 1.0:
            improvements.append(a["task_id"])
    n = len(common)
    mean = {k: round(sum(d[k] for d in deltas.values()) / n, 6) if n else None for k in DELTA_METRICS}
    return {"n": n, "only_a": len(tasks_a) - n, "only_b": len(tasks_b) - n, "mean_delta": mean, "deltas": deltas,
            "regressions": regressions, "improvements": improvements}
