"""Paired differences (ablation - control) of two matrix runs, group by group, as JSON.

    uv run python -m studies.memory_policy.compare_matrix_runs ABLATION_MATRIX CONTROL_MATRIX [GROUPS] > diff.json

ABLATION_MATRIX and CONTROL_MATRIX are matrix folders (``<run>/seed-1/matrix``, published or
not); GROUPS is a string of group names (default ``ABCD``). memsearch.eval.run_diff computes it.
A group folder may hold ``metrics.jsonl.gz`` instead of ``metrics.jsonl`` (docs/results
publishes the per-question metrics gzip-compressed); run_diff reads either.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    """``python -m studies.memory_policy.compare_matrix_runs ABLATION_MATRIX CONTROL_MATRIX [GROUPS]``."""
    from memsearch.errors import InputError
    from memsearch.eval.run_diff import matrix_minus_control

    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    groups = list(argv[2]) if len(argv) == 3 else list("ABCD")
    try:
        diff = matrix_minus_control(Path(argv[0]), Path(argv[1]), groups)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    json.dump(diff, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
