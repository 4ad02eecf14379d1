"""Training curves for the report's training view, from one or more ``train_log.jsonl`` files.

Several logs (seeds of one recipe) become one band per metric: the page draws their mean and
the min-max range over the logs at each step.

Lines are read as the JSON they are, not as ``records.train_step.TrainStep``: every numeric key
is a curve (an SFT log's fields, or keys a newer trainer adds, too), and a null value is a gap at
its step where an absent key is no point, a difference a ``TrainStep`` does not keep.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from memsearch.errors import InputError, Problem
from memsearch.io import iter_jsonl

# What a researcher looks at first, in this order; any other numeric key follows, sorted.
# failed_trajectories: episodes with a request error, left out of the update (train.grpo.failures).
PREFERRED = ("reward_mean", "reward_std", "zero_variance_groups", "invalid_rate", "failed_trajectories",
             "decision_entropy", "op_share/ADD", "op_share/UPDATE", "op_share/DELETE", "op_share/NOOP",
             "op_share/invalid_parse", "op_share/invalid_budget", "op_share/invalid_rule", "kl", "clip_fraction",
             "rows_generated", "rows_consumed", "loss", "entropy", "grad_norm")


def with_op_shares(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` plus ``op_share/NAME``: each bucket of its op histogram (``ops``, train.grpo.decisions)
    as a share of the step's ops and invalid calls (absent when the step has none)."""
    ops = record.get("ops")
    if not isinstance(ops, dict):
        return record
    total = sum(v for v in ops.values() if isinstance(v, (int, float)))
    if not total:
        return record
    return {**record, **{f"op_share/{k}": v / total for k, v in ops.items() if isinstance(v, (int, float))}}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _line_problems(path: Path, lineno: int, record: Any) -> list[Problem]:
    """What makes one log line unusable for a curve: not an object, a step that is not an integer,
    a number that is not finite (JSON's NaN/Infinity, which the page cannot draw nor the payload hold)."""
    if not isinstance(record, dict):
        return [Problem(str(path), lineno, "record", f"got {type(record).__name__}, expected a JSON object per step")]
    problems = []
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        problems.append(Problem(str(path), lineno, "step", f"got {step!r:.40}, expected an integer step number"))
    ops = record.get("ops")
    numbers = list(record.items()) + ([(f"ops.{k}", v) for k, v in ops.items()] if isinstance(ops, dict) else [])
    problems.extend(Problem(str(path), lineno, key, f"got {value!r}, expected a finite number")
                    for key, value in numbers if _is_number(value) and not math.isfinite(value))
    return problems


def _read_logs(logs: list[Path]) -> tuple[list[list[dict[str, Any]]], set[str]]:
    """Each log's records (with op shares) and the metric keys: those holding a number at some
    step. Every unusable line (see ``_line_problems``, or a metric holding something else than a
    number or null) raises, all in one ``InputError``: a curve drawn around a bad record would
    misplace or drop its points silently, and a traceback names neither file nor line."""
    problems: list[Problem] = []
    read = []
    for path in map(Path, logs):
        lines = []
        for lineno, record in iter_jsonl(path):
            found = _line_problems(path, lineno, record)
            problems.extend(found)
            if not found:
                lines.append((path, lineno, with_op_shares(record)))
        read.append(lines)
    keys = {k for lines in read for _, _, r in lines for k, v in r.items() if k != "step" and _is_number(v)}
    problems.extend(Problem(str(path), lineno, k, f"got {r[k]!r:.40}, expected a number (as at other steps) or null")
                    for lines in read for path, lineno, r in lines
                    for k in sorted(keys & r.keys()) if r[k] is not None and not _is_number(r[k]))
    if problems:
        raise InputError(problems)
    return [[r for _, _, r in lines] for lines in read], keys


def training_series(logs: list[Path]) -> dict[str, Any]:
    """``{"logs": [names], "order": [keys], "metrics": {key: {"steps": [...], "values": [[per log] per step]}}}``;
    a log without a value at a step holds ``None`` there. A malformed log raises ``InputError``
    naming each bad file, line and field."""
    records, keys = _read_logs(logs)
    ordered = [k for k in PREFERRED if k in keys] + sorted(k for k in keys if k not in PREFERRED)
    metrics = {}
    for key in ordered:
        per_log = [{r["step"]: r[key] for r in recs if key in r} for recs in records]
        steps = sorted({s for d in per_log for s in d})
        metrics[key] = {"steps": steps, "values": [[d.get(s) for d in per_log] for s in steps]}
    # "order" is explicit: the payload's JSON has sorted keys, so the dict's order does not survive.
    return {"logs": [str(Path(p).parent.name or Path(p).name) for p in logs], "order": ordered, "metrics": metrics}
