"""The GRPO trajectory reward, term by term, with numbers, on trajectories the episode engine
wrote (``memsearch eval`` runs on the prepared HotpotQA train sample): the answer metric equals
the evaluator's figure for the same trajectory, and each penalty moves it by its documented
amount."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.data.dataset import load_dataset
from memsearch.records.trajectory import Trajectory, read_trajectories
from memsearch.train.config import RewardSettings
from memsearch.train.grpo.reward import trajectory_reward

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
NO_PENALTY = RewardSettings(invalid_call_penalty=0.0, citation_penalty=0.0, search_cost=0.0)


def engine_run(data_dir, out: Path, sets: list[str]) -> list[tuple[Trajectory, dict]]:
    """(trajectory, the evaluator's metrics row) of every task of a real `run_eval`."""
    from memsearch.eval.runner import run_eval

    run_eval(load_config(None, sets), data_dir, out, show_progress=False)
    trajs = [t for _, t in read_trajectories(out / "trajectories.jsonl")]
    rows = {r["task_id"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    return [(t, rows[t.task_id]) for t in trajs]


@pytest.fixture(scope="module")
def labels(hotpot_train_dir):
    return load_dataset(hotpot_train_dir).labels_by_id()


@pytest.fixture(scope="module")
def rules_run(hotpot_train_dir, tmp_path_factory):
    """Every role on the rules backend: valid calls, 2 searches, real answers and citations."""
    return engine_run(hotpot_train_dir, tmp_path_factory.mktemp("reward") / "rules",
                      ["budgets.max_searches=2", "budgets.passages_per_search=1"])


@pytest.fixture(scope="module")
def tiny_memory_run(hotpot_train_dir, tiny_model_dir, tmp_path_factory):
    """The memory role on the tiny random Llama: its operations are not valid JSON."""
    return engine_run(hotpot_train_dir, tmp_path_factory.mktemp("reward") / "tiny",
                      ["limit=2", "tokenizer=\"embedded\"", "budgets.max_searches=2", "budgets.passages_per_search=1",
                       "budgets.evidence_tokens=64", "budgets.policy_tokens=12", "backends.memory.kind=\"hf\"",
                       f"backends.memory.model={json.dumps(str(tiny_model_dir))}"])


def test_defaults_are_the_documented_reward():
    """F1 minus 0.5 x invalid-call fraction minus 0.5 x invalid-citation fraction, no search cost
    (the shipped GRPO configs say the same); the MemAgent recipe rewards boxed EM alone."""
    assert RewardSettings() == RewardSettings(metric="f1", invalid_call_penalty=0.5, citation_penalty=0.5,
                                              search_cost=0.0)
    for name in ("grpo_cpu.toml", "grpo_gpu.toml"):
        table = tomllib.loads((CONFIGS / "train" / name).read_text())["reward"]
        assert RewardSettings.model_validate(table) == RewardSettings(), name
    from memsearch.pipelines.memagent.config import MemAgentPipeline

    memagent = load_config(CONFIGS / "memagent.toml", model=MemAgentPipeline).grpo_config("x").reward
    assert memagent == RewardSettings(metric="boxed_em", invalid_call_penalty=0.0, citation_penalty=0.0,
                                      search_cost=0.0)


def test_answer_term_is_the_evaluators_metric(rules_run, labels):
    assert {row["f1"] for _, row in rules_run} == {0.0, 1.0}  # right and wrong answers both occur
    for t, row in rules_run:
        label = labels[t.task_id]
        for metric in ("f1", "em", "sub_em", "boxed_em"):
            settings = NO_PENALTY.model_copy(update={"metric": metric})
            assert trajectory_reward(t, label, settings, "memory") == pytest.approx(row[metric]), (t.task_id, metric)
    for t, row in rules_run:  # the defaults: F1; these episodes have no invalid call or citation
        assert trajectory_reward(t, labels[t.task_id], RewardSettings(), "memory") == row["f1"]


def test_search_cost_is_subtracted_per_search(rules_run, labels):
    assert {t.counts.searches for t, _ in rules_run} == {2}
    for t, row in rules_run:
        got = trajectory_reward(t, labels[t.task_id], NO_PENALTY.model_copy(update={"search_cost": 0.05}), "memory")
        assert got == pytest.approx(row["f1"] - 0.05 * 2)


def test_memory_recall_term_adds_the_evaluators_memory_support_recall(rules_run, labels):
    """reward.memory_recall x the share of gold supporting facts the final memory cites: the very
    figure the evaluation reports as memory_support_recall (train labels)."""
    recalls = [row["memory_support_recall"] for _, row in rules_run]
    assert min(recalls) < max(recalls)  # the rules memory keeps some gold facts and misses others
    for t, row in rules_run:
        label = labels[t.task_id]
        got = trajectory_reward(t, label, NO_PENALTY.model_copy(update={"memory_recall": 0.5}), "memory")
        assert got == pytest.approx(row["f1"] + 0.5 * (row["memory_support_recall"] or 0.0))
        # the term reads only the memory's evidence ids: an emptied memory loses it
        empty = replace(t, memory_sources=())
        assert trajectory_reward(empty, label, NO_PENALTY.model_copy(update={"memory_recall": 0.5}), "memory") == \
            pytest.approx(row["f1"])


def test_invalid_calls_of_the_trained_role_are_penalised_by_their_fraction(tiny_memory_run, rules_run, labels):
    for t, row in tiny_memory_run:
        memory_calls = t.policy_calls(["memory"])
        assert len(memory_calls) == 2 and all(c.valid is False for c in memory_calls)
        # the reader (not trained in role "memory") does not count
        settings = NO_PENALTY.model_copy(update={"invalid_call_penalty": 0.5})
        assert trajectory_reward(t, labels[t.task_id], settings, "memory") == pytest.approx(row["f1"] - 0.5 * 2 / 2)
        # role "controller" trains no call of this fixed-plan episode: nothing to penalise
        assert trajectory_reward(t, labels[t.task_id], settings, "controller") == pytest.approx(row["f1"])
    for t, row in rules_run:  # valid calls: no penalty
        assert trajectory_reward(t, labels[t.task_id], RewardSettings(citation_penalty=0.0), "memory") == \
            pytest.approx(row["f1"])


def test_invalid_citations_are_penalised_by_their_fraction(rules_run, labels):
    """An evidence id the reader cites but the episode never showed is invalid (the engine
    records it in ``invalid_citations``); the reward subtracts citation_penalty x invalid / cited."""
    cited = [(t, row) for t, row in rules_run if t.citations]
    assert cited and all(not t.invalid_citations for t, _ in cited)
    t, row = cited[0]
    label = labels[t.task_id]
    assert trajectory_reward(t, label, RewardSettings(), "memory") == pytest.approx(row["f1"])  # all valid
    n = len(t.citations)
    never_shown = "zz-not-a-document:0"
    assert never_shown not in t.shown_evidence
    bad = replace(t, citations=(*t.citations, never_shown), invalid_citations=(never_shown,))
    assert trajectory_reward(bad, label, RewardSettings(), "memory") == pytest.approx(row["f1"] - 0.5 * 1 / (n + 1))
    assert trajectory_reward(bad, label, NO_PENALTY.model_copy(update={"citation_penalty": 0.2}), "memory") == \
        pytest.approx(row["f1"] - 0.2 / (n + 1))
    # all terms together
    both = RewardSettings(search_cost=0.01)
    assert trajectory_reward(bad, label, both, "memory") == pytest.approx(row["f1"] - 0.5 / (n + 1) - 0.01 * 2)


def test_a_reader_asked_for_a_box_is_rewarded_on_the_box_only(rules_run, labels):
    """The reward used to score the lenient parse of an overwrite (MemAgent) reader while the
    evaluation scores the box: a hedge that mentions the gold earned reward but scored 0."""
    from memsearch.eval.score import score_trajectory

    t, _ = next((t, row) for t, row in rules_run if row["f1"] == 1.0)
    label = labels[t.task_id]
    gold = label.answers[0]
    hedge = replace(t, answer_format="boxed", reader_text=f"It could be {gold}, or not.",
                    prediction=f"It could be {gold}")
    boxed = replace(hedge, reader_text=f"So the answer is \\boxed{{{gold}}}.")
    for metric in ("f1", "em", "sub_em"):
        settings = NO_PENALTY.model_copy(update={"metric": metric})
        for traj, expected in ((hedge, 0.0), (boxed, 1.0)):
            assert trajectory_reward(traj, label, settings, "memagent") == score_trajectory(traj, label).scores[metric]
            assert score_trajectory(traj, label).scores[metric] == expected
