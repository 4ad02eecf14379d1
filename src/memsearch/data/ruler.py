"""RULER-HQA-style long contexts from a prepared dev set (``memsearch prepare-ruler``).

For each question: keep its own paragraphs, add ``N - own`` other distinct paragraphs drawn
from the rest of the dev pool, shuffle, and render as ``Document {i}:\\n{title}\\n{text}``
joined by blank lines (MemAgent's construction; ``i`` counts from 1). One folder ``docs{N}``
per N, with the usual three files: a task's ``doc_ids`` are the documents of its context in
rendered order (the context is carried by reference; ``render_context`` rebuilds it), and
labels add ``gold_positions``, the ``Document {i}`` numbers of the gold documents.

Randomness: one ``random.Random`` per (seed, N, task id), so results do not depend on
``--limit`` or on the order N values are given, and the same inputs give byte-identical
outputs. MemAgent's own files used a different sampler; sets built here are "in the style of"
RULER-HQA, not copies of it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tqdm import tqdm

from memsearch.data.dataset import Dataset, load_dataset, read_manifest, save_dataset
from memsearch.data.records import Document, Task
from memsearch.errors import InputError
from memsearch.io import atomic_output_dir

BUILDER_VERSION = "ruler-hqa-1"


CONTEXT_SEPARATOR = "\n\n"


def context_blocks(doc_ids: Iterable[str], documents: Mapping[str, Document]) -> list[str]:
    """The ``Document {i}:\\n{title}\\n{text}`` blocks of a long context, ``i`` from 1."""
    return [f"Document {i}:\n{documents[d].title}\n{documents[d].text}" for i, d in enumerate(doc_ids, start=1)]


def render_context(doc_ids: Iterable[str], documents: Mapping[str, Document]) -> str:
    """The long context of a task: its blocks joined by blank lines."""
    return CONTEXT_SEPARATOR.join(context_blocks(doc_ids, documents))


def _build_one(dev: Dataset, n_docs: int, seed: int, limit: int | None, show_progress: bool = False) -> Dataset:
    pool = [d.doc_id for d in dev.documents]
    labels = dev.labels_by_id()
    tasks, out_labels, used = [], [], set()
    for task in tqdm(dev.tasks[:limit], desc=f"docs{n_docs}", unit="task", disable=not show_progress):
        own = list(dict.fromkeys(task.doc_ids))
        if n_docs < len(own):
            raise InputError(
                f"--docs {n_docs}: task {task.id} already has {len(own)} paragraphs; N must be at least that"
            )
        own_set = set(own)
        rng = random.Random(f"{seed}/{n_docs}/{task.id}")
        others = rng.sample([d for d in pool if d not in own_set], n_docs - len(own))
        order = own + others
        rng.shuffle(order)
        used.update(order)
        label = labels[task.id]
        position = {d: i for i, d in enumerate(order, start=1)}
        tasks.append(Task(id=task.id, question=task.question, doc_ids=order))
        out_labels.append(label.model_copy(update={"gold_positions": [position[d] for d in label.gold_doc_ids]}))
    documents = [d for d in dev.documents if d.doc_id in used]
    return Dataset(documents, tasks, out_labels)


def _count_many(tokenizer, texts: list[str]) -> list[int]:
    counter = getattr(tokenizer, "count_many", None)
    return counter(texts) if counter else [tokenizer.count(t) for t in texts]


def context_token_lengths(dataset: Dataset, tokenizer, verify: int = 3) -> tuple[list[int], str]:
    """Token length of every rendered context, and how it was counted.

    Tokenizing 1000 contexts of 100K tokens takes minutes, but the rendering is made of blocks
    (``Document {i}:\\n``, then ``{title}\\n{text}`` with the blank line after it) that meet
    where pre-tokenizers split, so a context's count is the sum of its blocks' counts. The sum is
    checked against a full count of the first ``verify`` contexts; on any difference every
    context is counted in full instead.
    """
    docs = dataset.documents_by_id()
    ids = [d.doc_id for d in dataset.documents]
    body = [f"{docs[d].title}\n{docs[d].text}" for d in ids]
    # A block followed by the blank line and the next header is counted together with that
    # boundary ("...text\n\nDocument" minus "Document"): white space at the end of a paragraph
    # can merge with the newlines into one token, which separate counts would miss.
    inner = dict(
        zip(ids, (n - tokenizer.count("Document") for n in _count_many(tokenizer, [b + "\n\nDocument" for b in body])))
    )
    last = dict(zip(ids, _count_many(tokenizer, body)))
    longest = max(len(t.doc_ids) for t in dataset.tasks)
    header = _count_many(tokenizer, [f"Document {i}:\n" for i in range(1, longest + 1)])
    summed = [
        sum(header[: len(t.doc_ids)]) + sum(inner[d] for d in t.doc_ids[:-1]) + last[t.doc_ids[-1]]
        for t in dataset.tasks
    ]
    head = dataset.tasks[:verify]
    exact = _count_many(tokenizer, [render_context(t.doc_ids, docs) for t in head])
    if exact == summed[: len(head)]:
        return summed, f"sum of per-block counts, equal to a full count on the first {len(head)} contexts"
    full = []
    for start in range(0, len(dataset.tasks), 8):  # small batches: contexts can be 100K+ tokens
        full += _count_many(tokenizer, [render_context(t.doc_ids, docs) for t in dataset.tasks[start : start + 8]])
    return full, "full count of every context"


def context_stats(dataset: Dataset, tokenizer) -> dict[str, Any]:
    """SHA-256 over all rendered contexts (proves rendering is deterministic too) and their
    length in tokens of ``tokenizer`` (``None`` to skip counting)."""
    docs = dataset.documents_by_id()
    digest = hashlib.sha256()
    for task in dataset.tasks:
        digest.update(render_context(task.doc_ids, docs).encode("utf-8"))
        digest.update(b"\0")
    stats: dict[str, Any] = {"context_sha256": digest.hexdigest()}
    if tokenizer is not None:
        lengths, method = context_token_lengths(dataset, tokenizer)
        stats["context_tokens"] = {
            "tokenizer": tokenizer.name,
            "mean": round(sum(lengths) / len(lengths), 1),
            "min": min(lengths),
            "max": max(lengths),
            "counted_as": method,
        }
    return stats


def prepare_ruler(
    input_dir: str | Path,
    out: str | Path,
    docs: list[int],
    seed: int = 42,
    limit: int | None = None,
    tokenizer=None,
    show_progress: bool = True,
    allow_train: bool = False,
) -> dict[int, dict[str, Any]]:
    """Write ``out/docs{N}`` for each N in ``docs``; returns each folder's manifest.

    RULER-HQA sets come from dev. ``allow_train`` builds the same kind of contexts from a
    train set (questions and distractors both from train; the manifest keeps split "train"),
    the long-context training data of ``memsearch pipeline memagent``.
    """
    dev = load_dataset(input_dir)
    split = dev.manifest.get("split")
    if split != "dev" and not (allow_train and split == "train"):
        raise InputError(
            f"{input_dir}: manifest split is {split!r}; RULER-HQA sets are built from a prepared dev set only"
        )
    if not docs or any(n < 1 for n in docs) or len(set(docs)) != len(docs):
        raise InputError(f"--docs {docs}: expected distinct positive numbers of documents, e.g. 50,200,800")
    if limit is not None and limit < 1:
        raise InputError(f"--limit {limit}: expected a positive number of questions")
    too_big = [n for n in docs if n > len(dev.documents)]
    if too_big:
        raise InputError(
            f"--docs {too_big}: larger than the dev pool of {len(dev.documents)} distinct paragraphs in {input_dir}; "
            "prepare more dev examples or choose a smaller N"
        )
    manifests = {}
    with atomic_output_dir(out) as tmp:
        for n_docs in docs:
            dataset = _build_one(dev, n_docs, seed, limit, show_progress)
            dataset.manifest = {
                "kind": "ruler-hqa",
                "split": split,
                "layout": "long-context",
                "evidence_granularity": dev.manifest.get("evidence_granularity", "sentence"),
                "builder": BUILDER_VERSION,
                "num_docs": n_docs,
                "seed": seed,
                "pool_size": len(dev.documents),
                "render": "Document {i}:\\n{title}\\n{text}, i from 1, joined by blank lines",
                "source": {"kind": dev.manifest.get("kind"), "files": dev.manifest.get("files")},
                "options": {"limit": limit},
                **context_stats(dataset, tokenizer),
            }
            save_dataset(dataset, tmp / f"docs{n_docs}")
            manifests[n_docs] = read_manifest(tmp / f"docs{n_docs}")
    return manifests
