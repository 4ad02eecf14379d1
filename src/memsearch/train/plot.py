"""The reward curve of a training run as a PNG (matplotlib, headless)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from memsearch.errors import InputError, InputValueError, Problem
from memsearch.io import iter_jsonl
from memsearch.records.train_step import TrainStep


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def curve_records(log_path: Path) -> list[TrainStep]:
    """The training steps of a log (the lines that have ``reward_mean``), each line checked first:
    a line that is not an object, a step that is not an integer, or a reward / std / invalid rate
    that is not a finite number raises one ``InputError`` naming every bad file, line and field
    (matplotlib would otherwise fail with a traceback naming neither, or draw a NaN as a gap)."""
    records: list[TrainStep] = []
    problems: list[Problem] = []
    for lineno, record in iter_jsonl(log_path):
        if not isinstance(record, dict):
            problems.append(Problem(str(log_path), lineno, "record", "expected a JSON object per step"))
            continue
        if "reward_mean" not in record:
            continue  # an evaluation-only record (step 0) or a record of another kind
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            problems.append(Problem(str(log_path), lineno, "step", f"got {step!r:.40}, expected an integer"))
        for key in ("reward_mean", "reward_std", "invalid_rate"):
            if (key in record or key == "reward_mean") and not _finite(record.get(key)):
                problems.append(Problem(str(log_path), lineno, key,
                                        f"got {record.get(key)!r:.40}, expected a finite number"))
        if not problems:  # a checked line reads as a record; after a bad one only the checks go on
            records.append(TrainStep.from_json(record))
    if problems:
        raise InputError(problems)
    return records


def plot_rewards(log_path: str | Path, png: str | Path, title: str | None = None,
                 records: list[TrainStep] | None = None) -> Path:
    """Mean reward per step with a ±1 std band (and the invalid-action rate on a second axis);
    ``records``: the log's ``curve_records`` when the caller has read them already."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = curve_records(Path(log_path)) if records is None else records
    if not records:
        raise InputValueError(f"{log_path}: no step records with reward_mean")
    steps = [r.step for r in records]
    mean = [r.reward_mean for r in records]
    std = [r.reward_std or 0.0 for r in records]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(steps, mean, marker="o", label="reward (mean over rollouts)")
    ax.fill_between(
        steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2, label="±1 std"
    )
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    if any(r.invalid_rate is not None for r in records):
        ax2 = ax.twinx()
        ax2.plot(
            steps, [r.invalid_rate or 0.0 for r in records], color="tab:red", linestyle="--", label="invalid rate"
        )
        ax2.set_ylabel("invalid-action rate", color="tab:red")
        ax2.set_ylim(0, 1)
    ax.set_title(title or str(Path(log_path).parent.name))
    ax.legend(loc="upper left")
    fig.tight_layout()
    png = Path(png)
    fig.savefig(png)
    plt.close(fig)
    return png
