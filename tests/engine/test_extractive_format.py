"""The extractive action format end to end (``agent.memory_format = "extractive"``, docs/design.md
§5) on real sample questions: the rules heuristic and the oracle teacher write it, the memory
writes every fact from the cited sentences, and both formats are recorded in the run's config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.assets.samples import HOTPOT_TRAIN, samples_dir
from memsearch.config import load_config
from memsearch.data.dataset import load_dataset, save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.eval.runner import run_eval
from memsearch.memory.extractive import parse_extractive
from memsearch.records.run_summary import RunSummary
from memsearch.records.trajectory import Trajectory, read_trajectories

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"
EXTRACTIVE = 'agent.memory_format="extractive"'


def _run(data: Path, out: Path, *overrides: str) -> tuple[RunSummary, list[Trajectory]]:
    summary = run_eval(load_config(RULES, ["limit=20", *overrides]), data, out, show_progress=False)
    return summary, [traj for _, traj in read_trajectories(out / "trajectories.jsonl")]


def _texts(traj: Trajectory, documents) -> dict[str, str]:
    out = {}
    for eid in traj.shown_evidence:
        doc, _, i = eid.rpartition(":")
        out[eid] = f"{documents[doc].title}\n{documents[doc].sentences[int(i)].strip()}"
    return out


def _check_items_are_written_from_their_sentences(traj: Trajectory, documents) -> int:
    """Every applied memory call's text is extractive and its items are the cited sentences."""
    texts, facts = _texts(traj, documents), 0
    for call in traj.policy_calls(["memory"]):
        assert call.valid, call.invalid_reason
        assert '"text"' not in call.text or '"open"' in call.text  # a fact names ids only
        parsed = parse_extractive(call.text, texts)
        facts += sum(op.name == "ADD" for op in parsed.ops)
    # the final memory's facts are faithful by construction: what is cited is what is kept
    assert traj.memory_sources == traj.memory_cited
    return facts


def test_rules_write_the_extractive_format_and_keep_what_the_text_format_keeps(hotpot_dev_dir, tmp_path):
    text_summary, text_trajs = _run(hotpot_dev_dir, tmp_path / "text")
    ex_summary, ex_trajs = _run(hotpot_dev_dir, tmp_path / "extractive", EXTRACTIVE)
    assert text_summary.config["agent"]["memory_format"] == "text"  # recorded at its default too
    assert ex_summary.config["agent"]["memory_format"] == "extractive"
    documents = load_dataset(hotpot_dev_dir).documents_by_id()
    facts = sum(_check_items_are_written_from_their_sentences(t, documents) for t in ex_trajs)
    assert facts >= 20 and ex_summary.metrics["invalid_actions"] == 0
    for traj in ex_trajs:
        user = traj.policy_calls(["memory"])[0].messages[1]["content"]
        assert "You do not write facts" in user
    # Same heuristic, same choices, except where a title prefix no longer fits the budget.
    text_cited = {t.task_id: t.memory_cited for t in text_trajs}
    same = sum(t.memory_cited == text_cited[t.task_id] for t in ex_trajs)
    assert len(ex_trajs) == 20 and same >= 15, same
    assert ex_summary.metrics["memory_support_recall"] >= text_summary.metrics["memory_support_recall"] - 0.1


@pytest.fixture(scope="module")
def hotpot_train(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("extractive") / "hotpot-train"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_TRAIN, split="train", limit=20), out)
    return out


def test_the_oracle_teaches_one_extractive_op_per_call(hotpot_train, tmp_path):
    summary, trajs = _run(hotpot_train, tmp_path / "oracle", EXTRACTIVE, 'backends.memory.kind="oracle"')
    dataset = load_dataset(hotpot_train)
    labels, documents = dataset.labels_by_id(), dataset.documents_by_id()
    kept = 0
    for traj in trajs:
        _check_items_are_written_from_their_sentences(traj, documents)
        for call in traj.policy_calls(["memory"]):
            assert len(json.loads(call.text)["ops"]) == 1
        gold = set(labels[traj.task_id].supporting_facts)
        assert set(traj.memory_cited) <= gold  # the teacher keeps gold sentences only
        kept += len(traj.memory_cited)
    assert summary.metrics["invalid_actions"] == 0 and kept >= 20


def test_the_oracle_counts_the_op_it_writes_against_the_output_budget(hotpot_train, tmp_path):
    """An extractive op is its ids, however long the sentence: a 40-token output budget (a pair of
    ids takes 35) keeps what a generous one keeps (the teacher once counted the text format's op, sentence
    included, and taught NOOP for every gold sentence that would not fit as prose)."""
    from memsearch.memory.ops import Add, format_ops
    from memsearch.tokenizer import load_tokenizer

    oracle = (EXTRACTIVE, 'backends.memory.kind="oracle"')
    _, small = _run(hotpot_train, tmp_path / "small", *oracle, "budgets.policy_tokens=40")
    _, large = _run(hotpot_train, tmp_path / "large", *oracle, "budgets.policy_tokens=400")
    assert {t.task_id: t.memory_cited for t in small} == {t.task_id: t.memory_cited for t in large}
    documents = load_dataset(hotpot_train).documents_by_id()
    texts = {eid: text for t in small for eid, text in _texts(t, documents).items()}
    tok = load_tokenizer("lexical")  # configs/rules.toml's budget tokenizer
    long_kept = [eid for t in small for eid in t.memory_cited
                 if tok.count(format_ops([Add(texts[eid], (eid,))])) > 40]
    assert long_kept  # the case that was lost: kept although its text op would not fit in 40 tokens


@pytest.mark.slow
def test_constrained_extractive_sampling_cannot_write_an_invalid_or_over_budget_op(hotpot_dev_dir, tmp_path):
    """The embedded model, sampling at T = 1 in a memory too small for most evidence: under the
    per-call constraint every op it writes is one the memory accepts, and training can rebuild
    each call's constraint from its id and replay its masks on the sampled ids."""
    from transformers import AutoTokenizer

    from memsearch.assets.embedded import tokenizer_dir
    from memsearch.backends.hf.constraint import compile_constraint
    from memsearch.memory.action_format import constraint_by_id

    overrides = [EXTRACTIVE, 'backends.memory.kind="hf"', "backends.memory.schema_mode=true",
                 "backends.memory.sampling.temperature=1.0", "budgets.memory_tokens=72",
                 "budgets.policy_tokens=64", "budgets.passages_per_search=2", "limit=4"]
    summary = run_eval(load_config(RULES, overrides), hotpot_dev_dir, tmp_path / "hf", show_progress=False)
    trajs = [traj for _, traj in read_trajectories(tmp_path / "hf" / "trajectories.jsonl")]
    calls = [c for t in trajs for c in t.policy_calls(["memory"])]
    assert summary.complete and len(calls) >= 10
    assert [c.invalid_reason for c in calls if not c.valid] == []
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    ops = set()
    for call in calls:
        assert call.finish_reason == "stop" and call.constraint_id.startswith("memory-extract-v1:")
        masks = compile_constraint(constraint_by_id(call.constraint_id), tok).masks_for(call.completion_ids)
        assert all(bool(masks[k, t]) for k, t in enumerate(call.completion_ids))
        ops.add(json.loads(call.text)["ops"][0]["op"])
    assert "ADD" in ops  # the sampled policy does use the memory


def test_the_matrix_runs_with_the_extractive_format(hotpot_dev_dir, tmp_path):
    """B and D keep decision memory in the extractive format; A and C's summary notes have none."""
    from memsearch.eval.matrix import run_matrix

    run_matrix(load_config(RULES, [EXTRACTIVE, "limit=6"]), hotpot_dev_dir, tmp_path / "m", show_progress=False)
    formats = {}
    for group in "ABCD":
        summary = json.loads((tmp_path / "m" / group / "summary.json").read_text())
        assert summary["complete"], group
        formats[group] = (summary["agent"]["memory"], summary["agent"]["memory_format"])
    assert formats == {"A": ("summary", "text"), "B": ("decision", "extractive"),
                       "C": ("summary", "text"), "D": ("decision", "extractive")}
