"""Context lengths of the MemAgent recipe's evaluation sets, measured by the code that builds and
reads them (the figures ``docs/memagent.md`` quotes come from here):

    uv run python -m memsearch.pipelines.memagent.contexts --config configs/memagent.toml \\
        --out docs/results/memagent_contexts.json

For each N of ``data.docs`` the RULER-HQA-style set is built as the pipeline's prepare stage
builds it (``data.dev``, the first ``data.questions``, ``data.seed``, the model's tokenizer),
then every context is cut into chunks as the engine cuts it (``engine.evidence.chunk_context``
at ``budgets.chunk_tokens``). Per N: context tokens (mean, min, max), chunks per question
(mean, max) and how many questions need more than ``budgets.max_chunks`` chunks.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from memsearch.data.dataset import Dataset
from memsearch.io import write_json


def measure_set(dataset: Dataset, tokenizer, chunk_tokens: int, max_chunks: int) -> dict[str, Any]:
    """Context tokens and chunk counts of every question of a long-context set."""
    from memsearch.engine.evidence import chunk_context

    docs = dataset.documents_by_id()
    tokens, chunks = [], []
    for task in dataset.tasks:
        context, chunked = chunk_context(task.doc_ids, docs, tokenizer, chunk_tokens, max_chunks)
        tokens.append(tokenizer.count(context))
        chunks.append(chunked.total_chunks)
    return {"questions": len(tokens), "tokens_mean": round(sum(tokens) / len(tokens), 1), "tokens_min": min(tokens),
            "tokens_max": max(tokens), "chunks_mean": round(sum(chunks) / len(chunks), 2), "chunks_max": max(chunks),
            "questions_over_max_chunks": sum(c > max_chunks for c in chunks)}


def measure_recipe(cfg, docs: list[int] | None = None) -> dict[str, Any]:
    """Measure every N of ``docs`` (default: the recipe's ``data.docs``) for a ``MemAgentPipeline``."""
    from memsearch.data.dataset import load_dataset, save_dataset
    from memsearch.data.ruler import prepare_ruler
    from memsearch.tokenizer import load_tokenizer

    docs = list(docs or cfg.data.docs)
    budgets = cfg.episode.budgets
    tokenizer = load_tokenizer(cfg.episode.tokenizer)
    result: dict[str, Any] = {"dev": cfg.data.dev, "questions": cfg.data.questions, "seed": cfg.data.seed,
                              "tokenizer": tokenizer.name, "chunk_tokens": budgets.chunk_tokens,
                              "max_chunks": budgets.max_chunks, "sets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        dev = Path(tmp) / "dev"
        save_dataset(cfg.data.convert(cfg.data.dev, "dev"), dev)
        prepare_ruler(dev, Path(tmp) / "ruler", docs, seed=cfg.data.seed, limit=cfg.data.questions, tokenizer=None,
                      show_progress=False)
        for n in docs:
            dataset = load_dataset(Path(tmp) / "ruler" / f"docs{n}")
            result["sets"][str(n)] = measure_set(dataset, tokenizer, budgets.chunk_tokens, budgets.max_chunks)
    return result


def main(argv: list[str] | None = None) -> None:
    """Command line: measure the recipe of ``--config`` and write the record to ``--out``."""
    from memsearch.config import load_config
    from memsearch.pipelines.memagent.config import MemAgentPipeline

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/memagent.toml")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--set", action="append", default=[], dest="overrides", help="key=value, as memsearch --set")
    args = parser.parse_args(argv)
    result = measure_recipe(load_config(args.config, args.overrides, model=MemAgentPipeline))
    write_json(args.out, result)  # strict JSON, as every record the package writes
    for n, s in result["sets"].items():
        print(f"N={n}: tokens mean {s['tokens_mean']} (min {s['tokens_min']}, max {s['tokens_max']}), chunks mean "
              f"{s['chunks_mean']}, max {s['chunks_max']} of {result['max_chunks']}, over the limit "
              f"{s['questions_over_max_chunks']}")


if __name__ == "__main__":
    main()
