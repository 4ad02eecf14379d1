"""Print where a GRPO stage's per-call credit went: its saved state-group branches re-scored with
the stage's own per-call reward, by room, gold shown and outcome
(memsearch.pipelines.memory_policy.branch_credit).

    uv run python scripts/branch_credit.py runs/mp-v2-p4/seed-1/grpo1 --data runs/mp-v2-p4/prepare/train --steps 1-3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from memsearch.errors import InputError
    from memsearch.pipelines.memory_policy.branch_credit import branch_credit, markdown_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", type=Path, help="a GRPO stage folder with credit = 'state' (RUN/seed-N/grpo1)")
    parser.add_argument("--data", type=Path, required=True, help="its prepared train data (RUN/prepare/train)")
    parser.add_argument("--steps", help="FIRST-LAST, inclusive (default: every saved step)")
    parser.add_argument("--room-tokens", type=int, default=60, help="memory budget left that counts as room (60)")
    args = parser.parse_args(argv)
    try:
        steps = None
        if args.steps:
            first, sep, last = args.steps.partition("-")
            if not (first.isdigit() and (not sep or last.isdigit())):
                raise InputError(f"--steps {args.steps!r}: expected FIRST-LAST, e.g. 1-3, or one step")
            steps = (int(first), int(last or first))
        rows = branch_credit(args.stage, args.data, steps=steps, room_tokens=args.room_tokens)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown_table(rows, args.room_tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
