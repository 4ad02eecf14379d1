"""Shared helpers for converters that read a source dataset file record by record.

A converter walks the records of a JSON list, JSON-lines or parquet file, checks each field it
uses, and collects every problem (``file:line: [record].field: what was wrong, what was
expected``; a parquet file has rows, not lines: ``file: [row N].field: ...``) before anything is
written, so one run shows all that needs fixing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memsearch.data.parquet import is_parquet, iter_parquet_rows
from memsearch.errors import InputError, Problem
from memsearch.io import iter_json_records, require_file

# Words in a source file's name that say which split it holds (the official files are named
# hotpot_train_v1.1.json, hotpot_dev_distractor_v1.json, musique_ans_v1.0_dev.jsonl, ...).
_SPLIT_WORDS = {"train": "train", "dev": "dev", "validation": "dev", "val": "dev"}


def check_split(path: str | Path, split: str) -> None:
    """Refuse a split that the source file's name contradicts (the converters check the value).

    The split is recorded in the manifest and every training command trusts it to keep dev
    questions out of training, so a train file converted as "dev" (or the reverse) must not pass.
    """
    words = {_SPLIT_WORDS[w] for w in re.split(r"[^a-z]+", Path(path).name.lower()) if w in _SPLIT_WORDS}
    if len(words) == 1 and split not in words:
        (named,) = words
        raise InputError(f"{path}: the file name says {named!r} but --split is {split!r}; "
                         f"expected --split {named} (or rename the file if the name is wrong)")


class SourceRecord:
    """One record of a source file, with the location to report its problems at: a line of a
    JSON file, or (``line`` None) a row of a parquet file."""

    def __init__(self, file: str, line: int | None, index: int, obj: Any, problems: list[Problem]) -> None:
        self.file, self.line, self.index, self.obj = file, line, index, obj
        self._problems = problems

    def problem(self, field: str, message: str) -> None:
        where = f"[{self.index}]" if self.line is not None else f"[row {self.index}]"
        self._problems.append(Problem(self.file, self.line, f"{where}.{field}" if field else where, message))

    def get(
        self, key: str, kind: type | tuple[type, ...], expected: str, container: Any = None, path: str | None = None
    ) -> Any:
        """``container[key]`` if it exists and has type ``kind``; otherwise record a problem and
        return ``None``."""
        container = self.obj if container is None else container
        path = path or key
        if not isinstance(container, dict) or key not in container:
            self.problem(path, f"missing, expected {expected}")
            return None
        value = container[key]
        if isinstance(value, bool) and kind in (int, (int,)) or not isinstance(value, kind):
            self.problem(path, f"got {type(value).__name__} {_short(value)}, expected {expected}")
            return None
        return value

    def str_list(self, value: Any, path: str, expected: str, allow_empty: bool = False) -> list[str] | None:
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            self.problem(path, f"got {_short(value)}, expected {expected}")
            return None
        if not value and not allow_empty:
            self.problem(path, f"empty list, expected {expected}")
            return None
        return value


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def iter_source(
    path: str | Path, limit: int | None, problems: list[Problem], show_progress: bool = False
) -> Iterator[SourceRecord]:
    """Records of a source file in source order, at most ``limit`` of them. ``show_progress``:
    a bar of the bytes read on stderr (JSON and JSON lines, read a block at a time)."""
    path = Path(path)
    if limit is not None and limit < 1:
        raise InputError(f"--limit {limit}: expected a positive number of examples")
    require_file(path, "a JSON, JSON-lines or parquet file")
    # The bytes decide, not the name: the Hub's cache keeps files as extensionless blobs, and a
    # renamed export would otherwise be misread.
    if is_parquet(path):
        yield from _records(path, ((None, i, obj) for i, obj in iter_parquet_rows(path)), limit, problems)
        return
    from tqdm import tqdm

    with tqdm(total=path.stat().st_size, desc=f"read {path.name}", unit="B", unit_scale=True, unit_divisor=1024,
              disable=not show_progress, mininterval=0.5, leave=False) as bar:
        def progress(done: int) -> None:
            bar.update(done - bar.n)

        rows = iter_json_records(path, progress)
        try:
            yield from _records(path, rows, limit, problems)
        finally:
            rows.close()  # a --limit run stops early: close the file now, not when collected


def _records(path: Path, rows: Iterator[tuple[int | None, int, Any]], limit: int | None,
             problems: list[Problem]) -> Iterator[SourceRecord]:
    n = 0
    for line, index, obj in rows:
        record = SourceRecord(str(path), line, index, obj, problems)
        if not isinstance(obj, dict):
            record.problem("", f"got {type(obj).__name__}, expected a JSON object per example")
            continue
        n += 1
        yield record
        if limit is not None and n >= limit:
            return  # stop before decoding record N+1: a --limit run never reads past its records


def check_unique_id(record: SourceRecord, key: str, task_id: str, seen: dict[str, int]) -> bool:
    """Record a problem if ``task_id`` was already used by an earlier record."""
    if task_id in seen:
        first = f"line {seen[task_id]}" if record.line is not None else f"row {seen[task_id]}"
        record.problem(key, f"duplicate id {task_id!r} (first used at {first}), expected unique ids")
        return False
    seen[task_id] = record.line if record.line is not None else record.index
    return True


def finish(problems: list[Problem], n_tasks: int, path: str | Path, skipped: dict[str, int] | None = None) -> None:
    """Raise all collected problems, or complain about an input with no examples (saying how
    many records were skipped, and why, when that is the reason)."""
    if problems:
        raise InputError(problems)
    if n_tasks == 0:
        why = "; ".join(f"{n} skipped ({reason})" for reason, n in (skipped or {}).items())
        raise InputError([Problem(str(path), None, "file", "no examples" + (f": {why}" if why else "")
                                  + ", expected at least one record")])
