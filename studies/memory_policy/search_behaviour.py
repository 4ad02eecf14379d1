"""How a run's controller searched, and whether it followed the memory's open items.

    from studies.memory_policy.search_behaviour import search_behaviour

    stats = search_behaviour("runs/abl/seed-1/matrix/D")   # reads trajectories.jsonl

    uv run python -m studies.memory_policy.search_behaviour RUN [RUN ...] > search_behaviour.json

A trained controller can be measured by its metrics and still be misread: the stage-2 controls
found one that copies pieces of the question and repeats them. These counts, read from the
trajectories' ``search`` and ``memory`` events, say what it did:

- ``queries_in_question``: searches whose query (lower-cased, spaces collapsed) is a substring of
  the question;
- ``questions_with_repeated_query``: of the questions with more than one search, those that sent
  one query twice;
- ``open_items``: open sub-questions (``kind = "open"``, docs/design.md §5) the memory held after
  any memory step (distinct texts per question), and the questions with at least one;
  ``open_items_find``: those in the teacher's form, ``Find: <title>`` (a policy can also tag a
  plain fact ``open``: the kind is not scored);
- ``queries_following_open_item``: searches whose query names the subject of an open item the
  memory held just before that search (the item's text without the oracle's ``Find:`` prefix,
  compared like ``queries_in_question``, in either direction), out of the searches made while
  the memory held an open item.

Memory is read from each ``memory`` event's ``after`` (the memory as the policies see it:
``[m1] (open; d3:1) Find: Helen Hunt``). The command prints each run's counts as JSON keyed by
the folder given (an eval run folder with its trajectories.jsonl: a matrix group, a held-out row).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from memsearch.backends.oracle import FIND
from memsearch.errors import InputError
from memsearch.records.events import MemoryEvent, SearchEvent
from memsearch.records.trajectory import read_trajectories

_ITEM = re.compile(r"^\[m\d+\] \((fact|open)(?:; [^)]*)?\) (.*)$")


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def open_items(rendered: str) -> list[str]:
    """The texts of the open items in a rendered memory (``Memory.render()``), in order."""
    found = []
    for line in rendered.splitlines():
        match = _ITEM.match(line)
        if match and match.group(1) == "open":
            found.append(match.group(2))
    return found


def _subject(item: str) -> str:
    return _norm(item[len(FIND):] if item.startswith(FIND) else item)


def search_behaviour(run: str | Path) -> dict[str, Any]:
    """Counts of a run's searches and open items (the module docstring defines each)."""
    path = Path(run) / "trajectories.jsonl"
    if not path.is_file():
        raise InputError(f"{path}: no such file; expected an eval run's trajectories")
    counts = {
        "questions": 0,
        "searches": 0,
        "questions_with_search": 0,
        "questions_with_several_searches": 0,
        "questions_with_repeated_query": 0,
        "queries_in_question": 0,
        "open_items": 0,
        "open_items_find": 0,
        "questions_with_open_item": 0,
        "searches_with_open_item_held": 0,
        "queries_following_open_item": 0,
    }
    for _, traj in read_trajectories(path):
        counts["questions"] += 1
        question, held, queries, opened = _norm(traj.question or ""), [], [], set()
        for event in traj.events:
            if isinstance(event, MemoryEvent):
                items = open_items(event.after or "")
                held = [_subject(item) for item in items]
                opened.update(items)
            elif isinstance(event, SearchEvent):
                query = _norm(event.query)
                queries.append(query)
                counts["queries_in_question"] += bool(query) and query in question
                if held:
                    counts["searches_with_open_item_held"] += 1
                    counts["queries_following_open_item"] += bool(query) and any(
                        s and (s in query or query in s) for s in held
                    )
        counts["searches"] += len(queries)
        counts["questions_with_search"] += bool(queries)
        counts["questions_with_several_searches"] += len(queries) > 1
        counts["questions_with_repeated_query"] += len(set(queries)) < len(queries)
        counts["open_items"] += len(opened)
        counts["open_items_find"] += sum(item.startswith(FIND) for item in opened)
        counts["questions_with_open_item"] += bool(opened)
    return counts


def main(argv: list[str]) -> int:
    """``python -m studies.memory_policy.search_behaviour RUN [RUN ...]``."""
    if not argv:
        print("usage: python -m studies.memory_policy.search_behaviour RUN [RUN ...]", file=sys.stderr)
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
