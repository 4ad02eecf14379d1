"""How each run's controller searched and used open items, as JSON keyed by the folder given.

    uv run python scripts/search_behaviour.py RUN [RUN ...] > search_behaviour.json

RUN is an eval run folder with its trajectories.jsonl (a matrix group, a held-out row);
memsearch.eval.search_behaviour defines every count.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    from memsearch.errors import InputError
    from memsearch.eval.search_behaviour import search_behaviour

    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        result = {run: search_behaviour(run) for run in argv}
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
