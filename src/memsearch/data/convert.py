"""The loop every source converter shares (HotpotQA, MuSiQue): check the split, convert the
records one by one into a shared document pool, raise all problems together, and describe the
result in the manifest. Each converter (``SourceConverter``) supplies only how one record becomes a
task and a label, its format and what it reads; ``data.converters`` registers them by name.

Two ends: ``convert_source`` builds the ``Dataset`` in memory (what pipelines use on slices);
``prepare_source`` writes a new folder as it converts and holds only ids and digests, so the
official 90k-question train file converts in time linear in its records and in memory that does
not grow with its text (the folder appears, whole, only when no record had a problem). Both
write the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memsearch.data.dataset import Dataset, DatasetWriter, DocumentPool
from memsearch.data.records import Label, Task
from memsearch.data.source import SourceRecord, finish, iter_source
from memsearch.errors import InputError, Problem
from memsearch.io import atomic_output_dir, sha256_file

SPLITS = ("train", "dev")

# (record, the pool its paragraphs join, ids seen so far -> their first index) -> task and label,
# None when the record has problems (already reported on the record), or a string saying why the
# record is skipped (counted in the manifest's "skipped", e.g. MuSiQue's "answerable: false").
RecordConverter = Callable[[SourceRecord, DocumentPool, dict[str, int]], "tuple[Task, Label] | str | None"]


@dataclass
class SourceFormat:
    """What a converter contributes besides its record converter: the manifest's ``kind``,
    ``evidence_granularity`` and ``converter`` (the converter's version)."""

    kind: str
    evidence_granularity: str
    converter: str


@dataclass(frozen=True)
class SourceConverter:
    """One dataset converter: ``name`` (what commands and the registry call it:
    ``data.converters``), its ``format`` (the manifest's kind, granularity and converter
    version), ``reads`` (the source files it accepts, in words) and ``convert_record`` (how one
    record becomes a task and a label). The loop, the checks and the writing are shared."""

    name: str
    format: SourceFormat
    reads: str
    convert_record: RecordConverter

    def convert(self, path: str | Path, split: str = "dev", limit: int | None = None,
                show_progress: bool = False) -> Dataset:
        """The first ``limit`` records of ``path`` as a ``Dataset`` in memory (``convert_source``)."""
        return convert_source(path, split, limit, self.convert_record, self.format, show_progress)

    def prepare(self, path: str | Path, out: str | Path, split: str = "dev", limit: int | None = None,
                show_progress: bool = False) -> dict[str, Any]:
        """Convert straight into the new folder ``out`` (``prepare_source``); returns its manifest."""
        return prepare_source(path, out, split, limit, self.convert_record, self.format, show_progress)


def _convert(path: str | Path, split: str, limit: int | None, convert_record: RecordConverter, pool: DocumentPool,
             keep: Callable[[Task, Label], None], show_progress: bool) -> dict[str, int]:
    """Convert every record, handing each task and label to ``keep`` until a problem is found
    (after one, nothing will be written); raise all problems together. Returns the skip counts."""
    if split not in SPLITS:
        raise InputError(f"--split {split!r}: expected one of {', '.join(SPLITS)}")
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    skipped: dict[str, int] = {}
    n_tasks = 0
    # A file that cannot be read on (bad JSON, a lone surrogate, ...) raises from the reader at once.
    for record in iter_source(path, limit, problems, show_progress=show_progress):
        converted = convert_record(record, pool, seen)
        if isinstance(converted, str):
            skipped[converted] = skipped.get(converted, 0) + 1
        elif converted:
            n_tasks += 1
            if not problems:
                keep(*converted)
    finish(problems, n_tasks, path, skipped)
    return skipped


def _manifest(path: str | Path, split: str, limit: int | None, fmt: SourceFormat,
              skipped: dict[str, int]) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "kind": fmt.kind,
        "split": split,
        "evidence_granularity": fmt.evidence_granularity,
        "converter": fmt.converter,
        "source": {"name": Path(path).name, "sha256": sha256_file(path)},
        "options": {"limit": limit},
    }
    if skipped:
        manifest["skipped"] = skipped
    return manifest


def convert_source(path: str | Path, split: str, limit: int | None, convert_record: RecordConverter,
                   fmt: SourceFormat, show_progress: bool = False) -> Dataset:
    """Convert the first ``limit`` records of ``path`` with ``convert_record`` into a ``Dataset``
    in memory; all problems are raised together as one ``InputError``. The manifest holds
    ``fmt``, the split, the source's SHA-256, and ``skipped`` (reason -> count) when records were
    skipped. ``show_progress``: a bar of the bytes read on stderr."""
    pool = DocumentPool()
    tasks: list[Task] = []
    labels: list[Label] = []

    def keep(task: Task, label: Label) -> None:
        tasks.append(task)
        labels.append(label)

    skipped = _convert(path, split, limit, convert_record, pool, keep, show_progress)
    return Dataset(pool.documents, tasks, labels, _manifest(path, split, limit, fmt, skipped))


def prepare_source(path: str | Path, out: str | Path, split: str, limit: int | None, convert_record: RecordConverter,
                   fmt: SourceFormat, show_progress: bool = False) -> dict[str, Any]:
    """Convert like ``convert_source`` straight into the new folder ``out`` and return its
    manifest: records are written as they are converted and only ids and paragraph digests are
    held, so memory does not grow with the source's text. Nothing is left when a record is
    refused: not the folder, nor a parent folder made for it."""
    if split not in SPLITS:
        raise InputError(f"--split {split!r}: expected one of {', '.join(SPLITS)}")
    out = Path(out)
    made = [parent for parent in out.parents if not parent.exists()]
    try:
        with atomic_output_dir(out) as tmp:
            writer = DatasetWriter(tmp)
            try:
                pool = DocumentPool(on_new=writer.document)

                def keep(task: Task, label: Label) -> None:
                    writer.task(task)
                    writer.label(label)

                skipped = _convert(path, split, limit, convert_record, pool, keep, show_progress)
                return writer.finish(_manifest(path, split, limit, fmt, skipped))
            finally:
                writer.close()
    except BaseException:
        for parent in made:  # deepest first; only the ones this call made, and only if still empty
            try:
                parent.rmdir()
            except OSError:
                break
        raise
