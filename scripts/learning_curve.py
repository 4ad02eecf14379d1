"""Estimate from measured GRPO learning curves how much more training a win over a baseline would need.

    uv run python scripts/learning_curve.py runs/mp-v3/seed-*/grpo1/train_log.jsonl \
        --baseline runs/val-rules-x-v3 [--margin 0.03] [--metric memory_support_recall] [--out FILE.json]

Each train log is one seed's GRPO stage (its ``eval_*`` rows: greedy validation evaluations);
``--baseline`` is an evaluation run on the same validation questions (its summary.json). The fit,
its interval and what the numbers mean: memsearch.pipelines.memory_policy.learning_curve.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from memsearch.errors import InputError
    from memsearch.pipelines.memory_policy.learning_curve import describe, estimate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=Path, nargs="+", help="GRPO train logs (RUN/seed-N/grpo1/train_log.jsonl)")
    parser.add_argument("--baseline", type=Path, required=True,
                        help="an evaluation run on the validation questions (e.g. the rules heuristic's)")
    parser.add_argument("--metric", default="memory_support_recall", help="default: memory_support_recall")
    parser.add_argument("--margin", type=float, default=0.0,
                        help="lead over the baseline to reach (e.g. a held-out CI half-width); default 0")
    parser.add_argument("--out", type=Path, default=None, help="also write the estimate here (must not exist)")
    args = parser.parse_args(argv)
    try:
        summary_path = args.baseline / "summary.json"
        if not summary_path.is_file():
            raise InputError(f"{summary_path}: missing (--baseline takes a finished evaluation run folder)")
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        baseline = (summary.get("metrics") or {}).get(args.metric)
        if baseline is None:
            raise InputError(f"{summary_path}: no metrics.{args.metric}")
        if args.out is not None and args.out.exists():
            raise InputError(f"{args.out} exists; choose another --out (an estimate is never overwritten)")
        # a seed's name is its folder (RUN/seed-N/grpo1/train_log.jsonl -> seed-N)
        names = [p.parent.parent.name or str(p) for p in args.logs]
        if len(set(names)) != len(names):
            names = [str(p) for p in args.logs]
        result = estimate(dict(zip(names, args.logs)), float(baseline), args.metric, args.margin)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result["baseline_run"] = {"tasks": summary.get("tasks"), "data_manifest_sha256": summary["data"]["manifest_sha256"]}
    print(f"baseline: {args.metric} {float(baseline):.4f} on {summary['tasks']['scored']} questions")
    for line in describe(result):
        print(line)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
