"""What one constrained call of the extractive format may do from a given state (docs/design.md §5).

``fitting_choices`` lists what the schema constraint may offer (``memory.extractive_constraint``):
the source lists of an ADD and of an UPDATE of each item whose result fits the budget (each
checked on a scratch copy of the store: the store's own rules and accounting), the items that may
be deleted, and whether an open item of the longest allowed text surely fits. A state with no room
left offers DELETE, an UPDATE that shrinks an item, and NOOP; an over-budget op cannot be sampled.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from memsearch.memory.extractive import OPEN_TEXT_CHARS, written_text
from memsearch.memory.ops import Add, Op, Update
from memsearch.memory.store import Memory

EXTRACTIVE_SOURCES = 2  # the most sentences one constrained extractive item cites


def _fits(store: Memory, op: Op, shown: set[str]) -> bool:
    scratch = Memory.from_snapshot(store.snapshot(), store.tokenizer, store.budget_tokens, store.show_sources,
                                   store.max_sources)
    return scratch.apply([op], shown).applied


def fitting_choices(store: Memory, evidence_ids: Sequence[str], texts: Mapping[str, str], shown: set[str],
                    max_sources: int = EXTRACTIVE_SOURCES) -> dict[str, Any]:
    """What one constrained extractive call may do from this state (module doc): ``add`` (source
    lists, evidence order), ``update`` (item id -> source lists), ``delete`` (item ids), ``open``
    (``OPEN_TEXT_CHARS`` when an open item of that length surely fits, else 0). Sources come from
    this call's new evidence; a list holds up to ``max_sources`` distinct ids."""
    cap = min(max_sources, store.max_sources or max_sources)
    lists = [list(c) for k in range(1, cap + 1) for c in itertools.combinations(dict.fromkeys(evidence_ids), k)]

    def fact(sources: list[str]) -> str:
        return written_text(sources, texts)

    add = [s for s in lists if _fits(store, Add(fact(s), tuple(s)), shown)]
    update = {item.id: [s for s in lists if _fits(store, Update(item.id, fact(s), tuple(s), "fact"), shown)]
              for item in store.items}
    # Worst case of an open item: one token per character (under the constraint every token spells
    # at least one whole character), plus a margin for merges across the line's start.
    worst = store.tokenizer.count(f"\n[m{store.next_id}] (open) ") + OPEN_TEXT_CHARS + 4
    return {"add": add, "update": {k: v for k, v in update.items() if v}, "delete": [i.id for i in store.items],
            "open": OPEN_TEXT_CHARS if store.tokens() + worst <= store.budget_tokens else 0}
