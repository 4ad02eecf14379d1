"""Ship a trained memory-policy adapter into models/memory-policy-cpu with its fingerprint.json.

    uv run python scripts/ship_adapter.py runs/mp/seed-1/grpo1/adapter --run runs/mp --seed 1 \
        [--dtype bfloat16] [--force] [--dest DIR]

SRC_ADAPTER_DIR is the GRPO stage-1 trainer's final adapter of a `memsearch pipeline
memory-policy` run (RUN/seed-N/grpo1/adapter); it must hash to the adapter recorded in
RUN/seed-N/grpo1.stage.json. The provenance (config, seed, data and teacher-row hashes,
held-out metrics) is read from RUN (memsearch.pipelines.memory_policy.ship). Refuses to overwrite a non-empty
destination without --force.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from memsearch.assets.adapter import FINGERPRINT
    from memsearch.errors import InputError
    from memsearch.pipelines.memory_policy.ship import CAST_DTYPES, ship_adapter

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, metavar="SRC_ADAPTER_DIR", help="RUN/seed-N/grpo1/adapter")
    parser.add_argument("--run", type=Path, required=True, help="the pipeline run folder (the pipeline's --out)")
    parser.add_argument("--seed", type=int, required=True, help="the seed whose adapter this is")
    parser.add_argument("--dest", type=Path, default=None, help="default: models/memory-policy-cpu of this checkout")
    parser.add_argument("--force", action="store_true", help="replace an existing shipped adapter")
    parser.add_argument(
        "--dtype",
        choices=CAST_DTYPES,
        default=None,
        help="store the weights in this precision (half the bytes; evaluate the shipped copy again)",
    )
    args = parser.parse_args(argv)
    try:
        dest = ship_adapter(args.source, args.run, args.seed, args.dest, args.force, args.dtype)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    record = json.loads((dest / FINGERPRINT).read_text(encoding="utf-8"))
    print(f"shipped {args.source} -> {dest}")
    for name, sha in record["files"].items():
        print(f"  {name}  sha256 {sha}")
    grpo = record["provenance"]["heldout"]["grpo"]
    print(f"  held-out (seed {args.seed}, {grpo['questions']} questions): {json.dumps(grpo['metrics'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
