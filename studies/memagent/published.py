"""The training verdict of a published MemAgent run, re-derived from its committed train log.

    uv run python -m studies.memagent.published docs/results/memagent_cpu

A results folder of ``memsearch pipeline memagent`` (docs/results/memagent_cpu) holds the run's
``report.md``, ``rewards.md`` and the GRPO stage's ``train_log.jsonl``. ``rederive`` runs the
pipeline's own ``reward_summary`` on that log (as the pipeline does on ``OUT/train``) and
``claims`` reads what ``report.md`` states of it: the number of steps, the mean reward at the first
and the last step, and whether it reported no learning signal (every group of every step with
one reward for all its rollouts) with its largest gradient norm. The per-N comparison table of
the report is not re-derived: its evaluation runs' summaries and per-question metrics were not
published.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from memsearch.errors import InputError

_TRAINING = re.compile(r"(\d+) GRPO steps, mean reward (-?[\d.]+) at step 1, (-?[\d.]+) at the last step")
_NO_SIGNAL = re.compile(r"NO LEARNING SIGNAL: in all (\d+) steps .*\(largest gradient norm (-?[\d.]+)\)")


def rederive(folder: str | Path) -> dict[str, Any]:
    """``reward_summary`` of the folder's ``train_log.jsonl`` and the ``rewards.md`` it writes."""
    from memsearch.pipelines.memagent.pipeline import reward_summary

    log = Path(folder) / "train_log.jsonl"
    if not log.is_file():
        raise InputError(f"{log}: missing (a published MemAgent run keeps its GRPO train log)")
    with tempfile.TemporaryDirectory() as tmp:
        # the pipeline reads OUT/train/train_log.jsonl and names that folder in rewards.md
        (Path(tmp) / "train").mkdir()
        shutil.copyfile(log, Path(tmp) / "train" / "train_log.jsonl")
        (Path(tmp) / "out").mkdir()
        rewards = reward_summary(Path(tmp) / "train", Path(tmp) / "out")
        rewards["rewards_md"] = (Path(tmp) / "out" / "rewards.md").read_text(encoding="utf-8")
    rewards["no_learning_signal"] = bool(rewards["steps"]) and rewards["no_signal_steps"] == rewards["steps"]
    return rewards


def claims(folder: str | Path) -> dict[str, Any]:
    """What the folder's ``report.md`` states about training (module doc)."""
    path = Path(folder) / "report.md"
    if not path.is_file():
        raise InputError(f"{path}: missing")
    text = path.read_text(encoding="utf-8")
    training = _TRAINING.search(text)
    if training is None:
        raise InputError(f"{path}: no 'Training reward' statement (N GRPO steps, mean reward ...)")
    no_signal = _NO_SIGNAL.search(text)
    return {"steps": int(training.group(1)), "first": float(training.group(2)), "last": float(training.group(3)),
            "no_learning_signal": no_signal is not None,
            "grad_norm_max": float(no_signal.group(2)) if no_signal else None}


def agrees(folder: str | Path) -> list[str]:
    """Where the re-derived figures and the report's statements differ (empty: they agree)."""
    derived, stated = rederive(folder), claims(folder)
    problems = [f"{key}: report.md {stated[key]!r}, train log {derived[key]!r}"
                for key in ("steps", "no_learning_signal") if stated[key] != derived[key]]
    problems += [f"{key}: report.md {stated[key]:.4f}, train log {derived[key]:.4f}" for key in ("first", "last")
                 if round(derived[key], 4) != stated[key]]
    if stated["no_learning_signal"] and stated["grad_norm_max"] != derived["grad_norm_max"]:
        problems.append(f"largest gradient norm: report.md {stated['grad_norm_max']}, "
                        f"train log {derived['grad_norm_max']}")
    rewards_md = Path(folder) / "rewards.md"
    if rewards_md.is_file() and rewards_md.read_text(encoding="utf-8") != derived["rewards_md"]:
        problems.append(f"{rewards_md}: not the table the train log gives")
    return problems


def main(argv: list[str]) -> int:
    """``python -m studies.memagent.published FOLDER``: the re-derived verdict and whether the report states it."""
    if len(argv) != 1:
        print("usage: python -m studies.memagent.published FOLDER", file=sys.stderr)
        return 2
    try:
        derived, problems = rederive(argv[0]), agrees(argv[0])
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    verdict = "NO LEARNING SIGNAL" if derived["no_learning_signal"] else "some step had a learning signal"
    print(f"{derived['steps']} GRPO steps, mean reward {derived['first']:.4f} at step 1, {derived['last']:.4f} at "
          f"the last; {verdict} (largest gradient norm {derived['grad_norm_max']})")
    print("report.md and rewards.md state the same" if not problems else "\n".join(problems))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
