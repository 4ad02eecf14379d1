"""Write a validation pilot's record: every greedy evaluation of a GRPO stage and reference runs on
the same validation questions, with the per-call decision rates (memsearch.pipelines.memory_policy.pilot).

    uv run python scripts/pilot_record.py runs/mp-v2-p3b/seed-1/grpo1 --data runs/mp-v2-p3b/prepare/val \
        --reference rules=runs/val-rules --out docs/results/memory_policy_cpu_v2/pilot3b_validation.json

Refuses runs of different questions and an existing --out (nothing is overwritten).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from memsearch.errors import InputError
    from memsearch.pipelines.memory_policy.pilot import pilot_record

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
