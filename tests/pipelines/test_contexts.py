"""The context lengths quoted in docs/memagent.md and configs/memagent.toml are the figures the
code measures (``memsearch.pipelines.memagent.contexts``) on the shipped dev sample with the recipe's
tokenizer and chunk size, recorded in docs/results/memagent_contexts.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.pipelines.memagent.config import MemAgentPipeline
from memsearch.pipelines.memagent.contexts import measure_recipe

ROOT = Path(__file__).resolve().parents[2]
MEMAGENT = ROOT / "configs" / "memagent.toml"
RECORD = ROOT / "docs" / "results" / "memagent_contexts.json"
DOC = ROOT / "docs" / "memagent.md"


def kilo(tokens: float) -> str:
    """How the docs round a token count: ~121K."""
    return f"~{tokens / 1000:.0f}K"


def doc_rows(record: dict) -> list[str]:
    """The table rows docs/memagent.md must hold, built from the record."""
    return [f"| {n} | {s['tokens_mean']:,.0f} ({s['tokens_min']:,}–{s['tokens_max']:,}) | {s['chunks_mean']:.1f} "
            f"({s['chunks_max']}) | {s['questions_over_max_chunks']} |" for n, s in record["sets"].items()]


def test_the_record_was_measured_with_the_recipe():
    cfg = load_config(MEMAGENT, model=MemAgentPipeline)
    record = json.loads(RECORD.read_text())
    assert (record["dev"], record["questions"], record["seed"]) == (cfg.data.dev, cfg.data.questions, cfg.data.seed)
    assert (record["chunk_tokens"], record["max_chunks"]) == (
        cfg.episode.budgets.chunk_tokens,
        cfg.episode.budgets.max_chunks,
    )
    assert record["tokenizer"].startswith("hf:embedded") and list(record["sets"]) == [str(n) for n in cfg.data.docs]
    assert all(s["questions"] == cfg.data.questions for s in record["sets"].values())


def test_docs_and_config_quote_the_measured_figures():
    record = json.loads(RECORD.read_text())
    doc = DOC.read_text()
    for row in doc_rows(record):
        assert row in doc, row
    means = [kilo(s["tokens_mean"]) for s in record["sets"].values()]
    assert f"N = 50, 200, 800 documents (mean {', '.join(means)} tokens" in doc
    longest = record["sets"]["800"]
    assert f"N = 800 needs up to {longest['chunks_max']}" in doc
    toml = MEMAGENT.read_text()
    assert f"mean {', '.join(means[:-1])} and {means[-1]} tokens of context" in toml
    assert f"800 documents need up to {longest['chunks_max']} chunks" in toml


@pytest.mark.slow
def test_the_measurement_reproduces_the_record():
    """Re-measure the smallest N (seconds) with the code: the record is that code's output."""
    record = json.loads(RECORD.read_text())
    fresh = measure_recipe(load_config(MEMAGENT, model=MemAgentPipeline), docs=[50])
    assert fresh["sets"]["50"] == record["sets"]["50"]
    assert fresh["tokenizer"] == record["tokenizer"]
