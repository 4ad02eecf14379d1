"""Adding a memory mode: one strategy class (``engine.memory_modes.MemoryStrategy``), one
``register_memory_mode`` call. Configs may then name it, the config checks read its properties,
and the real engine runs it.

The mode here, "fifo", keeps free-text notes as a log of distinct lines: each memory call's lines
are appended and, over the budget, the oldest lines go first. ``summary`` cuts the end instead, so
on the same questions, under a budget too small for every note, fifo ends with the newest note
and summary with the oldest. Registered with ``answer_format = "boxed"`` the reader is asked for a
``\\boxed{}`` answer and scoring reads the box, as for MemAgent's overwrite mode.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.engine import prompts
from memsearch.engine.memory_modes import (
    MemoryMode,
    make_memory,
    memory_modes,
    register_memory_mode,
    unregister_memory_mode,
)
from memsearch.engine.parsing import evidence_ids_in
from memsearch.errors import InputError
from memsearch.eval.runner import run_eval
from memsearch.records.causes import InvalidCause
from memsearch.records.events import MemoryEvent
from memsearch.records.observation import MemoryView
from memsearch.records.run_summary import RunSummary
from memsearch.tokenizer import LexicalTokenizer, load_tokenizer

RULES = Path(__file__).resolve().parents[2] / "configs" / "rules.toml"
BUDGET = 96


class FifoNotes:
    """Notes as a log of distinct lines, the oldest dropped first to fit ``budget`` tokens."""

    extractive = False

    def __init__(self, tokenizer, budget: int, settings) -> None:
        self.tokenizer, self.budget, self.lines = tokenizer, budget, []

    def render(self) -> str:
        return "\n".join(self.lines) or "(empty)"

    def observation(self) -> MemoryView:
        text = "\n".join(self.lines)
        return MemoryView(budget_left=self.budget - self.tokenizer.count(text), memory_text=text)

    def messages(self, question: str, evidence: str) -> tuple[dict[str, str], ...]:
        return prompts.memory_summary(question, self.render(), evidence, self.budget)

    def update(self, text: str, shown: set[str], texts: Mapping[str, str] | None = None, *,
               step: int) -> MemoryEvent:
        before = self.render()
        new = [line.strip() for line in text.splitlines() if line.strip()]
        if not new:
            return MemoryEvent(step=step, valid=False, reason="empty output; memory unchanged",
                               cause=InvalidCause.EMPTY_TEXT, before=before, after=before)
        lines = list(dict.fromkeys(self.lines + new))
        kept = len(lines)
        while lines and self.tokenizer.count("\n".join(lines)) > self.budget:
            lines.pop(0)
        self.lines = lines
        return MemoryEvent(step=step, valid=True, before=before, after=self.render(), truncated=len(lines) < kept)

    def cited(self) -> list[str]:
        return list(dict.fromkeys(eid for line in self.lines for eid in evidence_ids_in(line)))

    def faithful_cited(self, texts: Mapping[str, str]) -> list[str]:
        return self.cited()


@pytest.fixture
def fifo():
    register_memory_mode("fifo", MemoryMode(FifoNotes))
    register_memory_mode("fifo_boxed", MemoryMode(FifoNotes, answer_format="boxed"))
    yield "fifo"
    unregister_memory_mode("fifo")
    unregister_memory_mode("fifo_boxed")


def _run(data: Path, out: Path, mode: str) -> tuple[RunSummary, list[dict]]:
    cfg = load_config(RULES, [f'agent.memory="{mode}"', f"budgets.memory_tokens={BUDGET}", "limit=8"])
    summary = run_eval(cfg, data, out, show_progress=False)
    trajectories = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    return summary, sorted(trajectories, key=lambda t: t["task_id"])


def _memory_texts(trajectory: dict) -> list[str]:
    return [e["text"] for e in trajectory["events"] if e["type"] == "policy_call" and e["role"] == "memory"]


def test_a_registered_mode_runs_through_the_engine(fifo, hotpot_dev_dir, tmp_path):
    assert memory_modes() == ("summary", "decision", "overwrite", "fifo", "fifo_boxed")
    notes = make_memory("fifo", LexicalTokenizer(), 12)
    assert isinstance(notes, FifoNotes) and (notes.mode, notes.answer_format) == ("fifo", "free")
    fifo_run, fifo_trajs = _run(hotpot_dev_dir, tmp_path / "fifo", "fifo")
    summary_run, summary_trajs = _run(hotpot_dev_dir, tmp_path / "summary", "summary")
    tokenizer = load_tokenizer(fifo_run.config["tokenizer"])
    assert fifo_run.complete and fifo_run.config["agent"]["memory"] == "fifo"
    assert fifo_run.metrics["invalid_actions"] == 0.0 and fifo_run.metrics["policy_calls"] == 4.0
    cut = 0
    for mine, theirs in zip(fifo_trajs, summary_trajs, strict=True):
        assert mine["answer_format"] == "free" and tokenizer.count(mine["memory_final"]) <= BUDGET
        if mine["counts"]["memory_truncations"]:
            cut += 1
            # The newest note survives in fifo; summary, which cuts the end, kept the oldest instead.
            assert mine["memory_final"].endswith(_memory_texts(mine)[-1].splitlines()[-1])
            assert theirs["memory_final"].startswith(_memory_texts(theirs)[0].splitlines()[0])
            assert mine["memory_final"] != theirs["memory_final"]
    assert cut == 8 and fifo_run.truncation["memory_truncations"] == 16
    # The rules memory writes the best-matching sentences of the first search first: fifo drops them.
    assert fifo_run.metrics["memory_support_recall"] == 0.0
    assert summary_run.metrics["memory_support_recall"] == pytest.approx(0.55)


def test_the_registered_answer_format_reaches_the_reader_and_the_scorer(fifo, hotpot_dev_dir, tmp_path):
    run, trajectories = _run(hotpot_dev_dir, tmp_path / "boxed", "fifo_boxed")
    assert {t["answer_format"] for t in trajectories} == {"boxed"}
    assert all(t["reader_text"].startswith("\\boxed{") for t in trajectories)
    # The rules reader's box holds its answer, so the protocol's em (the box) is the lenient one.
    assert run.metrics["em"] == run.metrics["boxed_em"] == pytest.approx(0.125)


def test_config_checks_read_the_mode_s_properties(fifo):
    stream = ['agent.evidence="stream"', 'agent.controller="exhaust"', 'agent.memory="fifo"']
    assert load_config(RULES, stream).agent.memory == "fifo"  # a free-text mode streams
    with pytest.raises(InputError, match=r"agent.memory_format: 'extractive' is a format of decision memory "
                                         r"\(memory = 'decision'\)"):
        load_config(RULES, ['agent.memory="fifo"', 'agent.memory_format="extractive"'])
    with pytest.raises(ValueError, match="memory mode 'fifo' is registered already"):
        register_memory_mode("fifo", MemoryMode(FifoNotes))


def test_an_unregistered_mode_is_refused_naming_the_registered_ones():
    assert "fifo" not in memory_modes()  # the fixture's teardown took it away
    with pytest.raises(InputError, match="agent.memory: unknown memory mode 'fifo'; registered: 'summary', "
                                         "'decision' or 'overwrite'"):
        load_config(RULES, ['agent.memory="fifo"'])
