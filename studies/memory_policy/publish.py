"""Copy the record of a ``memsearch pipeline memory-policy`` run into a results folder of the
repository (``docs/results/memory_policy_cpu/``), so the figures a write-up quotes sit beside
the files they come from. Nothing is computed or typed here: every file is the run's own.

    uv run python -m studies.memory_policy.publish runs/mp-cpu docs/results/memory_policy_cpu

What a reader needs to check each claim, nothing more (docs/design.md §11): ``report.md``,
``report.json``, ``curves.png``, ``heldout/summary.json`` as ``summary.json``,
``invocations.jsonl`` (every resolved config the run was started with), each trainer's
``train_log.jsonl`` (the curves), a GRPO stage's ``collapse.json`` where the collapse guard
stopped it (the evidence behind the report's "Stages the collapse guard stopped"), and each
held-out and matrix run's per-question metrics as ``metrics.jsonl.gz`` (gzip, mtime 0: the same
run gives the same bytes), from which every paired difference can be recomputed
(``studies.memory_policy.published`` re-derives the held-out comparison from them;
``studies.memory_policy.compare_matrix_runs`` and ``memsearch.eval.run_diff`` read them). Stage
records, per-run configs and summaries (the report and summary.json hold them), trajectories,
checkpoints and weights stay in the run.
"""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

from memsearch.errors import InputError

_TOP = ("report.md", "report.json", "curves.png", "invocations.jsonl")


def publish_results(run: str | Path, dest: str | Path) -> list[Path]:
    """Copy the run's record into ``dest`` (relative layout kept); returns the files written."""
    run, dest = Path(run), Path(dest)
    if not (run / "heldout" / "summary.json").is_file():
        raise InputError(f"{run / 'heldout' / 'summary.json'}: missing; publish a pipeline run whose held-out "
                         "comparison has been written")
    pairs = [(run / name, dest / name) for name in _TOP]
    pairs.append((run / "heldout" / "summary.json", dest / "summary.json"))
    for trainer in ("sft", "grpo1", "sft2", "grpo2"):
        for seed in sorted(run.glob("seed-*")):
            pairs.append((seed / trainer / "train_log.jsonl", dest / seed.name / trainer / "train_log.jsonl"))
            pairs.append((seed / trainer / "collapse.json", dest / seed.name / trainer / "collapse.json"))
    held = sorted(run.glob("heldout/*/")) + sorted(run.glob("seed-*/heldout/*/")) + sorted(run.glob("seed-*/matrix/*/"))
    pairs += [(h / "metrics.jsonl", dest / h.relative_to(run) / "metrics.jsonl.gz") for h in held]
    written = []
    for src, dst in pairs:
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.suffix == ".gz":
                dst.write_bytes(gzip.compress(src.read_bytes(), compresslevel=9, mtime=0))
            else:
                shutil.copyfile(src, dst)
            written.append(dst)
    return written


def main(argv: list[str]) -> int:
    """``python -m studies.memory_policy.publish RUN DEST``."""
    if len(argv) != 2:
        print("usage: python -m studies.memory_policy.publish RUN DEST", file=sys.stderr)
        return 2
    try:
        written = publish_results(argv[0], argv[1])
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(written)} files written under {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
