"""Training curves for the report's training view, from one or more ``train_log.jsonl`` files.

Several logs (seeds of one recipe) become one band per metric: the page draws their mean and
the min-max range over the logs at each step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# What a researcher looks at first, in this order; any other numeric key follows, sorted.
PREFERRED = ("reward_mean", "reward_std", "zero_variance_groups", "invalid_rate", "decision_entropy",
             "op_share/ADD", "op_share/UPDATE", "op_share/DELETE", "op_share/NOOP", "op_share/invalid_parse",
             "op_share/invalid_budget", "op_share/invalid_rule", "kl", "clip_fraction", "rows_generated",
             "rows_consumed", "loss", "entropy", "grad_norm")


def with_op_shares(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` plus ``op_share/NAME``: each bucket of its op histogram (``ops``, train.decisions)
    as a share of the step's ops and invalid calls (absent when the step has none)."""
    ops = record.get("ops")
    if not isinstance(ops, dict):
        return record
    total = sum(v for v in ops.values() if isinstance(v, (int, float)))
    if not total:
        return record
    return {**record, **{f"op_share/{k}": v / total for k, v in ops.items() if isinstance(v, (int, float))}}


def training_series(logs: list[Path]) -> dict[str, Any]:
    """``{"logs": [names], "order": [keys], "metrics": {key: {"steps": [...], "values": [[per log] per step]}}}``;
    a log without a value at a step holds ``None`` there."""
    from memsearch.train.log import read_log

    records = [[with_op_shares(r) for r in read_log(Path(p))] for p in logs]
    keys: set[str] = set()
    for recs in records:
        for r in recs:
            keys.update(
                k for k, v in r.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
            )
    ordered = [k for k in PREFERRED if k in keys] + sorted(k for k in keys if k not in PREFERRED)
    metrics = {}
    for key in ordered:
        per_log = [{r["step"]: r[key] for r in recs if "step" in r and key in r} for recs in records]
        steps = sorted({s for d in per_log for s in d})
        metrics[key] = {"steps": steps, "values": [[d.get(s) for d in per_log] for s in steps]}
    # "order" is explicit: the payload's JSON has sorted keys, so the dict's order does not survive.
    return {"logs": [str(Path(p).parent.name or Path(p).name) for p in logs], "order": ordered, "metrics": metrics}
