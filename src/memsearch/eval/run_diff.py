"""Paired comparison of two matrix runs group by group: an ablation against its control.

    from memsearch.eval.run_diff import matrix_minus_control

    diff = matrix_minus_control("runs/abl/seed-1/matrix", "runs/control/seed-1/matrix", ["C", "D"])
    diff["D"]["memory_support_recall"]["diff"]   # mean over questions of (ablation - control)

A control run differs from its ablation in one config field, and both score the same held-out
questions, so each group's metric is compared question by question with the paired bootstrap
(``memsearch.eval.bootstrap``). Two runs that did not score the same questions are refused: an
unpaired comparison would mix question difficulty into the difference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memsearch.errors import InputError
from memsearch.io import file_kind_problem
from memsearch.records.metrics_row import MetricsRow, read_metrics

DIFF_METRICS = ("searches", "memory_support_recall", "retrieval_support_recall", "f1", "em")


def per_task_metrics(path: str | Path) -> dict[str, MetricsRow]:
    """A run's per-question metrics by task id, from its ``metrics.jsonl`` (``.gz`` as published)."""
    path = Path(path)
    if not path.is_file() and path.with_name(path.name + ".gz").is_file():
        path = path.with_name(path.name + ".gz")
    if (problem := file_kind_problem(path, "a run's metrics.jsonl")) is not None:
        raise InputError(f"{path}: {problem}; expected a run's per-question metrics")
    return {row.task_id: row for row in read_metrics(path)}


def paired_difference(
    base_rows: dict[str, MetricsRow],
    trained_rows: dict[str, MetricsRow],
    metric: str,
    resamples: int,
    confidence: float,
    seed: int,
) -> dict[str, Any] | None:
    """Trained minus base on ``metric`` with a paired bootstrap CI, over the questions both runs
    scored (a question whose metric is ``None`` in either run is left out of both); ``None``
    when no question is shared."""
    from memsearch.eval.bootstrap import paired_bootstrap

    common = [
        t
        for t in base_rows
        if t in trained_rows and base_rows[t].column(metric) is not None and trained_rows[t].column(metric) is not None
    ]
    if not common:
        return None
    result = paired_bootstrap(
        [trained_rows[t].column(metric) for t in common],
        [base_rows[t].column(metric) for t in common],
        n_resamples=resamples,
        seed=seed,
        confidence=confidence,
    )
    return {k: result[k] for k in ("mean_a", "mean_b", "diff", "ci_low", "ci_high", "p_value", "n", "confidence")}


def _rows(folder: Path) -> dict[str, MetricsRow]:
    return per_task_metrics(folder / "metrics.jsonl")


def matrix_minus_control(run: str | Path, control: str | Path, groups: list[str],
                         metrics: tuple[str, ...] = DIFF_METRICS, resamples: int = 10_000,
                         seed: int = 0) -> dict[str, dict[str, Any]]:
    """Per group and metric, the paired bootstrap of ``run - control`` over the questions both scored.

    A question whose metric is missing (``None``) in either run is left out of that metric, and
    ``n`` says how many were compared."""
    from memsearch.eval.bootstrap import paired_bootstrap

    out: dict[str, dict[str, Any]] = {}
    for group in groups:
        a, b = _rows(Path(run) / group), _rows(Path(control) / group)
        if sorted(a) != sorted(b):
            only_a, only_b = len(set(a) - set(b)), len(set(b) - set(a))
            raise InputError(f"group {group}: the runs scored different questions ({only_a} only in {run}, "
                             f"{only_b} only in {control}); a paired comparison needs the same ones")
        out[group] = {}
        for metric in metrics:
            ids = [t for t in sorted(a) if a[t].column(metric) is not None and b[t].column(metric) is not None]
            if not ids:
                raise InputError(f"group {group}: no question has {metric!r} in both runs")
            out[group][metric] = paired_bootstrap([a[t].column(metric) for t in ids],
                                                  [b[t].column(metric) for t in ids], n_resamples=resamples, seed=seed)
    return out
