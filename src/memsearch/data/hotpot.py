"""HotpotQA → memsearch data folder (``memsearch prepare-hotpot``).

Accepts the original layout (a JSON list with ``_id``, ``context = [[title, [sentence, ...]],
...]``, ``supporting_facts = [[title, sent_id], ...]``), the same records as JSON lines, and the
Hugging Face ``hotpot_qa`` layout (``id``; ``context = {title: [...], sentences: [[...]]}``;
``supporting_facts = {title: [...], sent_id: [...]}``) as JSON lines or parquet (the Hub's files,
``Dataset.to_parquet``; read by ``data/parquet.py``). The layout is read off each record and the
file's bytes, never its name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memsearch.data.convert import convert_source
from memsearch.data.dataset import Dataset, DocumentPool
from memsearch.data.records import Label, Task, evidence_id, has_visible_text
from memsearch.data.source import SourceRecord, check_unique_id

CONVERTER_VERSION = "hotpot-1"


def _title_pairs(record: SourceRecord, name: str, second: str, second_lists: str, second_plural: str,
                 item_shape: str) -> list[tuple[Any, Any]] | None:
    """``record[name]`` as ``(title, value)`` pairs, from either layout: the original list of
    ``item_shape`` items, or Hugging Face's parallel lists ``{title: [...], <second>: [...]}``
    (``second_lists`` says what the second list holds, ``second_plural`` names its items)."""
    raw = record.obj.get(name)
    if isinstance(raw, dict):  # Hugging Face layout: parallel lists
        titles = record.get("title", list, "a list of titles", raw, f"{name}.title")
        values = record.get(second, list, second_lists, raw, f"{name}.{second}")
        if titles is None or values is None:
            return None
        if len(titles) != len(values):
            record.problem(name, f"{len(titles)} titles but {len(values)} {second_plural}, expected parallel lists")
            return None
        return list(zip(titles, values))
    if isinstance(raw, list):
        pairs = []
        for i, item in enumerate(raw):
            if not (isinstance(item, list) and len(item) == 2):
                record.problem(f"{name}[{i}]", f"got {item!r:.60}, expected {item_shape}")
                return None
            pairs.append((item[0], item[1]))
        return pairs
    record.problem(name, f"missing or not a list, expected [{item_shape}, ...]")
    return None


def _context(record: SourceRecord) -> list[tuple[str, list[str]]] | None:
    pairs = _title_pairs(record, "context", "sentences", "a list of sentence lists", "sentence lists",
                         "[title, [sentence, ...]]")
    if pairs is None:
        return None
    out = []
    for i, (title, sentences) in enumerate(pairs):
        if not isinstance(title, str):
            record.problem(f"context[{i}].title", f"got {title!r:.60}, expected a string")
            return None
        sentences = record.str_list(sentences, f"context[{i}].sentences", "a non-empty list of sentence strings")
        if sentences is None:
            return None
        out.append((title, sentences))
    if not out:
        record.problem("context", "empty, expected at least one paragraph")
        return None
    return out


def _supporting_facts(record: SourceRecord) -> list[tuple[str, int]] | None:
    pairs = _title_pairs(record, "supporting_facts", "sent_id", "a list of sentence indices", "sentence ids",
                         "[title, sentence_index]")
    if pairs is None:
        return None
    for i, (title, sent) in enumerate(pairs):
        if not isinstance(title, str) or isinstance(sent, bool) or not isinstance(sent, int):
            record.problem(
                f"supporting_facts[{i}]",
                f"got [{title!r:.40}, {sent!r}], expected [title string, integer sentence index]",
            )
            return None
    return pairs


def _convert_record(record: SourceRecord, pool: DocumentPool, seen: dict[str, int]) -> tuple[Task, Label] | None:
    id_key = "_id" if "_id" in record.obj else "id"
    task_id = record.get(id_key, str, "the example id (string '_id' or 'id')")
    question = record.get("question", str, "the question string")
    answer = record.get("answer", str, "the answer string")
    context = _context(record)
    facts = _supporting_facts(record)
    qtype, level = record.obj.get("type"), record.obj.get("level")
    bad_meta = False
    for key, value in (("type", qtype), ("level", level)):
        if value is not None and not isinstance(value, str):
            record.problem(key, f"got {value!r:.40}, expected a string")
            bad_meta = True
    # Check the id first so a duplicate is reported even when other fields are broken too.
    if task_id is not None and not check_unique_id(record, id_key, task_id, seen):
        return None
    if bad_meta or None in (task_id, question, answer, context, facts):
        return None
    if not has_visible_text(question):
        record.problem("question", "empty, expected the question text")
        return None

    by_title: dict[str, int] = {}
    for i, (title, _) in enumerate(context):
        by_title.setdefault(title, i)
    doc_ids = [pool.add(title, sentences) for title, sentences in context]
    support, gold = [], []
    ok = True
    for i, (title, sent) in enumerate(facts):
        if title not in by_title:
            record.problem(
                f"supporting_facts[{i}]",
                f"title {title!r} is not in the example's context, expected one of its paragraph titles",
            )
            ok = False
            continue
        j = by_title[title]
        if not 0 <= sent < len(context[j][1]):
            record.problem(
                f"supporting_facts[{i}]",
                f"sentence {sent} of {title!r} does not exist, expected 0..{len(context[j][1]) - 1}",
            )
            ok = False
            continue
        eid = evidence_id(doc_ids[j], sent)
        if eid not in support:
            support.append(eid)
        if doc_ids[j] not in gold:
            gold.append(doc_ids[j])
    if not ok:
        return None
    task = Task(id=task_id, question=question, doc_ids=doc_ids)
    label = Label(id=task_id, answers=[answer], supporting_facts=support, gold_doc_ids=gold, type=qtype, level=level)
    return task, label


def convert_hotpot(path: str | Path, split: str = "dev", limit: int | None = None) -> Dataset:
    """Convert a HotpotQA file (any layout above); all problems are raised together as one ``InputError``."""
    return convert_source(path, split, limit, _convert_record, kind="hotpotqa", evidence_granularity="sentence",
                          converter=CONVERTER_VERSION)
