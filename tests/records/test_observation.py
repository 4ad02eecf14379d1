"""What the engine hands a backend beside the prompt (``records.observation``): each role's fields,
read by attribute, and a JSON form that reads back."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from memsearch.backends.rules import RulesBackend
from memsearch.data.dataset import load_dataset
from memsearch.engine.episode import run_episode
from memsearch.eval.runner import build_environment
from memsearch.pipelines.config import load_run_config
from memsearch.records.observation import Observation

RULES = Path(__file__).resolve().parents[2] / "configs" / "rules.toml"


class Recording(RulesBackend):
    """The rules backend, keeping every request's observation by role."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.seen: dict[str, list[Observation]] = {}

    async def generate(self, requests):
        for request in requests:
            self.seen.setdefault(request.role, []).append(request.observation)
        return await super().generate(requests)


def _observations(hotpot_dev_dir, *overrides) -> dict[str, list[Observation]]:
    dataset = load_dataset(hotpot_dev_dir)
    env = build_environment(load_run_config(RULES, ["agent.controller='policy'", *overrides]), dataset)
    recording = Recording(env.tokenizer)
    env = dataclasses.replace(env, backends=dict.fromkeys(env.backends, recording))
    asyncio.run(run_episode(dataset.tasks[0], env))
    return recording.seen


def test_each_role_gets_its_fields(hotpot_dev_dir):
    seen = _observations(hotpot_dev_dir)
    question = seen["reader"][0].question
    first, later = seen["memory"][0], seen["memory"][-1]
    assert first.mode == "decision" and first.memory_items == () and first.evidence
    # The budget left is of the rendered memory: the empty memory's "(empty)" already costs tokens.
    assert all(eid and ":" in eid for eid, _ in first.evidence) and 250 < first.budget_left < 256
    assert later.memory_items and later.budget_left < first.budget_left
    assert not later.extractive and later.sources_shown
    controller = seen["controller"]
    assert [o.searches_left for o in controller][:2] == [3, 2] and controller[0].past_queries == ()
    assert controller[1].past_queries and controller[1].mode is None
    (reader,) = seen["reader"]
    assert reader.answer_format == "free" and reader.evidence == () and reader.question == question
    for obs in [*seen["memory"], *controller, reader]:
        assert Observation.from_json(obs.to_json()) == obs


def test_rewritten_and_extractive_memories_show_their_own_fields(hotpot_dev_dir):
    summary = _observations(hotpot_dev_dir, "agent.memory='summary'")
    assert all(o.memory_items is None and o.memory_text is not None for o in summary["memory"])
    assert summary["memory"][-1].memory_item_texts == [summary["memory"][-1].memory_text]
    extractive = _observations(hotpot_dev_dir, "agent.memory_format='extractive'", "agent.memory_sources='hidden'")
    memory = extractive["memory"][0]
    assert memory.extractive and not memory.sources_shown
    assert set(memory.item_texts) == {eid for eid, _ in memory.evidence}  # the item each id would become
    assert Observation.from_json(memory.to_json()) == memory
