"""HotpotQA → memsearch data folder (``memsearch prepare-hotpot``).

Accepts the original layout (a JSON list with ``_id``, ``context = [[title, [sentence, ...]],
...]``, ``supporting_facts = [[title, sent_id], ...]``), the same records as JSON lines, and the
Hugging Face ``hotpot_qa`` layout (``id``; ``context = {title: [...], sentences: [[...]]}``;
``supporting_facts = {title: [...], sent_id: [...]}``) as JSON lines or parquet (the Hub's files,
``Dataset.to_parquet``; read by ``data/parquet.py``). The layout is read off each record and the
file's bytes, never its name.
"""

from __future__ import annotations

from typing import Any

from memsearch.data.convert import SourceConverter, SourceFormat
from memsearch.data.dataset import DocumentPool
from memsearch.data.records import Label, Task, evidence_id, has_visible_text
from memsearch.data.source import SourceRecord, check_unique_id

CONVERTER_VERSION = "hotpot-1"
FORMAT = SourceFormat(kind="hotpotqa", evidence_granularity="sentence", converter=CONVERTER_VERSION)


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
            reversed_hint = " (this item looks reversed: [sentences, title])" if isinstance(sentences, str) else ""
            record.problem(f"context[{i}].title", f"got {title!r:.60}, expected a string{reversed_hint}")
            return None
        sentences = record.str_list(sentences, f"context[{i}].sentences", "a non-empty list of sentence strings")
        if sentences is None:
            return None
        if not any(has_visible_text(s) for s in sentences):
            # The prepared folder's loader refuses such a paragraph: refuse it here, not after writing.
            record.problem(f"context[{i}].sentences", "every sentence is blank (white space or invisible characters "
                           "only), expected at least one sentence with visible text")
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
            flipped = isinstance(sent, str) and isinstance(title, int) and not isinstance(title, bool)
            record.problem(
                f"supporting_facts[{i}]",
                f"got [{title!r:.40}, {sent!r:.40}], expected [title string, integer sentence index]"
                + (" (this pair looks reversed)" if flipped else ""),
            )
            return None
    return pairs


def _positions_by_title(context: list[tuple[str, list[str]]]) -> dict[str, list[int]]:
    """Each title's positions in the context, in order."""
    positions: dict[str, list[int]] = {}
    for i, (title, _) in enumerate(context):
        positions.setdefault(title, []).append(i)
    return positions


def _fact_paragraph(record: SourceRecord, i: int, title: str, sent: int, positions: dict[str, list[int]],
                    context: list[tuple[str, list[str]]], doc_ids: list[str]) -> int | None:
    """The context position supporting fact ``i`` (``[title, sent]``) points at, or ``None``
    with the problem recorded: its title must name one paragraph (two different paragraphs under
    one title would make the first, perhaps a decoy, silently gold), and the sentence must exist
    and have text (the validator refuses support on a blank sentence)."""
    field = f"supporting_facts[{i}]"
    if title not in positions:
        record.problem(field, f"title {title!r} is not in the example's context, expected one of its paragraph titles")
        return None
    distinct = list(dict.fromkeys(doc_ids[j] for j in positions[title]))
    if len(distinct) > 1:
        where = " and ".join(f"context[{j}]" for j in positions[title])
        record.problem(field, f"title {title!r} names {len(positions[title])} different paragraphs ({where}: a "
                       "duplicate title), expected each title once so that the fact points at one paragraph")
        return None
    j = positions[title][0]
    if not 0 <= sent < len(context[j][1]):
        record.problem(field, f"sentence {sent} of {title!r} does not exist, expected 0..{len(context[j][1]) - 1}")
        return None
    if not has_visible_text(context[j][1][sent]):
        record.problem(field, f"sentence {sent} of {title!r} is blank, expected a sentence with visible text")
        return None
    return j


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
    if not task_id:
        record.problem(id_key, "empty, expected the example id")
        return None
    if not has_visible_text(question):
        record.problem("question", "empty, expected the question text")
        return None
    if not has_visible_text(answer):
        record.problem("answer", f"got {answer!r:.40}: no visible text, expected the gold answer (a task without one "
                       "could never be scored)")
        return None

    positions = _positions_by_title(context)
    doc_ids = [pool.add(title, sentences) for title, sentences in context]
    support, gold = [], []
    ok = True
    for i, (title, sent) in enumerate(facts):
        j = _fact_paragraph(record, i, title, sent, positions, context, doc_ids)
        if j is None:
            ok = False
            continue
        eid = evidence_id(doc_ids[j], sent)
        if eid not in support:
            support.append(eid)
        if doc_ids[j] not in gold:
            gold.append(doc_ids[j])
    if not ok:
        return None
    # The same paragraph twice in a context is one document: list it once (the loader refuses repeats).
    task = Task(id=task_id, question=question, doc_ids=list(dict.fromkeys(doc_ids)))
    label = Label(id=task_id, answers=[answer], supporting_facts=support, gold_doc_ids=gold, type=qtype, level=level)
    return task, label


# Registered as "hotpot" in data.converters (``memsearch data prepare-hotpot``).
READS = ("HotpotQA: the original JSON list or JSON lines, or the Hugging Face hotpot_qa layout "
         "(parquet or JSON lines; parquet needs pyarrow)")
CONVERTER = SourceConverter("hotpot", FORMAT, READS, _convert_record)


# ``convert_hotpot(path, split, limit, show_progress)``: the file as a ``Dataset`` in memory, every
# problem raised together as one ``InputError``; ``prepare_hotpot(path, out, ...)``: straight into the new
# folder ``out`` (memory does not grow with the source) and its manifest returned.
convert_hotpot, prepare_hotpot = CONVERTER.convert, CONVERTER.prepare
