"""Checks of a prepared data folder (``memsearch validate-data``).

Every problem is reported as ``file:line: field: what was wrong, what was expected``; the
checks run to the end so one run lists everything that needs fixing.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from memsearch.data.dataset import (
    DATA_FILES,
    FORMAT,
    file_hash_problems,
    pairing_problems,
    read_manifest,
    unique_by,
    validation_problems,
)
from memsearch.data.records import LABEL_KEYS, Document, Label, Task, has_visible_text, split_evidence_id
from memsearch.errors import InputError, Problem
from memsearch.io import file_kind_problem, iter_jsonl


class _DocSummary(NamedTuple):
    """What the checks need of a corpus document, without its text (the corpus of the official
    train file is gigabytes as models): its id, which sentences have visible text, and a digest
    of title and sentences (to find repeated paragraphs)."""

    doc_id: str
    visible: tuple[bool, ...]
    digest: bytes


def _summary(doc: Document) -> _DocSummary:
    content = json.dumps([doc.title, doc.sentences]).encode()  # an unambiguous encoding of the content
    return _DocSummary(doc.doc_id, tuple(has_visible_text(s) for s in doc.sentences),
                       hashlib.blake2b(content, digest_size=16).digest())


def _read(
    path: Path, model: type, problems: list[Problem], forbidden: frozenset[str] = frozenset(),
    keep: Callable[[Any], Any] = lambda record: record,
) -> tuple[list[tuple[int, Any]], int]:
    """``keep`` of each record that passes the schema, and the number of records in the file
    (valid or not). The file is read a line at a time: only what ``keep`` returns is held."""
    kind = file_kind_problem(path, "this file of a prepared data folder")
    if kind is not None:
        what = "missing, expected this file in a prepared data folder" if kind == "no such file" else kind
        problems.append(Problem(str(path), None, "file", what))
        return [], 0
    out = []
    n = 0
    try:
        for lineno, obj in iter_jsonl(path):
            n += 1
            if not isinstance(obj, dict):
                problems.append(
                    Problem(str(path), lineno, "record", f"got {type(obj).__name__}, expected a JSON object")
                )
                continue
            leaked = sorted(forbidden & obj.keys())
            for key in leaked:
                problems.append(
                    Problem(
                        str(path),
                        lineno,
                        key,
                        "label field in a task, expected tasks to carry only id, question and doc_ids (labels belong "
                        "in labels.jsonl)",
                    )
                )
            try:
                out.append((lineno, keep(model.model_validate({k: v for k, v in obj.items() if k not in leaked}))))
            except ValidationError as exc:
                problems.extend(validation_problems(str(path), lineno, exc))
    except InputError as exc:  # a line that is not JSON: report it and stop reading this file
        problems.extend(exc.problems or [Problem(str(path), None, "file", str(exc))])
    if not out and not any(p.file == str(path) for p in problems):
        problems.append(Problem(str(path), None, "file", "no records, expected at least one"))
    return out, n


def _check_manifest(data_dir: Path, manifest: dict[str, Any], counts: dict[str, int], problems: list[Problem]) -> None:
    mpath = str(data_dir / "manifest.json")
    if manifest.get("format") != FORMAT:
        problems.append(Problem(mpath, None, "format", f"got {manifest.get('format')!r}, expected {FORMAT!r}"))
    if manifest.get("split") not in ("train", "dev"):
        problems.append(Problem(mpath, None, "split", f"got {manifest.get('split')!r}, expected 'train' or 'dev'"))
    problems.extend(file_hash_problems(data_dir, manifest))
    recorded = manifest.get("counts") if isinstance(manifest.get("counts"), dict) else {}
    for key, value in counts.items():
        if recorded.get(key) != value:
            problems.append(
                Problem(mpath, None, f"counts.{key}", f"records {recorded.get(key)!r}, but the file has {value}")
            )


def _support_problem(eid: str, docs: dict[str, tuple[int, _DocSummary]], task_doc_set: set[str]) -> str | None:
    """What is wrong with one supporting-fact id of a label (None: nothing)."""
    parts = split_evidence_id(eid)
    if parts is None:
        return f"{eid!r} is malformed, expected 'doc_id:sentence_index'"
    doc_id, sent = parts
    if doc_id not in docs:
        return f"{eid!r} points at unknown document {doc_id!r}, expected a doc_id of corpus.jsonl"
    visible = docs[doc_id][1].visible
    if sent >= len(visible):
        return f"{eid!r} points at sentence {sent} but {doc_id} has {len(visible)}, expected an existing sentence"
    if not visible[sent]:
        return f"{eid!r} points at a blank sentence, expected a sentence with text"
    if doc_id not in task_doc_set:
        return f"{eid!r} is not in the task's documents, expected support among them"
    return None


def _check_labels(
    lpath: Path,
    labels: list[tuple[int, Label]],
    tasks: dict[str, tuple[int, Task]],
    docs: dict[str, tuple[int, _DocSummary]],
    problems: list[Problem],
) -> None:
    for lineno, lab in labels:
        def bad(field: str, message: str, lineno: int = lineno) -> None:
            problems.append(Problem(str(lpath), lineno, field, message))

        if lab.id not in tasks:
            bad("id", f"{lab.id!r} has no task, expected a label per task id")
            continue
        task_docs = tasks[lab.id][1].doc_ids
        task_doc_set = set(task_docs)
        for i, eid in enumerate(lab.supporting_facts):
            message = _support_problem(eid, docs, task_doc_set)
            if message is not None:
                bad(f"supporting_facts[{i}]", message)
        for i, doc_id in enumerate(lab.gold_doc_ids):
            if doc_id not in task_doc_set:
                bad(f"gold_doc_ids[{i}]", f"{doc_id!r} is not in the task's documents, expected one of them")
        if lab.gold_positions is not None:
            want = [task_docs.index(d) + 1 for d in lab.gold_doc_ids if d in task_doc_set]
            if lab.gold_positions != want:
                bad("gold_positions", f"got {lab.gold_positions}, expected {want} (1-based positions of gold_doc_ids "
                    "in the task's documents)")
    tpath = lpath.with_name("tasks.jsonl")
    problems.extend(p for p in pairing_problems(tpath, tasks, lpath, labels) if p.file == str(tpath))


def normalize_question(text: str) -> str:
    """Questions compared across splits ignore case, punctuation and spacing."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def validate_data(data_dir: str | Path, against: str | Path | None = None) -> list[Problem]:
    """All problems found in ``data_dir`` (and its overlap with ``against``); empty = valid."""
    data_dir = Path(data_dir)
    kind = file_kind_problem(data_dir, "a folder written by `memsearch prepare-*`", folder=True)
    if kind is not None:
        if kind == "no such folder":
            kind = "no such folder, expected a folder written by `memsearch prepare-*`"
        return [Problem(str(data_dir), None, "folder", kind)]
    problems: list[Problem] = []
    try:
        manifest = read_manifest(data_dir)
    except InputError as exc:
        problems.extend(
            exc.problems or [Problem(str(data_dir / "manifest.json"), None, "file", str(exc).split(": ", 1)[-1])]
        )
        manifest = None
    cpath, tpath, lpath = (data_dir / n for n in DATA_FILES)
    doc_rows, n_docs = _read(cpath, Document, problems, keep=_summary)
    task_rows, n_tasks = _read(tpath, Task, problems, forbidden=LABEL_KEYS)
    label_rows, n_labels = _read(lpath, Label, problems)
    docs = unique_by(cpath, doc_rows, "doc_id", problems)
    tasks = unique_by(tpath, task_rows, "id", problems)
    unique_by(lpath, label_rows, "id", problems)

    content: dict[bytes, int] = {}
    for lineno, doc in doc_rows:
        key = doc.digest
        if key in content:
            problems.append(
                Problem(
                    str(cpath),
                    lineno,
                    "doc_id",
                    f"{doc.doc_id!r} repeats the paragraph at line {content[key]}, expected one copy of each distinct "
                    "paragraph",
                )
            )
        content.setdefault(key, lineno)
    for lineno, task in task_rows:
        for i, doc_id in enumerate(task.doc_ids):
            if doc_id not in docs:
                problems.append(Problem(str(tpath), lineno, f"doc_ids[{i}]",
                                        f"{doc_id!r} is not in corpus.jsonl, expected an existing doc_id"))
        for doc_id, n in Counter(task.doc_ids).items():
            if n > 1:
                problems.append(
                    Problem(str(tpath), lineno, "doc_ids", f"{doc_id!r} listed {n} times, expected each document once")
                )
        if not task.doc_ids:
            problems.append(Problem(str(tpath), lineno, "doc_ids", "empty, expected at least one document"))
    _check_labels(lpath, label_rows, tasks, docs, problems)
    if manifest is not None:
        _check_manifest(data_dir, manifest, {"documents": n_docs, "tasks": n_tasks, "labels": n_labels}, problems)
    if against is not None:
        problems.extend(check_overlap(data_dir, Path(against)))
    return problems


def check_overlap(data_dir: Path, other_dir: Path) -> list[Problem]:
    """Task ids or questions shared between two prepared folders (train/dev leakage)."""
    other_path = other_dir / "tasks.jsonl"
    kind = file_kind_problem(other_path, "the tasks of the folder given with --against")
    if kind is not None:
        what = "missing, expected the tasks of the folder given with --against" if kind == "no such file" else kind
        return [Problem(str(other_path), None, "file", what)]
    problems: list[Problem] = []
    ids: dict[str, int] = {}
    questions: dict[str, int] = {}
    try:
        for lineno, obj in iter_jsonl(other_path):
            if isinstance(obj, dict):
                ids.setdefault(str(obj.get("id")), lineno)
                questions.setdefault(normalize_question(str(obj.get("question", ""))), lineno)
        for lineno, obj in iter_jsonl(data_dir / "tasks.jsonl"):
            if not isinstance(obj, dict):
                continue
            tid, q = str(obj.get("id")), normalize_question(str(obj.get("question", "")))
            if tid in ids:
                problems.append(
                    Problem(
                        str(data_dir / "tasks.jsonl"),
                        lineno,
                        "id",
                        f"{tid!r} also in {other_path}:{ids[tid]}, expected no id shared between splits",
                    )
                )
            if q in questions:
                problems.append(
                    Problem(
                        str(data_dir / "tasks.jsonl"),
                        lineno,
                        "question",
                        f"also in {other_path}:{questions[q]}, expected no question shared between splits",
                    )
                )
    except InputError as exc:
        problems.extend(exc.problems)
    return problems
