"""Memory provenance an episode records (docs/design.md §6), on real dev questions: a memory
policy that cites every shown sentence from items whose text they do not support gains no memory
support recall; items that copy their sentences keep it; an item over the sources cap is an
invalid action. Scored through ``eval.score`` as an evaluation (and the GRPO reward) reads it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import pytest

from memsearch.backends.base import GenerationResult, Usage
from memsearch.config import load_config
from memsearch.data.dataset import load_dataset
from memsearch.engine.episode import run_episode
from memsearch.eval.metrics import support_recall
from memsearch.eval.runner import build_environment
from memsearch.eval.score import score_trajectory

RULES = Path(__file__).resolve().parents[2] / "configs" / "rules.toml"
ROOMY = ["budgets.memory_tokens=4096", "budgets.policy_tokens=1024"]
TASKS = 12


class ScriptedMemory:
    """A memory policy answering each call with ``ops(evidence)``, ``evidence`` being the
    observation's ``(evidence id, sentence)`` pairs of this step."""

    name = "scripted"

    def __init__(self, ops):
        self.ops = ops

    async def generate(self, requests):
        start = time.perf_counter()
        return [GenerationResult(json.dumps({"ops": self.ops(r.observation.evidence)}), "stop",
                                 usage=Usage(source="none"), latency_s=time.perf_counter() - start)
                for r in requests]

    async def aclose(self):
        return None


def cite_all(*texts):
    """One ADD per text, each citing every sentence shown in this step."""
    return lambda evidence: [{"op": "ADD", "text": t, "sources": [eid for eid, _ in evidence], "kind": "fact"}
                             for t in texts]


def copy_each(evidence):
    """One ADD per shown sentence, its text copied, citing that sentence: a faithful memory."""
    return [{"op": "ADD", "text": s, "sources": [eid], "kind": "fact"} for eid, s in evidence]


@pytest.fixture(scope="module")
def dev(hotpot_dev_dir):
    dataset = load_dataset(hotpot_dev_dir)
    return dataset, dataset.labels_by_id()


def environment(dataset, policy, *overrides):
    """The rules run config (roomy budgets) with ``policy`` as the memory policy."""
    env = build_environment(load_config(RULES, [*ROOMY, *overrides]), dataset)
    return dataclasses.replace(env, backends={**env.backends, "memory": ScriptedMemory(policy)})


def episodes(dev, policy, *overrides):
    dataset, labels = dev
    env = environment(dataset, policy, *overrides)
    out = []
    for task in dataset.tasks[:TASKS]:
        traj = asyncio.run(run_episode(task, env))
        out.append((traj, score_trajectory(traj, labels[task.id]), labels[task.id]))
    return out


def test_citing_every_shown_id_from_unsupported_text_scores_no_memory_recall(dev):
    # The cap out of the way (1000 sources per item): the faithfulness rule alone closes the hack.
    runs = episodes(dev, cite_all("x", "the quick brown fox"), "agent.memory_max_sources=1000")
    before = []
    for traj, row, label in runs:
        assert traj.counts.invalid_actions == 0  # every batch was valid and applied
        assert set(traj.memory_cited) == set(traj.shown_evidence)  # the memory cites everything shown ...
        assert traj.memory_sources == ()  # ... from items no cited sentence supports
        assert row.scores["memory_support_recall"] == 0.0 and row.scores["memory_support_precision"] == 0.0
        # What the old definition (every cited id) gave: the retrieval ceiling.
        before.append(support_recall(traj.memory_cited, label.supporting_facts))
        assert before[-1] == row.scores["retrieval_support_recall"]
    assert sum(before) / len(before) == pytest.approx(31 / 36)  # 0.861 on these 12 questions


def test_items_that_copy_their_sentences_keep_their_recall(dev):
    recalls = []
    for traj, row, label in episodes(dev, copy_each):
        assert traj.memory_sources == traj.memory_cited
        assert set(traj.memory_cited) == set(traj.shown_evidence)
        assert row.scores["memory_support_recall"] == row.scores["retrieval_support_recall"]
        gold = set(label.supporting_facts) & set(traj.shown_evidence)
        assert row.scores["memory_support_precision"] == pytest.approx(len(gold) / len(traj.shown_evidence))
        recalls.append(row.scores["memory_support_recall"])
    assert sum(recalls) / len(recalls) == pytest.approx(31 / 36)  # the retrieval ceiling, as cited


def test_one_faithful_gold_copy_counts_and_the_unfaithful_padding_does_not(dev):
    dataset, labels = dev
    task = dataset.tasks[0]
    gold = labels[task.id].supporting_facts

    def policy(evidence):
        copied = [{"op": "ADD", "text": s, "sources": [eid], "kind": "fact"} for eid, s in evidence if eid in gold][:1]
        return copied + cite_all("x")(evidence)

    traj = asyncio.run(run_episode(task, environment(dataset, policy, "agent.memory_max_sources=1000")))
    row = score_trajectory(traj, labels[task.id])
    kept = traj.memory_sources
    assert kept and set(kept) <= set(gold)  # only the copied gold sentences count
    assert set(traj.memory_cited) == set(traj.shown_evidence)
    assert row.scores["memory_support_recall"] == len(set(kept)) / len(set(gold)) > 0
    assert row.scores["memory_support_precision"] == len(set(kept)) / len(traj.memory_cited)


def test_an_item_over_the_sources_cap_is_an_invalid_action(dev):
    for traj, row, _ in episodes(dev, cite_all("x")):  # the default cap: 3 sources per item
        memory = traj.memory_events
        over = [e for e in memory if not e.valid]
        assert over and all("over the cap of 3 per item (agent.memory_max_sources)" in e.reason for e in over)
        assert traj.counts.invalid_actions == len(over)
        # Steps that showed at most 3 sentences were within the cap (and still score nothing).
        assert all(e.valid for e in memory if e not in over)
        assert row.scores["memory_support_recall"] == 0.0 and traj.memory_sources == ()


def test_summary_notes_are_judged_line_by_line():
    from memsearch.engine.memory_modes import make_memory
    from memsearch.tokenizer import LexicalTokenizer

    notes = make_memory("summary", LexicalTokenizer(), 200)
    notes.text = ("Paris is the capital of Germany. [d1:0]\n"  # copied: counts
                  "x [d1:1] [d2:0]\n"  # no content word: its ids do not
                  "Berlin is a city [d1:1] [d9:9]")  # supported; d9:9 was never shown
    texts = {"d1:0": "Capitals\nParis is the capital of Germany.", "d1:1": "Capitals\nBerlin is a city.",
             "d2:0": "Rivers\nThe Seine flows through Paris."}
    assert notes.cited() == ["d1:0", "d1:1", "d2:0", "d9:9"]
    assert notes.faithful_cited(texts) == ["d1:0", "d1:1"]
