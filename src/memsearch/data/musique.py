"""MuSiQue-Ans → memsearch data folder (``memsearch prepare-musique``).

MuSiQue marks support per paragraph (``is_supporting``), not per sentence, so each paragraph
becomes a document with one "sentence" (the whole paragraph) and evidence ids point at
paragraphs (``evidence_granularity = "paragraph"`` in the manifest). Splitting paragraphs into
sentences would invent a finer support than the labels give.
"""

from __future__ import annotations

from pathlib import Path

from memsearch.data.convert import convert_source
from memsearch.data.dataset import Dataset, DocumentPool
from memsearch.data.records import Label, Task, evidence_id, has_visible_text
from memsearch.data.source import SourceRecord, check_unique_id

CONVERTER_VERSION = "musique-1"


def _paragraphs(record: SourceRecord) -> list[tuple[str, str, bool]] | None:
    raw = record.get("paragraphs", list, "a list of {title, paragraph_text, is_supporting}")
    if raw is None:
        return None
    out = []
    for i, para in enumerate(raw):
        path = f"paragraphs[{i}]"
        title = record.get("title", str, "a string", para, f"{path}.title")
        text = record.get("paragraph_text", str, "a string", para, f"{path}.paragraph_text")
        support = record.get("is_supporting", bool, "true or false", para, f"{path}.is_supporting")
        if title is None or text is None or support is None:
            return None
        out.append((title, text, support))
    if not out:
        record.problem("paragraphs", "empty, expected at least one paragraph")
        return None
    return out


def _decomposition(record: SourceRecord) -> list[dict[str, str]] | None:
    raw = record.obj.get("question_decomposition")
    if raw is None:
        return None
    if not isinstance(raw, list):
        record.problem("question_decomposition", "not a list, expected a list of {question, answer}")
        return None
    steps = []
    for i, step in enumerate(raw):
        q = record.get("question", str, "a string", step, f"question_decomposition[{i}].question")
        a = record.get("answer", str, "a string", step, f"question_decomposition[{i}].answer")
        if q is None or a is None:
            return None
        steps.append({"question": q, "answer": a})
    return steps


def _convert_record(record: SourceRecord, pool: DocumentPool, seen: dict[str, int]) -> tuple[Task, Label] | None:
    task_id = record.get("id", str, "the example id string")
    question = record.get("question", str, "the question string")
    answer = record.get("answer", str, "the answer string")
    aliases = record.obj.get("answer_aliases", [])
    if record.str_list(aliases, "answer_aliases", "a list of alias strings", allow_empty=True) is None:
        aliases = None
    paragraphs = _paragraphs(record)
    decomposition = _decomposition(record)
    if task_id is not None and not check_unique_id(record, "id", task_id, seen):
        return None
    if None in (task_id, question, answer, aliases, paragraphs):
        return None
    if not has_visible_text(question):
        record.problem("question", "empty, expected the question text")
        return None
    doc_ids, support = [], []
    for title, text, is_supporting in paragraphs:
        doc_id = pool.add(title, [text])
        doc_ids.append(doc_id)
        if is_supporting and doc_id not in support:
            support.append(doc_id)
    answers = list(dict.fromkeys([answer, *aliases]))
    qtype = task_id.split("__", 1)[0] if "__" in task_id else None
    task = Task(id=task_id, question=question, doc_ids=doc_ids)
    label = Label(
        id=task_id,
        answers=answers,
        supporting_facts=[evidence_id(d, 0) for d in support],
        gold_doc_ids=support,
        type=qtype,
        decomposition=decomposition,
    )
    return task, label


def convert_musique(path: str | Path, split: str = "dev", limit: int | None = None) -> Dataset:
    """Convert a MuSiQue-Ans file (JSON list or JSON lines); problems raise one ``InputError``."""
    return convert_source(path, split, limit, _convert_record, kind="musique", evidence_granularity="paragraph",
                          converter=CONVERTER_VERSION)
