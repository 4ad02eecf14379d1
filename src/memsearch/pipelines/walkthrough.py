"""The walk-through on the shipped samples (``memsearch walkthrough``).

Runs the data path a researcher uses before any agent: convert real HotpotQA dev and train
samples, validate them (including train/dev leakage), build a BM25 index, measure how often
retrieval surfaces the gold paragraphs, show a search with evidence ids, exercise the memory
store's rules, and build RULER-HQA-style long contexts. Every output lands in one new folder.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from memsearch.io import write_json


def gold_doc_recall(retriever, tasks, labels, k: int, scope: str) -> float:
    """Mean fraction of each task's gold documents among the top ``k`` retrieved with the
    question as query (``scope`` "candidates" restricts to the task's own paragraphs)."""
    by_id = {lab.id: lab for lab in labels}
    candidates = [t.doc_ids for t in tasks] if scope == "candidates" else None
    results = retriever.search_many([t.question for t in tasks], k=k, candidates=candidates)
    total = 0.0
    for task, passages in zip(tasks, results):
        gold = set(by_id[task.id].gold_doc_ids)
        total += len(gold & {p.doc_id for p in passages}) / len(gold) if gold else 1.0
    return total / len(tasks)


def run_walkthrough(out: Path | None, echo: Callable[[str], None] = print) -> Path:
    from memsearch.assets.samples import HOTPOT_DEV, HOTPOT_TRAIN, samples_dir
    from memsearch.data.converters import source_converter
    from memsearch.data.dataset import load_dataset, save_dataset
    from memsearch.data.ruler import prepare_ruler
    from memsearch.data.validate import validate_data
    from memsearch.errors import InputError
    from memsearch.memory import Add, Memory
    from memsearch.pipelines.demo import fresh_run_dir
    from memsearch.retrieval import BM25Retriever
    from memsearch.tokenizer import load_tokenizer

    out = Path(out) if out is not None else fresh_run_dir("walkthrough")
    if out.exists():
        raise InputError(f"{out}: output folder already exists; choose a new folder (nothing was written)")
    started = time.perf_counter()
    samples = samples_dir()
    summary: dict = {}

    echo(f"1. prepare real HotpotQA samples into {out}/data")
    dev_dir, train_dir = out / "data" / "hotpot-dev", out / "data" / "hotpot-train"
    hotpot = source_converter("hotpot")  # the shipped samples are HotpotQA
    save_dataset(hotpot.convert(samples / HOTPOT_DEV, split="dev"), dev_dir)
    save_dataset(hotpot.convert(samples / HOTPOT_TRAIN, split="train"), train_dir)
    dev, train = load_dataset(dev_dir), load_dataset(train_dir)
    echo(f"   dev: {len(dev.tasks)} questions, {len(dev.documents)} paragraphs; train: {len(train.tasks)} questions")

    echo("2. validate (schemas, references, supporting facts, label leakage, hashes, train/dev overlap)")
    problems = validate_data(dev_dir, against=train_dir) + validate_data(train_dir, against=dev_dir)
    for problem in problems:
        echo(f"   {problem}")
    if problems:
        raise InputError(f"{len(problems)} validation problem(s); see above")
    echo("   both splits valid, no shared id or question")

    echo("3. build a BM25 index over the dev corpus")
    t0 = time.perf_counter()
    retriever = BM25Retriever.build(dev.documents)
    retriever.save(out / "index")
    retriever = BM25Retriever.load(out / "index")
    echo(f"   {len(retriever)} paragraphs indexed in {time.perf_counter() - t0:.1f}s -> {out}/index")

    t0 = time.perf_counter()
    recall = {
        "candidates@2": gold_doc_recall(retriever, dev.tasks, dev.labels, 2, "candidates"),
        "candidates@4": gold_doc_recall(retriever, dev.tasks, dev.labels, 4, "candidates"),
        "corpus@10": gold_doc_recall(retriever, dev.tasks, dev.labels, 10, "corpus"),
    }
    summary["gold_doc_recall"] = {key: round(value, 4) for key, value in recall.items()}
    echo(
        f"   gold-paragraph recall with the question as the only query ({len(dev.tasks)} questions, "
        f"{time.perf_counter() - t0:.1f}s):"
    )
    for key, value in recall.items():
        echo(f"     {key:<13} {value:.3f}")

    task = dev.tasks[0]
    echo(f"4. search (scope 'candidates') for: {task.question}")
    passages = retriever.search(task.question, k=2, candidates=task.doc_ids)
    for p in passages:
        echo(f"   #{p.rank + 1} {p.doc_id} {p.title} (score {p.score:.2f})")
        for eid, sentence in p.sentences[:2]:
            echo(f"      [{eid}] {sentence.strip()[:100]}")

    tokenizer = load_tokenizer("embedded")
    echo(f"5. memory store (budget 64 tokens of {tokenizer.name})")
    memory = Memory(tokenizer, budget_tokens=64)
    shown = {eid for p in passages for eid, _ in p.sentences}
    first = passages[0].sentences[0]
    attempts = [
        ("ADD a fact citing shown evidence", [Add(first[1].strip(), (first[0],))]),
        ("ADD a fact citing evidence never shown", [Add("Invented fact.", ("d999:0",))]),
        (
            "ADD a long fact past the budget",
            [Add(" ".join(s for _, s in passages[-1].sentences), (passages[-1].sentences[0][0],))],
        ),
    ]
    for what, ops in attempts:
        result = memory.apply(ops, shown)
        echo(f"   {what}: {result.status}" + (f" ({result.reason})" if result.reasons else ""))
    echo(f"   memory now ({memory.tokens()} tokens):\n      " + memory.render().replace("\n", "\n      "))

    echo("6. RULER-HQA-style long contexts (first 50 dev questions, N = 50 and 200)")
    manifests = prepare_ruler(
        dev_dir, out / "data" / "ruler", [50, 200], limit=50, tokenizer=tokenizer, show_progress=False
    )
    summary["ruler_context_tokens"] = {}
    for n, manifest in manifests.items():
        stats = manifest["context_tokens"]
        summary["ruler_context_tokens"][str(n)] = stats["mean"]
        echo(
            f"   N={n}: mean {stats['mean']:.0f} tokens (min {stats['min']}, max {stats['max']}) -> "
            f"{out}/data/ruler/docs{n}"
        )

    summary["seconds"] = round(time.perf_counter() - started, 1)
    write_json(out / "summary.json", summary)
    echo(f"done in {summary['seconds']}s; everything is in {out}")
    return out
