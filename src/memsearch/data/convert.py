"""The loop every source converter shares (HotpotQA, MuSiQue): check the split, convert the
records one by one into a shared document pool, raise all problems together, and describe the
result in the manifest. Each converter supplies only how one record becomes a task and a label.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from memsearch.data.dataset import Dataset, DocumentPool
from memsearch.data.records import Label, Task
from memsearch.data.source import SourceRecord, finish, iter_source
from memsearch.errors import InputError, Problem
from memsearch.io import sha256_file

SPLITS = ("train", "dev")

# (record, the pool its paragraphs join, ids seen so far -> their first index) -> task and label,
# or None when the record has problems (already reported on the record).
RecordConverter = Callable[[SourceRecord, DocumentPool, dict[str, int]], "tuple[Task, Label] | None"]


def convert_source(
    path: str | Path,
    split: str,
    limit: int | None,
    convert_record: RecordConverter,
    *,
    kind: str,
    evidence_granularity: str,
    converter: str,
) -> Dataset:
    """Convert the first ``limit`` records of ``path`` with ``convert_record``; all problems are
    raised together as one ``InputError``. ``kind``, ``evidence_granularity`` and ``converter``
    (the converter's version) go into the manifest with the split and the source's SHA-256."""
    if split not in SPLITS:
        raise InputError(f"--split {split!r}: expected one of {', '.join(SPLITS)}")
    problems: list[Problem] = []
    pool, seen = DocumentPool(), {}
    tasks, labels = [], []
    for record in iter_source(path, limit, problems):
        converted = convert_record(record, pool, seen)
        if converted:
            tasks.append(converted[0])
            labels.append(converted[1])
    finish(problems, len(tasks), path)
    manifest: dict[str, Any] = {
        "kind": kind,
        "split": split,
        "evidence_granularity": evidence_granularity,
        "converter": converter,
        "source": {"name": Path(path).name, "sha256": sha256_file(path)},
        "options": {"limit": limit},
    }
    return Dataset(pool.documents, tasks, labels, manifest)
