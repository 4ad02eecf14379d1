"""NOOP row selection for memory-role SFT (``train.sft.row_selection``) on a real oracle teacher run
over the shipped HotpotQA train sample, at the CPU recipe's budgets (where the teacher answers
NOOP in most calls and some gold sentences do not fit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.data.dataset import load_dataset
from memsearch.errors import InputError
from memsearch.memory.ops import Noop, parse_ops
from memsearch.train.sft.row_selection import row_kind, select_memory_rows

CPU_EPISODE = [
    'tokenizer="embedded"',
    'agent.memory="decision"',
    'agent.controller="fixed"',
    'agent.retrieval_scope="candidates"',
    "budgets.evidence_tokens=128",
    "budgets.passages_per_search=1",
    "budgets.max_searches=3",
    "budgets.memory_tokens=64",
    "budgets.policy_tokens=96",
    'backends.memory.kind="oracle"',
    'backends.controller.kind="rules"',
    'backends.reader.kind="rules"',
]


@pytest.fixture(scope="module")
def teacher_rows(hotpot_train_dir, tmp_path_factory) -> Path:
    from memsearch.eval.runner import run_eval
    from memsearch.train.sft.export import export_sft

    out = tmp_path_factory.mktemp("select")
    run_eval(load_config(None, CPU_EPISODE), hotpot_train_dir, out / "run", show_progress=False)
    export_sft(out / "run" / "trajectories.jsonl", out / "run" / "metrics.jsonl", "memory", out / "rows.jsonl")
    return out / "rows.jsonl"


@pytest.fixture(scope="module")
def hidden_rows(hotpot_train_dir, tmp_path_factory) -> Path:
    """The same teacher with ``agent.memory_sources = "hidden"`` (the no-sources control): the
    prompts show the memory without evidence ids."""
    from memsearch.eval.runner import run_eval
    from memsearch.train.sft.export import export_sft

    out = tmp_path_factory.mktemp("hidden")
    run_eval(
        load_config(None, CPU_EPISODE + ['agent.memory_sources="hidden"']),
        hotpot_train_dir,
        out / "run",
        show_progress=False,
    )
    export_sft(out / "run" / "trajectories.jsonl", out / "run" / "metrics.jsonl", "memory", out / "rows.jsonl")
    return out / "rows.jsonl"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_kinds_follow_the_completion_and_the_gold_sentences_shown(teacher_rows, hotpot_train_dir):
    labels = load_dataset(hotpot_train_dir).labels_by_id()
    kinds = {"op": 0, "gold_unfit": 0, "other_noop": 0}
    for row in _rows(teacher_rows):
        kind = row_kind(row, labels[row["task_id"]])
        kinds[kind] += 1
        ops = parse_ops(row["completion"]).ops
        prompt = row["messages"][-1]["content"]
        evidence = prompt.split("New evidence (", 1)[1].split("Memory budget left:", 1)[0]
        new_gold = [s for s in labels[row["task_id"]].supporting_facts if f"[{s}]" in evidence]
        if kind == "op":
            assert not (len(ops) == 1 and isinstance(ops[0], Noop))
        elif kind == "gold_unfit":  # the oracle kept nothing although a gold sentence was shown: it did not fit
            assert isinstance(ops[0], Noop) and new_gold
        else:
            memory = prompt.split("Memory (id, kind, sources, text):", 1)[1].split("New evidence (", 1)[0]
            assert isinstance(ops[0], Noop) and all(s in memory for s in new_gold)
    # 12 questions x 3 steps: every kind occurs at these budgets
    assert sum(kinds.values()) == 36 and min(kinds.values()) > 0, kinds


def test_selection_keeps_ops_and_unfit_noops_and_samples_the_rest(teacher_rows, hotpot_train_dir, tmp_path):
    labels = load_dataset(hotpot_train_dir).labels_by_id()
    rows = _rows(teacher_rows)
    kinds = [row_kind(r, labels[r["task_id"]]) for r in rows]
    report = select_memory_rows(teacher_rows, labels, tmp_path / "sel.jsonl", other_noop_share=0.5, seed=3)
    kept = _rows(tmp_path / "sel.jsonl")
    others = kinds.count("other_noop")
    assert report["read"] == {k: kinds.count(k) for k in ("op", "gold_unfit", "other_noop")}
    assert report["kept"] == {
        "op": kinds.count("op"),
        "gold_unfit": kinds.count("gold_unfit"),
        "other_noop": round(others / 2),
    }
    # original order, rows unchanged
    positions = [rows.index(r) for r in kept]
    assert positions == sorted(positions) and len(kept) == sum(report["kept"].values())
    # the same seed gives the same sample; share 0 keeps no other NOOP, share 1 keeps every row
    select_memory_rows(teacher_rows, labels, tmp_path / "again.jsonl", other_noop_share=0.5, seed=3)
    assert (tmp_path / "again.jsonl").read_bytes() == (tmp_path / "sel.jsonl").read_bytes()
    assert select_memory_rows(teacher_rows, labels, tmp_path / "none.jsonl", 0.0, 0)["kept"]["other_noop"] == 0
    select_memory_rows(teacher_rows, labels, tmp_path / "all.jsonl", 1.0, 0)
    assert (tmp_path / "all.jsonl").read_bytes() == teacher_rows.read_bytes()


def test_bad_input_is_refused_naming_the_line(teacher_rows, hotpot_train_dir, tmp_path):
    labels = load_dataset(hotpot_train_dir).labels_by_id()
    with pytest.raises(InputError, match="already exists"):
        select_memory_rows(teacher_rows, labels, teacher_rows, 0.5, 0)
    rows = _rows(teacher_rows)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        "\n".join(json.dumps(r) for r in [rows[0], {**rows[1], "source": {**rows[1]["source"], "split": "dev"}}]) + "\n"
    )
    with pytest.raises(InputError, match=r"bad.jsonl:2: .*split 'dev'"):
        select_memory_rows(bad, labels, tmp_path / "o.jsonl", 0.5, 0)
    with pytest.raises(InputError, match="has no label"):
        select_memory_rows(teacher_rows, {}, tmp_path / "o.jsonl", 0.5, 0)
    assert not (tmp_path / "o.jsonl").exists()


def test_hidden_sources_rows_are_classified_from_what_the_memory_held(hidden_rows, hotpot_train_dir, tmp_path):
    labels = load_dataset(hotpot_train_dir).labels_by_id()
    rows = _rows(hidden_rows)
    assert all("Memory (id, kind, text):" in r["messages"][-1]["content"] for r in rows)
    kinds = {"op": 0, "gold_unfit": 0, "other_noop": 0}
    for row in rows:
        kind = row_kind(row, labels[row["task_id"]])
        kinds[kind] += 1
        evidence = row["messages"][-1]["content"].split("New evidence (", 1)[1]
        new_gold = {s for s in labels[row["task_id"]].supporting_facts if f"[{s}]" in evidence}
        if kind == "gold_unfit":
            assert new_gold - set(row["memory_sources"])
        elif kind == "other_noop":  # every gold sentence shown was already held, though the prompt hid it
            assert new_gold <= set(row["memory_sources"])
    assert min(kinds.values()) > 0, kinds
    report = select_memory_rows(hidden_rows, labels, tmp_path / "sel.jsonl", other_noop_share=0.5, seed=3)
    assert report["read"] == kinds
    # rows exported before memory_sources existed cannot be classified under hidden sources: refused
    bare = tmp_path / "bare.jsonl"
    noop = next(i for i, r in enumerate(rows) if row_kind(r, labels[r["task_id"]]) != "op")
    bare.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "memory_sources"}) + "\n" for r in rows))
    with pytest.raises(InputError, match=rf"bare.jsonl:{noop + 1}: memory_sources: missing"):
        select_memory_rows(bare, labels, tmp_path / "o.jsonl", 0.5, 0)
    assert not (tmp_path / "o.jsonl").exists()


def test_extractive_teacher_rows_are_classified_like_text_ones(hotpot_train_dir, tmp_path):
    """The oracle writing the extractive format (``agent.memory_format``): its rows get the same
    kinds, read from ``{"op": "ADD", "sources": [...]}`` completions, and a NOOP is a NOOP."""
    from memsearch.eval.runner import run_eval
    from memsearch.train.sft.export import export_sft

    run_eval(load_config(None, CPU_EPISODE + ['agent.memory_format="extractive"']), hotpot_train_dir,
             tmp_path / "run", show_progress=False)
    export_sft(tmp_path / "run" / "trajectories.jsonl", tmp_path / "run" / "metrics.jsonl", "memory",
               tmp_path / "rows.jsonl")
    labels = load_dataset(hotpot_train_dir).labels_by_id()
    kinds = {"op": 0, "gold_unfit": 0, "other_noop": 0}
    for row in _rows(tmp_path / "rows.jsonl"):
        kind = row_kind(row, labels[row["task_id"]])
        kinds[kind] += 1
        assert (kind == "op") == ('"NOOP"' not in row["completion"]), row["completion"]
        assert '"text"' not in row["completion"]  # the teacher names sentences, the memory writes them
    assert sum(kinds.values()) == 36 and kinds["op"] > 0 and kinds["other_noop"] > 0, kinds
