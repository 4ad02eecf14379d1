"""Paired differences (ablation - control) of two matrix runs, group by group, as JSON.

    uv run python scripts/compare_matrix_runs.py ABLATION_MATRIX CONTROL_MATRIX [GROUPS] > diff.json

ABLATION_MATRIX and CONTROL_MATRIX are matrix folders (``<run>/seed-1/matrix``, published or
not); GROUPS is a string of group names (default ``ABCD``). memsearch.eval.run_diff computes it.
A group folder may hold ``metrics.jsonl.gz`` instead of ``metrics.jsonl``: docs/results
publishes the per-question metrics gzip-compressed.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path


def readable_matrix(matrix: Path, groups: list[str], scratch: Path) -> Path:
    """``matrix`` itself when every group has a plain metrics.jsonl; otherwise a copy under
    ``scratch`` with the compressed ones decompressed (run_diff reads plain JSONL only)."""
    if all(not (matrix / g / "metrics.jsonl.gz").is_file() or (matrix / g / "metrics.jsonl").is_file()
           for g in groups):
        return matrix
    copy = scratch / f"{len(list(scratch.iterdir()))}"
    for group in groups:
        plain, packed = matrix / group / "metrics.jsonl", matrix / group / "metrics.jsonl.gz"
        (copy / group).mkdir(parents=True)
        if plain.is_file():
            shutil.copyfile(plain, copy / group / "metrics.jsonl")
        elif packed.is_file():
            with gzip.open(packed, "rb") as src, open(copy / group / "metrics.jsonl", "wb") as dst:
                shutil.copyfileobj(src, dst)
    return copy


def main(argv: list[str]) -> int:
    from memsearch.errors import InputError
    from memsearch.eval.run_diff import matrix_minus_control

    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    groups = list(argv[2]) if len(argv) == 3 else list("ABCD")
    with tempfile.TemporaryDirectory() as tmp:
        run, control = (readable_matrix(Path(m), groups, Path(tmp)) for m in argv[:2])
        try:
            diff = matrix_minus_control(run, control, groups)
        except InputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    json.dump(diff, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
