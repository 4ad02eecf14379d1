"""A prepared data folder in memory, and how it is written to and read from disk.

Layout (every converter writes the same three files plus a manifest, so nothing downstream
depends on the source dataset)::

    corpus.jsonl    Document per line
    tasks.jsonl     Task per line (what an agent may see)
    labels.jsonl    Label per line (what only the scorer may see)
    manifest.json   kind, split, counts, options, SHA-256 of the source and of every file

Files are written deterministically (same inputs give byte-identical outputs): no timestamps,
no absolute paths, canonical JSON.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from memsearch.data.records import Document, Label, Task
from memsearch.errors import InputError, Problem
from memsearch.io import atomic_output_dir, dumps_line, file_kind_problem, iter_jsonl, sha256_file, write_json

FORMAT = "memsearch-data/1"
DATA_FILES = ("corpus.jsonl", "tasks.jsonl", "labels.jsonl")


@dataclass
class Dataset:
    """Documents, tasks and labels of one split, plus the manifest fields that describe them."""

    documents: list[Document]
    tasks: list[Task]
    labels: list[Label]
    manifest: dict[str, Any] = field(default_factory=dict)

    def documents_by_id(self) -> dict[str, Document]:
        return {d.doc_id: d for d in self.documents}

    def labels_by_id(self) -> dict[str, Label]:
        return {lab.id: lab for lab in self.labels}


class DocumentPool:
    """Assigns stable ids to distinct paragraphs: ``d0, d1, …`` in order of first appearance.

    Two paragraphs are the same document when title and sentences are identical. Ids are
    short on purpose (they are shown to the model next to every sentence) and stable under
    ``--limit`` because they follow source order.

    With ``on_new``, each new document is handed to it instead of kept, and a paragraph is
    remembered by a digest of its text, not the text: what a streaming conversion holds then
    stays small however large the source (``convert.prepare_source``).
    """

    def __init__(self, on_new: Callable[[Document], None] | None = None) -> None:
        self._ids: dict[Any, str] = {}
        self.documents: list[Document] = []
        self._on_new = on_new

    def add(self, title: str, sentences: list[str]) -> str:
        key: Any = (title, tuple(sentences))
        if self._on_new is not None:
            # JSON text is an unambiguous encoding of (title, sentences); 128 bits never collide in practice.
            key = hashlib.blake2b(json.dumps(key).encode(), digest_size=16).digest()
        doc_id = self._ids.get(key)
        if doc_id is None:
            doc_id = f"d{len(self._ids)}"
            self._ids[key] = doc_id
            doc = Document(doc_id=doc_id, title=title, sentences=list(sentences))
            if self._on_new is None:
                self.documents.append(doc)
            else:
                self._on_new(doc)
        return doc_id


class DatasetWriter:
    """A prepared folder written record by record into ``folder`` (a temporary one from
    ``atomic_output_dir``): corpus, task and label lines as they come, then the manifest with the
    counts and every file's SHA-256. ``save_dataset`` and the streaming converters both write
    through it, so a folder's bytes do not depend on which of them made it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.counts = {"documents": 0, "tasks": 0, "labels": 0}
        self._files = {name: open(folder / name, "w", encoding="utf-8", newline="\n")  # noqa: SIM115 - see close
                       for name in DATA_FILES}

    def _write(self, name: str, count: str, row: dict[str, Any]) -> None:
        fh = self._files[name]
        fh.write(dumps_line(row))
        fh.write("\n")
        self.counts[count] += 1

    def document(self, doc: Document) -> None:
        self._write("corpus.jsonl", "documents", doc.model_dump(exclude_none=True))

    def task(self, task: Task) -> None:
        self._write("tasks.jsonl", "tasks", task.model_dump())

    def label(self, label: Label) -> None:
        self._write("labels.jsonl", "labels", label.model_dump(exclude_none=True))

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()

    def finish(self, fields: dict[str, Any]) -> dict[str, Any]:
        """Close the data files and write the manifest: format, ``fields``, counts, hashes."""
        self.close()
        manifest = {"format": FORMAT, **fields, "counts": dict(self.counts)}
        manifest["files"] = {name: sha256_file(self.folder / name) for name in DATA_FILES}
        write_json(self.folder / "manifest.json", manifest)
        return manifest


def save_dataset(dataset: Dataset, out: str | Path) -> Path:
    """Write ``dataset`` to a new folder ``out`` (refused if it exists; nothing partial on error)."""
    if not dataset.tasks:
        raise InputError("no tasks to write: the input produced no examples (nothing was written)")
    with atomic_output_dir(out) as tmp:
        writer = DatasetWriter(tmp)
        try:
            for doc in dataset.documents:
                writer.document(doc)
            for task in dataset.tasks:
                writer.task(task)
            for label in dataset.labels:
                writer.label(label)
            writer.finish(dataset.manifest)
        finally:
            writer.close()
    return Path(out)


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    """The manifest of a prepared folder, or ``InputError`` naming what is missing."""
    folder = file_kind_problem(data_dir, "a folder written by `memsearch prepare-*`", folder=True)
    if folder is not None and folder != "no such folder":  # a missing folder is named by its manifest below
        raise InputError(f"{data_dir}: {folder}")
    path = Path(data_dir) / "manifest.json"
    kind = file_kind_problem(path, "the manifest of a folder written by `memsearch prepare-*`")
    if kind == "no such file":
        raise InputError(f"{path}: no such file; expected a folder written by `memsearch prepare-*`")
    if kind is not None:
        raise InputError(f"{path}: {kind}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8-sig"))  # a BOM is not part of the JSON
    except json.JSONDecodeError as exc:
        raise InputError(
            [Problem(str(path), exc.lineno, "json", f"invalid JSON ({exc.msg}), expected the manifest object")]
        ) from None
    except UnicodeDecodeError as exc:
        raise InputError([Problem(str(path), None, "encoding", f"not UTF-8 text ({exc.reason} at offset "
                                  f"{exc.start}), expected the manifest object")]) from None
    except (ValueError, RecursionError) as exc:  # an integer past Python's digit limit, or absurd nesting
        raise InputError([Problem(str(path), None, "json", f"not a readable manifest ({type(exc).__name__}: "
                                  f"{str(exc)[:80]}), expected the manifest object")]) from None
    if not isinstance(manifest, dict):
        raise InputError([Problem(str(path), 1, "manifest", "not a JSON object, expected the manifest object")])
    return manifest


def load_records(path: Path, model: type, problems: list[Problem]) -> list[tuple[int, Any]]:
    """Parse each line of ``path`` into ``model``; schema problems go to ``problems``."""
    records = []
    for lineno, obj in iter_jsonl(path):
        try:
            records.append((lineno, model.model_validate(obj)))
        except ValidationError as exc:
            problems.extend(validation_problems(str(path), lineno, exc))
    return records


def validation_problems(file: str, line: int | None, exc: ValidationError) -> list[Problem]:
    """One ``Problem`` per pydantic error, with the field path and what was expected."""
    out = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"]) or "record"
        if err["type"] == "extra_forbidden":
            message = "unexpected field, not part of the schema"
        elif err["type"] == "missing":
            message = "missing, expected this field"
        else:
            message = f"{err['msg']} (got {_short(err.get('input'))})"
        out.append(Problem(file, line, loc, message))
    return out


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def file_hash_problems(data_dir: Path, manifest: dict[str, Any]) -> list[Problem]:
    """Data files whose bytes differ from the SHA-256 the manifest records (edited after prepare)."""
    problems = []
    files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    mpath = str(data_dir / "manifest.json")
    for name in DATA_FILES:
        path = data_dir / name
        if file_kind_problem(path) is None and files.get(name) != (actual := sha256_file(path)):
            problems.append(
                Problem(
                    mpath,
                    None,
                    f"files.{name}",
                    f"SHA-256 {files.get(name)!r} does not match the file ({actual}), "
                    "expected the hash of the file as written",
                )
            )
    return problems


def unique_by(path: Path, rows: list[tuple[int, Any]], key: str, problems: list[Problem]) -> dict[str, tuple[int, Any]]:
    """``rows`` indexed by ``key``; every repeated value is a problem naming both lines."""
    seen: dict[str, tuple[int, Any]] = {}
    for lineno, rec in rows:
        value = getattr(rec, key)
        if value in seen:
            problems.append(
                Problem(
                    str(path),
                    lineno,
                    key,
                    f"duplicate {value!r} (first at line {seen[value][0]}), expected unique values",
                )
            )
        else:
            seen[value] = (lineno, rec)
    return seen


def pairing_problems(
    tpath: Path, tasks: dict[str, tuple[int, Any]], lpath: Path, labels: list[tuple[int, Any]]
) -> list[Problem]:
    """Labels without a task and tasks without a label (each task is scored against exactly one label)."""
    problems = [
        Problem(str(lpath), lineno, "id", f"{lab.id!r} has no task, expected a label per task id")
        for lineno, lab in labels
        if lab.id not in tasks
    ]
    labelled = {lab.id for _, lab in labels}
    problems += [
        Problem(str(tpath), lineno, "id", f"{task_id!r} has no label, expected a label per task id")
        for task_id, (lineno, _) in tasks.items()
        if task_id not in labelled
    ]
    return problems


def load_dataset(data_dir: str | Path) -> Dataset:
    """Read a prepared folder, refusing (``InputError`` listing every problem) a schema problem,
    a data file edited since it was prepared (its SHA-256 differs from the manifest's: a run's
    data fingerprint is built from those hashes, so they must be true), a repeated task or label
    id (a task would be scored twice) and a task without a label or a label without a task."""
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir)
    problems: list[Problem] = file_hash_problems(data_dir, manifest)
    if problems:
        raise InputError(problems)
    docs = load_records(data_dir / "corpus.jsonl", Document, problems)
    tasks = load_records(data_dir / "tasks.jsonl", Task, problems)
    labels = load_records(data_dir / "labels.jsonl", Label, problems)
    if not problems:
        tpath, lpath = data_dir / "tasks.jsonl", data_dir / "labels.jsonl"
        by_id = unique_by(tpath, tasks, "id", problems)
        unique_by(lpath, labels, "id", problems)
        problems += pairing_problems(tpath, by_id, lpath, labels)
    if problems:
        raise InputError(problems)
    return Dataset(
        documents=[d for _, d in docs],
        tasks=[t for _, t in tasks],
        labels=[lab for _, lab in labels],
        manifest=manifest,
    )
