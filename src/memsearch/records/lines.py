"""Reading a JSON-lines file of one record type: each line through the record's ``from_json``,
a line that is not such a record named by file and line (docs/design.md §3)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from memsearch.errors import InputValueError
from memsearch.io import iter_jsonl

Record = TypeVar("Record")


def read_lines(path: str | Path, from_json: Callable[[Mapping[str, Any]], Record]) -> list[Record]:
    """Every line of ``path`` (``.gz`` too) as a record. ``io.iter_jsonl`` names a line that is
    no JSON; a line ``from_json`` refuses raises ``InputValueError`` (an ``InputError`` and a
    ``ValueError``) naming the file, the line and why."""
    records = []
    for lineno, data in iter_jsonl(path):
        try:
            records.append(from_json(data))
        except (ValueError, TypeError) as exc:
            raise InputValueError(f"{path}:{lineno}: {exc}") from None
    return records
