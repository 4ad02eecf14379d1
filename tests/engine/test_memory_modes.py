"""The no-sources control (``agent.memory_sources = "hidden"``, docs/design.md §5) on real dev
questions with the rules backends: the memory policy, controller and reader see the items without
evidence ids, the store still records them, so memory support recall is scored unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from memsearch.config import load_config
from memsearch.engine.memory_modes import make_memory
from memsearch.engine.parsing import evidence_ids_in
from memsearch.eval.runner import run_eval
from memsearch.memory import Add
from memsearch.records.run_summary import RunSummary
from memsearch.tokenizer import LexicalTokenizer

RULES = Path(__file__).resolve().parents[2] / "configs" / "rules.toml"


def _run(data: Path, out: Path, sources: str) -> tuple[RunSummary, list[dict]]:
    cfg = load_config(RULES, [f'agent.memory_sources="{sources}"', "limit=20"])
    summary = run_eval(cfg, data, out, show_progress=False)
    return summary, [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


def test_hidden_sources_hide_ids_from_every_role_and_keep_provenance_for_scoring(hotpot_dev_dir, tmp_path):
    shown, shown_trajs = _run(hotpot_dev_dir, tmp_path / "shown", "shown")
    hidden, hidden_trajs = _run(hotpot_dev_dir, tmp_path / "hidden", "hidden")
    # Recorded, like every field, at its default too.
    assert (
        shown.config["agent"]["memory_sources"] == "shown"
        and hidden.config["agent"]["memory_sources"] == "hidden"
    )
    kept = 0
    for traj in hidden_trajs:
        assert evidence_ids_in(traj["memory_final"]) == ()  # the rendering names no evidence id ...
        kept += bool(traj["memory_sources"])  # ... while the store still records them
        for call in (e for e in traj["events"] if e["type"] == "policy_call"):
            user = call["messages"][1]["content"]
            memory = user.split("Memory", 1)[1].split("\n\n", 1)[0]
            assert evidence_ids_in(memory) == (), call["role"]  # memory, controller and reader prompts alike
            if call["role"] == "memory":
                assert "Memory (id, kind, text):" in user
        assert traj["citations"] == []  # the rules reader has no ids to cite
    assert kept >= 15
    # The same rules memory, with the ids no longer counted: it keeps the same items and, where the
    # shown rendering ran out of room, more (2 of these 20 questions); provenance is scored as before.
    shown_src = {t["task_id"]: t["memory_sources"] for t in shown_trajs}
    hidden_src = {t["task_id"]: t["memory_sources"] for t in hidden_trajs}
    assert all(hidden_src[k][: len(v)] == v for k, v in shown_src.items())
    assert sum(len(hidden_src[k]) > len(v) for k, v in shown_src.items()) == 2
    for metric in ("memory_support_recall", "retrieval_support_recall", "f1", "em"):
        assert hidden.metrics[metric] >= shown.metrics[metric], metric
    assert shown.metrics["memory_support_recall"] > 0.5
    assert shown.metrics["citation_precision"] > 0.5 and hidden.metrics["citation_precision"] == 0.0


def test_hidden_sources_observation_and_prompt():
    memory = make_memory("decision", LexicalTokenizer(), 100, show_sources=False)
    assert memory.store.apply([Add("Paris is in France.", ("d3:0",))], {"d3:0"}).applied
    obs = memory.observation()
    # Rule-based backends get the items (the oracle teacher needs their sources) and the flag.
    assert obs.sources_shown is False and obs.memory_items[0].sources == ("d3:0",)
    assert memory.render() == "[m1] (fact) Paris is in France."
    assert (
        "Memory (id, kind, text):\n[m1] (fact) Paris is in France." in memory.messages("Q?", "[d4:0] x")[1]["content"]
    )
    shown = make_memory("decision", LexicalTokenizer(), 100)
    assert shown.observation().sources_shown is True
    assert "Memory (id, kind, sources, text):" in shown.messages("Q?", "[d4:0] x")[1]["content"]


def test_each_memory_call_records_the_budget_left_its_prompt_showed(hotpot_dev_dir, tmp_path):
    # Decision memory (rules) on real questions: the recorded number is the prompt's, calls of
    # other roles record none, and it reads back from the file.
    import re

    from memsearch.records.trajectory import read_trajectories

    cfg = load_config(RULES, ["limit=6"])
    run_eval(cfg, hotpot_dev_dir, tmp_path / "run", show_progress=False)
    lefts = []
    for _, traj in read_trajectories(tmp_path / "run" / "trajectories.jsonl"):
        for call in traj.policy_calls():
            if call.role != "memory":
                assert call.budget_left is None
                continue
            shown = re.search(r"Memory budget left: (-?\d+) tokens", call.messages[-1]["content"])
            assert call.budget_left == int(shown.group(1))
            lefts.append(call.budget_left)
    assert len(lefts) >= 6 and len(set(lefts)) > 1  # it moves as the memory fills
