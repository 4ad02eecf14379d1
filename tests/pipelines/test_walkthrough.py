"""`memsearch demo` (the walk-through) end to end on the shipped samples."""

from __future__ import annotations

import json

import pytest

from memsearch.errors import InputError
from memsearch.pipelines.walkthrough import run_walkthrough


@pytest.mark.slow
def test_walkthrough_runs_on_shipped_samples(tmp_path):
    lines: list[str] = []
    out = run_walkthrough(tmp_path / "demo", echo=lines.append)
    summary = json.loads((out / "summary.json").read_text())
    # BM25 over the real dev sample is deterministic: these are the measured figures.
    assert summary["gold_doc_recall"] == {"candidates@2": 0.58, "candidates@4": 0.7235, "corpus@10": 0.8615}
    assert set(summary["ruler_context_tokens"]) == {"50", "200"}
    assert 5000 < summary["ruler_context_tokens"]["50"] < summary["ruler_context_tokens"]["200"]
    for sub in ("data/hotpot-dev", "data/hotpot-train", "index", "data/ruler/docs50", "data/ruler/docs200"):
        assert (out / sub).is_dir(), sub
    text = "\n".join(lines)
    assert "ADD a fact citing shown evidence: applied" in text
    assert "source 'd999:0' was not shown to the agent" in text
    assert "over the budget of 64 tokens" in text


def test_walkthrough_refuses_existing_folder(tmp_path):
    with pytest.raises(InputError, match="already exists"):
        run_walkthrough(tmp_path, echo=lambda _: None)
