"""MuSiQue-Ans → memsearch data folder (``memsearch prepare-musique``).

MuSiQue marks support per paragraph (``is_supporting``), not per sentence, so each paragraph
becomes a document with one "sentence" (the whole paragraph) and evidence ids point at
paragraphs (``evidence_granularity = "paragraph"`` in the manifest). Splitting paragraphs into
sentences would invent a finer support than the labels give.

Accepts the original records (a JSON list or JSON lines) and their Hugging Face exports: JSON
lines look the same; parquet stores each list of objects as a list of arrow structs, which
reads back as the same list of dicts. A ``datasets`` ``Sequence`` of a dict stores such a list as
parallel lists instead (``paragraphs = {title: [...], paragraph_text: [...], ...}``): both read.
"""

from __future__ import annotations

from typing import Any

from memsearch.data.convert import SourceConverter, SourceFormat
from memsearch.data.dataset import DocumentPool
from memsearch.data.records import Label, Task, evidence_id, has_visible_text
from memsearch.data.source import SourceRecord, check_unique_id

CONVERTER_VERSION = "musique-1"
FORMAT = SourceFormat(kind="musique", evidence_granularity="paragraph", converter=CONVERTER_VERSION)
# _objects' answer for parallel lists of different lengths (already reported).
_MISMATCHED = object()


def _objects(record: SourceRecord, name: str) -> Any:
    """``record[name]``, with the parallel-lists layout (a dict of equal-length lists, one per
    field) turned into the list of objects it stands for; any other value is returned as is."""
    raw = record.obj.get(name)
    if not (isinstance(raw, dict) and raw and all(isinstance(v, list) for v in raw.values())):
        return raw
    sizes = {key: len(values) for key, values in raw.items()}
    if len(set(sizes.values())) > 1:
        record.problem(name, f"parallel lists of different lengths ({', '.join(f'{k}: {n}' for k, n in sizes.items())}"
                       "), expected one entry per item in each")
        return _MISMATCHED
    return [dict(zip(raw, values)) for values in zip(*raw.values())]


def _paragraphs(record: SourceRecord) -> list[tuple[str, str, bool]] | None:
    raw = _objects(record, "paragraphs")
    if raw is _MISMATCHED:
        return None
    if not isinstance(raw, list):
        record.get("paragraphs", list, "a list of {title, paragraph_text, is_supporting}")  # says what is there
        return None
    out = []
    for i, para in enumerate(raw):
        path = f"paragraphs[{i}]"
        title = record.get("title", str, "a string", para, f"{path}.title")
        text = record.get("paragraph_text", str, "a string", para, f"{path}.paragraph_text")
        support = record.get("is_supporting", bool, "true or false", para, f"{path}.is_supporting")
        if title is None or text is None or support is None:
            return None
        if not has_visible_text(text):
            # The prepared folder's loader refuses a paragraph without text: refuse it here, not after writing.
            record.problem(f"{path}.paragraph_text", f"got {text!r:.40}: no visible text, expected the paragraph text")
            return None
        out.append((title, text, support))
    if not out:
        record.problem("paragraphs", "empty, expected at least one paragraph")
        return None
    return out


def _decomposition(record: SourceRecord) -> list[dict[str, str]] | None:
    raw = _objects(record, "question_decomposition")
    if raw is None or raw is _MISMATCHED:
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


# Why a record is skipped rather than converted, as counted in the manifest's "skipped".
UNANSWERABLE = "answerable: false"


def _convert_record(
    record: SourceRecord, pool: DocumentPool, seen: dict[str, int]
) -> tuple[Task, Label] | str | None:
    task_id = record.get("id", str, "the example id string")
    answerable = record.obj.get("answerable", True)
    if not isinstance(answerable, bool):
        record.problem("answerable", f"got {answerable!r:.40}, expected true or false")
        return None
    if not answerable:
        # MuSiQue-Full's unanswerable questions have no answer to score: skipped and counted (the
        # summary line and the manifest say how many), never converted as ordinary tasks.
        if task_id is not None:
            check_unique_id(record, "id", task_id, seen)
        return UNANSWERABLE
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
    if not task_id:
        record.problem("id", "empty, expected the example id")
        return None
    if not has_visible_text(question):
        record.problem("question", "empty, expected the question text")
        return None
    for field, text in (("answer", answer), *((f"answer_aliases[{i}]", a) for i, a in enumerate(aliases))):
        if not has_visible_text(text):
            record.problem(field, f"got {text!r:.40}: no visible text, expected a gold answer (a blank one could "
                           "never be scored, or would score a blank prediction as correct)")
            return None
    doc_ids, support = [], []
    for title, text, is_supporting in paragraphs:
        doc_id = pool.add(title, [text])
        doc_ids.append(doc_id)
        if is_supporting and doc_id not in support:
            support.append(doc_id)
    answers = list(dict.fromkeys([answer, *aliases]))
    qtype = task_id.split("__", 1)[0] if "__" in task_id else None
    # The same paragraph twice in a record is one document: list it once (the loader refuses repeats).
    task = Task(id=task_id, question=question, doc_ids=list(dict.fromkeys(doc_ids)))
    label = Label(
        id=task_id,
        answers=answers,
        supporting_facts=[evidence_id(d, 0) for d in support],
        gold_doc_ids=support,
        type=qtype,
        decomposition=decomposition,
    )
    return task, label


# Registered as "musique" in data.converters (``memsearch data prepare-musique``).
READS = ("MuSiQue-Ans: the original JSON list or JSON lines, or a Hugging Face export "
         "(parquet or JSON lines; parquet needs pyarrow)")
CONVERTER = SourceConverter("musique", FORMAT, READS, _convert_record)


# ``convert_musique(path, split, limit, show_progress)``: the file as a ``Dataset`` in memory, every
# problem raised together as one ``InputError``; ``prepare_musique(path, out, ...)``: straight into the new
# folder ``out`` (memory does not grow with the source) and its manifest returned. Records marked
# ``"answerable": false`` are skipped and counted (manifest ``skipped``).
convert_musique, prepare_musique = CONVERTER.convert, CONVERTER.prepare
