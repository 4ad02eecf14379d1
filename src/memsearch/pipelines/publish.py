"""Copy the record of a ``memsearch pipeline memory-policy`` run into a results folder of the
repository (``docs/results/memory_policy_cpu/``), so the figures a write-up quotes sit beside
the files they come from. Nothing is computed or typed here: every file is the run's own.

    uv run python scripts/publish_mp_results.py runs/mp-cpu docs/results/memory_policy_cpu

What is copied (when present): ``report.md``, ``report.json``, ``curves.png``,
``heldout/summary.json`` as ``summary.json``, ``invocations.jsonl`` (every resolved config the
run was started with), the stage records (``*.stage.json``), each trainer's ``train_log.jsonl``
and ``config.json``, and each held-out run's ``summary.json`` and ``metrics.jsonl`` (per question,
so the paired differences can be recomputed). Trajectories, checkpoints and weights stay in the run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from memsearch.errors import InputError

_TOP = ("report.md", "report.json", "curves.png", "invocations.jsonl")
_TRAINER_FILES = ("train_log.jsonl", "config.json")
_RUN_FILES = ("summary.json", "metrics.jsonl", "config.json")


def publish_results(run: str | Path, dest: str | Path) -> list[Path]:
    """Copy the run's record into ``dest`` (relative layout kept); returns the files written."""
    run, dest = Path(run), Path(dest)
    if not (run / "heldout" / "summary.json").is_file():
        raise InputError(f"{run / 'heldout' / 'summary.json'}: missing; publish a pipeline run whose held-out "
                         "comparison has been written")
    pairs = [(run / name, dest / name) for name in _TOP]
    pairs.append((run / "heldout" / "summary.json", dest / "summary.json"))
    pairs += [(p, dest / p.relative_to(run)) for p in sorted(run.rglob("*.stage.json"))]
    for trainer in ("sft", "grpo1", "sft2", "grpo2"):
        for seed in sorted(run.glob("seed-*")):
            pairs += [(seed / trainer / f, dest / seed.name / trainer / f) for f in _TRAINER_FILES]
    for held in (
        sorted(run.glob("heldout/*/")) + sorted(run.glob("seed-*/heldout/*/")) + sorted(run.glob("seed-*/matrix/*/"))
    ):
        pairs += [(held / f, dest / held.relative_to(run) / f) for f in _RUN_FILES]
    written = []
    for src, dst in pairs:
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            written.append(dst)
    return written
