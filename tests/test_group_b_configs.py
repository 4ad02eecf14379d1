"""configs/group_b_{base,rules,trained}.toml: group B under the episode (reader, budgets, agent,
retrieval, tokenizer) of the CPU memory-policy recipe the shipped adapter came from (v3,
studies/memory_policy/configs/memory_policy_cpu_v3.toml), differing
only in the memory backend."""

from __future__ import annotations

from pathlib import Path

from memsearch.config import RunConfig, load_config
from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("base", "rules", "trained")
V3 = ROOT / "studies" / "memory_policy" / "configs" / "memory_policy_cpu_v3.toml"  # the study's recipe v3


def _load(name: str) -> RunConfig:
    return load_config(ROOT / "configs" / f"group_b_{name}.toml")


def _without_memory(cfg: RunConfig) -> dict:
    data = cfg.model_dump(mode="json")
    del data["backends"]["memory"]
    return data


def test_the_three_configs_differ_only_in_the_memory_backend():
    configs = {name: _load(name) for name in NAMES}
    rest = {name: _without_memory(cfg) for name, cfg in configs.items()}
    assert rest["base"] == rest["rules"] == rest["trained"]
    memory = {name: cfg.backends.memory.model_dump(mode="json") for name, cfg in configs.items()}
    assert len({str(sorted(m.items())) for m in memory.values()}) == 3
    assert memory["rules"]["kind"] == "rules"
    assert {k: v for k, v in memory["base"].items() if k != "adapter"} == \
        {k: v for k, v in memory["trained"].items() if k != "adapter"}
    assert memory["base"]["adapter"] is None and memory["trained"]["adapter"] == "models/memory-policy-cpu"
    assert memory["base"]["schema_mode"] is memory["trained"]["schema_mode"] is True


def test_budgets_agent_reader_and_retrieval_equal_the_v3_pipelines_episode():
    pipeline = load_config(V3, model=MemoryPolicyPipeline)
    episode = pipeline.episode
    assert episode.budgets.model_dump() == {**episode.budgets.model_dump(), "evidence_tokens": 128, "memory_tokens": 96,
                                            "policy_tokens": 96, "answer_tokens": 24, "max_searches": 3,
                                            "passages_per_search": 1}
    for name in NAMES:
        cfg = _load(name)
        assert cfg.budgets == episode.budgets, name
        assert cfg.agent == episode.agent, name
        assert cfg.backends.reader == episode.backends.reader and cfg.backends.reader.kind == "rules", name
        assert cfg.backends.controller == episode.backends.controller, name
        assert cfg.retrieval == episode.retrieval, name
        assert cfg.tokenizer == episode.tokenizer == pipeline.model == "embedded", name
        assert cfg.concurrency == episode.concurrency, name
        assert cfg.prompts == episode.prompts, name


def test_the_memory_backends_are_the_pipelines_heldout_rows():
    """base / rules are the held-out comparison's rows; trained is the base backend + the adapter."""
    from memsearch.pipelines.memory_policy.heldout import policy_backend

    pipeline = load_config(V3, model=MemoryPolicyPipeline)
    assert _load("base").backends.memory == policy_backend(pipeline, "base")
    assert _load("rules").backends.memory == policy_backend(pipeline, "rules")
    trained = _load("trained").backends.memory.model_dump(mode="json")
    assert trained == {**pipeline.base_backend().model_dump(mode="json"), "adapter": "models/memory-policy-cpu"}


def test_the_configs_run_the_shipped_adapter_in_the_episode_it_was_trained_in():
    """The budgets and agent (memory format included) of every group B config equal those of the
    pipeline run the shipped adapter came from (its fingerprint's provenance): shipping an adapter
    from another recipe must update these configs with it."""
    import json

    from memsearch.config import Agent, Budgets

    fingerprint = json.loads((ROOT / "models" / "memory-policy-cpu" / "fingerprint.json").read_text(encoding="utf-8"))
    episode = fingerprint["provenance"]["config"]["episode"]
    for name in NAMES:
        cfg = _load(name)
        assert cfg.agent == Agent.model_validate(episode["agent"]), name
        assert cfg.budgets == Budgets.model_validate(episode["budgets"]), name
