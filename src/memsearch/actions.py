"""The text grammar of agent actions that more than one layer reads: evidence ids mentioned in
free text, and the controller's ``SEARCH(query)`` / ``FINISH``.

It sits at the bottom of the package (docs/design.md §11) because both the engine (which parses
policy output) and the ``oracle`` backend (which writes text the engine will parse, and must
predict how it will be read) need it, and backends sit below the engine. Pure functions; nothing
here raises on model output: a text that cannot be read becomes an invalid action with a reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# An evidence id (``doc:sentence``) as it appears in model text: not part of a URL, a path, a
# time or a longer id on either side.
EVIDENCE_ID_IN_TEXT = re.compile(r"(?<![\w:/.@])([A-Za-z][\w\-]*:\d+)(?![\w:])")
_SEARCH = re.compile(r"\bSEARCH\s*[:(]\s*(.+?)\s*\)?\s*$", re.IGNORECASE | re.MULTILINE)
_FINISH = re.compile(r"\bFINISH\b", re.IGNORECASE)


@dataclass(frozen=True)
class ControllerAction:
    """``SEARCH(query)`` or ``FINISH``; ``error`` set when the text was neither."""

    kind: str  # "search" | "finish" | "invalid"
    query: str | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "query": self.query, "error": self.error}


def parse_controller(text: str) -> ControllerAction:
    """Read ``SEARCH: <query>`` / ``SEARCH(<query>)`` or ``FINISH``, whichever comes first."""
    search = _SEARCH.search(text)
    finish = _FINISH.search(text)
    if search and (not finish or search.start() < finish.start()):
        query = search.group(1).strip().strip("\"'`<>").strip()
        if query:
            return ControllerAction("search", query=query)
        return ControllerAction("invalid", error="SEARCH without a query")
    if finish:
        return ControllerAction("finish")
    return ControllerAction("invalid", error="neither 'SEARCH: <query>' nor 'FINISH' found")


def evidence_ids_in(text: str) -> tuple[str, ...]:
    """Evidence ids (``doc:sentence``) mentioned in ``text``, first mention first."""
    return tuple(dict.fromkeys(EVIDENCE_ID_IN_TEXT.findall(text)))
