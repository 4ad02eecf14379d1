"""The record of a validation pilot: every greedy evaluation of a GRPO stage and reference runs on
the same validation questions, in one JSON object (docs/results/memory_policy_cpu_v2/ and _v3/
hold such records).

    uv run python -m studies.memory_policy.pilot runs/mp-v2-p3b/seed-1/grpo1 --data runs/mp-v2-p3b/prepare/val \
        --reference rules=runs/val-rules --out docs/results/memory_policy_cpu_v2/pilot3b_validation.json

A pilot chooses a recipe before any held-out number exists, so what it read must be checkable:
this collects, per evaluation, the figures the pilots' tables quote (memory support recall and
precision, F1, executed ops) and the per-call decision rates (``heldout.decision_rates``: gold
kept, junk, overflows, stores in gold calls vs the others), and refuses runs of different
questions (the same data manifest and the same number of questions, since ``limit`` takes the
first N), so no row of a table compares other questions. The command refuses an existing
``--out`` (nothing is overwritten).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from memsearch.errors import InputError
from memsearch.pipelines.memory_policy.heldout import METRICS, decision_rates, gold_facts, memory_calls
from memsearch.records.run_summary import RunSummary


def run_record(run: Path, gold: dict[str, set[str]]) -> dict[str, Any]:
    """One evaluation run's figures (module doc); ``run`` holds summary.json and trajectories.jsonl."""
    summary_path = Path(run) / "summary.json"
    if not summary_path.is_file():
        raise InputError(f"{run}: no summary.json (an evaluation that has not finished)")
    summary = RunSummary.read(summary_path)
    if not summary.complete:
        raise InputError(f"{summary_path}: the evaluation is incomplete ({summary.tasks.to_json()})")
    return {"data_manifest_sha256": summary.data["manifest_sha256"], "tasks": summary.tasks.expected,
            "metrics": {m: summary.metrics.get(m) for m in METRICS},
            "memory_calls": memory_calls(Path(run)), "decisions": decision_rates(Path(run), gold)}


def pilot_record(stage: Path, data: Path, references: dict[str, Path]) -> dict[str, Any]:
    """Every evaluation under ``stage``/eval (``grpo1_step_N``) and each named reference run, read
    against the labels of the validation ``data`` they all ran on."""
    gold = gold_facts(Path(data))
    runs = {f"{Path(stage).name}_step_{int(p.name.removeprefix('step-'))}": p
            for p in sorted((Path(stage) / "eval").glob("step-*")) if (p / "summary.json").is_file()}
    if not runs:
        raise InputError(f"{stage}/eval: no finished evaluation (step-NNNNNN/summary.json)")
    record = {name: run_record(path, gold) for name, path in {**runs, **references}.items()}
    questions = {name: (r["data_manifest_sha256"][:12], r["tasks"]) for name, r in record.items()}
    if len(set(questions.values())) != 1:
        raise InputError(f"the runs evaluated different questions ((data manifest, questions): {questions})")
    return record


def main(argv: list[str] | None = None) -> int:
    """``python -m studies.memory_policy.pilot STAGE --data DIR [--reference NAME=RUN ...] --out FILE``."""
    parser = argparse.ArgumentParser(description="Write a validation pilot's record (studies.memory_policy.pilot).")
    parser.add_argument("stage", type=Path, help="a GRPO stage folder of a pipeline run (RUN/seed-N/grpo1)")
    parser.add_argument("--data", type=Path, required=True, help="the prepared validation data (RUN/prepare/val)")
    parser.add_argument("--reference", action="append", default=[], metavar="NAME=RUN",
                        help="an evaluation run on the same questions (e.g. rules=runs/val-rules); repeatable")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write (must not exist)")
    args = parser.parse_args(argv)
    try:
        references = {}
        for item in args.reference:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise InputError(f"--reference {item!r}: expected NAME=RUN_FOLDER")
            references[name] = Path(path)
        if args.out.exists():
            raise InputError(f"{args.out} exists; choose another --out (a pilot record is never overwritten)")
        record = pilot_record(args.stage, args.data, references)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}: {', '.join(record)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
