"""Copy a memory-policy pipeline run's record (report, curves, summary.json, logs, stage records,
per-question metrics) into a results folder of the repository.

    uv run python scripts/publish_mp_results.py RUN DEST

(memsearch.pipelines.memory_policy.publish says what is copied; nothing is computed or typed by hand.)
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from memsearch.errors import InputError
    from memsearch.pipelines.memory_policy.publish import publish_results

    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
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
