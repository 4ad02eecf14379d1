"""A held-out comparison read back from its folder, and re-derived from its per-question metrics.

A folder is a results folder (``docs/results/memory_policy_cpu_v3``: the comparison published as
``summary.json``) or a pipeline run folder (``runs/mp-v3``: ``heldout/summary.json``). Each
policy's per-question metrics sit at the same relative path in both (``heldout/{base,rules}/``,
``seed-N/heldout/{sft,grpo}/``, as ``metrics.jsonl`` or the published ``metrics.jsonl.gz``), so
``rederive`` recomputes every paired difference with the pipeline's own code
(``heldout.paired_differences``) and each row's metric means, and keeps what only the summary
records (memory calls by op and cause, per-decision rates: the trajectories they were counted
from are not published). The bootstrap's seed is the run's ``report.seed`` (its last invocation in
``invocations.jsonl``; the pipeline's default where a folder has none); resamples and confidence
are the summary's own.

Invalid memory calls: a summary counts them per cause code (``heldout.INVALID_KEYS``); one written
before counted them in the four groups of the study's tables. ``group_invalid`` maps either to
those groups (``HELDOUT_GROUPS``), so old and new summaries give the same table.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from memsearch.errors import InputError
from memsearch.eval.run_diff import per_task_metrics
from memsearch.io import iter_jsonl
from memsearch.pipelines.config import PipelineReport
from memsearch.pipelines.memory_policy.heldout import SHARED, paired_differences

HELDOUT_GROUPS = ("over_budget", "truncated", "unshown_source", "other")
# The row metrics a bar or a table reads, recomputed as the mean over the questions that have one
# (memory support precision is undefined for a question whose memory cites nothing).
ROW_METRICS = ("memory_support_recall", "memory_support_precision", "retrieval_support_recall", "f1", "em")


def group_invalid(invalid: dict[str, int]) -> dict[str, int]:
    """A row's invalid memory calls in ``HELDOUT_GROUPS``: over the budget, cut at the token limit,
    citing an unshown source, everything else. Idempotent, so a summary that already counted in
    these groups reads as it was written."""
    groups = dict.fromkeys(HELDOUT_GROUPS, 0)
    for key, count in invalid.items():
        groups[key if key in HELDOUT_GROUPS else "other"] += count
    return groups


def summary_path(folder: str | Path) -> Path:
    """The comparison of a results folder (``summary.json``) or of a run folder (``heldout/summary.json``)."""
    folder = Path(folder)
    for path in (folder / "summary.json", folder / "heldout" / "summary.json"):
        if path.is_file():
            return path
    raise InputError(f"{folder}: no summary.json or heldout/summary.json (a held-out comparison of "
                     "`memsearch pipeline memory-policy`, run or published)")


def read_summary(folder: str | Path) -> dict[str, Any]:
    """The held-out comparison as its folder holds it (a ``bar`` key where an old pipeline wrote one)."""
    path = summary_path(folder)
    summary = json.loads(path.read_text(encoding="utf-8"))
    if "policies" not in summary or "per_seed" not in summary:
        raise InputError(f"{path}: not a held-out comparison (no policies / per_seed)")
    return summary


def bootstrap_seed(folder: str | Path) -> int:
    """The run's ``report.seed`` from its last recorded invocation, else the pipeline's default."""
    path = Path(folder) / "invocations.jsonl"
    records = [record for _, record in iter_jsonl(path)] if path.is_file() else []
    report = (records[-1].get("config") or {}).get("report") or {} if records else {}
    return int(report.get("seed", PipelineReport().seed))


def run_folders(folder: str | Path, summary: dict[str, Any]) -> tuple[dict[str, Path], dict[str, dict[str, Path]]]:
    """``(shared, seeds)``: the run folder of every row of ``summary`` under ``folder``."""
    root = Path(folder)
    shared = {p: root / "heldout" / p for p in SHARED}
    seeds = {s: {p: root / f"seed-{s}" / "heldout" / p for p in rows}
             for s, rows in summary["policies"]["seeds"].items()}
    return shared, seeds


def _means(run: Path) -> dict[str, float | None]:
    rows = per_task_metrics(run / "metrics.jsonl").values()
    out = {}
    for metric in ROW_METRICS:
        values = [r.column(metric) for r in rows if r.column(metric) is not None]
        out[metric] = sum(values) / len(values) if values else None
    return out


def rederive(folder: str | Path) -> dict[str, Any]:
    """The comparison of ``folder`` recomputed from its per-question metrics (module doc): the
    summary's shape, with ``per_seed``, ``over_seeds`` and each row's ``ROW_METRICS`` derived
    again, every other field as the summary holds it (an old ``bar`` record is left out)."""
    summary = read_summary(folder)
    shared_dirs, seed_dirs = run_folders(folder, summary)
    usable = {s: all(r["usable_for_comparison"] for r in {**summary["policies"]["shared"], **rows}.values()
                     if r is not None)
              for s, rows in summary["policies"]["seeds"].items()}
    per_seed, over = paired_differences(shared_dirs, seed_dirs, usable, summary["resamples"], summary["confidence"],
                                        bootstrap_seed(folder))
    out = {k: copy.deepcopy(v) for k, v in summary.items() if k != "bar"}
    out["per_seed"], out["over_seeds"] = per_seed, over
    for policy, row in out["policies"]["shared"].items():
        row.update(_means(shared_dirs[policy]))
    for seed, rows in out["policies"]["seeds"].items():
        for policy, row in rows.items():
            row.update(_means(seed_dirs[seed][policy]))
    return out
