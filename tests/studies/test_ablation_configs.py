"""The controls of recipe v1 (``studies/memory_policy/configs/ablations/*.toml``, docs/memory_policy.md
"Controls (ablations)"): each loads and validates as a pipeline config, differs from the CPU
recipe only in the fields its ablation is about (load_config has no includes, so they are full
copies), and the pipeline builds the stage configs the ablation needs. The cold-start path runs
end to end in test_memory_policy_pipeline.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memsearch.config import load_config, read_config_file
from memsearch.data.records import Label
from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline
from memsearch.pipelines.stage_versions import version1_dump, version2_dump
from memsearch.records.trajectory import Trajectory
from memsearch.train.config import PLACEMENT_FIELDS
from memsearch.train.grpo.reward import trajectory_reward

ROOT = Path(__file__).resolve().parents[2]
CPU = ROOT / "configs" / "memory_policy_cpu.toml"
ABLATIONS = ROOT / "studies" / "memory_policy" / "configs" / "ablations"

# What each control changes against the CPU recipe (besides seeds = [1], one seed each).
DIFFERS = {
    "cold_start": {"grpo_start": "base"},
    "no_sources": {"episode.agent.memory_sources": "hidden"},
    "open_items": {"teacher.open_items": True, "stage2.enabled": True, "stage2.start": "sft", "stage2.sft.epochs": 2.0},
    "search_cost": {"stage2.enabled": True, "stage2.start": "sft", "stage2.sft.epochs": 2.0,
                    "stage2.grpo.reward.search_cost": 0.05},
    "stage2_control": {"stage2.enabled": True, "stage2.start": "sft", "stage2.sft.epochs": 2.0},
}


def flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def current_spelling(tables: dict[str, Any]) -> dict[str, Any]:
    """Raw pipeline tables with the trainer tables in the current spelling: the published
    ablations keep the layout they were registered in ([stage2.train], flat GRPO keys), the recipe
    is written the current way, and the pipeline reads both the same."""
    from memsearch.pipelines.config import renamed_tables
    from memsearch.train.config_keys import upgrade_grpo_keys

    tables = renamed_tables(tables, {"stage2.train": "stage2.grpo"})
    stage2 = tables.get("stage2", {})
    return {**tables, "grpo": upgrade_grpo_keys(tables.get("grpo", {})),
            "stage2": {**stage2, "grpo": upgrade_grpo_keys(stage2.get("grpo", {}))}}


def ablation(name: str) -> MemoryPolicyPipeline:
    return load_config(ABLATIONS / f"{name}.toml", model=MemoryPolicyPipeline)


def test_every_ablation_config_loads_and_is_listed():
    assert sorted(p.stem for p in ABLATIONS.glob("*.toml")) == sorted(DIFFERS)
    for path in ABLATIONS.glob("*.toml"):
        cfg = load_config(path, model=MemoryPolicyPipeline)
        assert cfg.seeds == [1] and cfg.matrix_seeds == [1], path.name


def _computed(flat_table: dict[str, Any]) -> dict[str, Any]:
    """A flat table without the trainers' placement fields (train.config.PLACEMENT_FIELDS): they
    change no number (the CPU recipe turned gradient checkpointing on after these were frozen)."""
    return {k: v for k, v in flat_table.items() if k.rsplit(".", 1)[-1] not in PLACEMENT_FIELDS}


@pytest.mark.parametrize("name", sorted(DIFFERS))
def test_ablation_differs_from_the_cpu_recipe_only_in_its_fields(name):
    base, ours = (_computed(flat(current_spelling(read_config_file(path))))
                  for path in (CPU, ABLATIONS / f"{name}.toml"))
    changed = {k: ours.get(k) for k in set(base) | set(ours) if base.get(k) != ours.get(k)}
    assert changed == {"seeds": [1], **DIFFERS[name]}
    # Validated, too: the resolved configs differ in the same fields (defaults filled in).
    resolved = _computed(flat(ablation(name).model_dump(mode="json")))
    cpu = _computed(flat(load_config(CPU, model=MemoryPolicyPipeline).model_dump(mode="json")))
    assert {k for k in set(cpu) | set(resolved) if cpu.get(k) != resolved.get(k)} == {"seeds", *DIFFERS[name]}


def test_cold_start_trains_stage1_from_the_base_in_schema_mode():
    cfg = ablation("cold_start")
    grpo = cfg.grpo_config("<train>", 1, None)
    assert cfg.grpo_start == "base" and grpo.adapter is None and grpo.schema_mode is True
    with pytest.raises(Exception, match="grpo_start = 'base' needs schema_mode = true"):
        load_config(ABLATIONS / "cold_start.toml", ["schema_mode=false"], model=MemoryPolicyPipeline)


def test_no_sources_reaches_every_episode_the_pipeline_runs():
    cfg = ablation("no_sources")
    runs = {"teacher": cfg.teacher_config(), "grpo1": cfg.grpo_config("<train>", 1, "<sft>").episode,
            "matrix": cfg.matrix_config("<stage 1>", None)}
    for stage, run in runs.items():
        assert run.agent.memory_sources == "hidden", stage
    assert ablation("stage2_control").teacher_config().agent.memory_sources == "shown"


def test_open_items_teacher_writes_open_items_and_stage2_reads_them():
    cfg = ablation("open_items")
    teacher = cfg.teacher_config().backends.memory
    assert (teacher.kind, teacher.open_items) == ("oracle", True)
    stage2 = cfg.stage2_config("<train>", 1, "<stage 1>").episode
    assert stage2.agent.controller == "policy"  # a controller that reads the memory's open items
    assert ablation("stage2_control").teacher_config().backends.memory.open_items is False


def test_search_cost_reaches_the_stage2_reward():
    """The stage-2 GRPO config the pipeline builds carries the search cost, and the reward it
    computes subtracts it per search (the term itself: tests/train/grpo/test_reward.py::
    test_search_cost_is_subtracted_per_search)."""
    priced = ablation("search_cost").stage2_config("<train>", 1, "<stage 1>").reward
    free = ablation("stage2_control").stage2_config("<train>", 1, "<stage 1>").reward
    assert (priced.search_cost, free.search_cost) == (0.05, 0.0)
    assert priced.model_copy(update={"search_cost": 0.0}) == free  # nothing else differs
    assert ablation("search_cost").grpo_config("<train>", 1, "<sft>").reward.search_cost == 0.0  # stage 1 untouched
    label = Label(id="q", answers=["Paris"], supporting_facts=[], gold_doc_ids=[])
    for searches in (1, 3):
        traj = Trajectory.from_json({"task_id": "q", "prediction": "Paris", "answer_format": "free", "events": [],
                                     "counts": {"searches": searches}})
        assert trajectory_reward(traj, label, free, "controller") == 1.0
        assert trajectory_reward(traj, label, priced, "controller") == pytest.approx(1.0 - 0.05 * searches)


def test_the_recipe_records_every_field_and_its_version1_form_has_no_control_field():
    """Dumps write every field, the control fields at their defaults included (open_items in the
    earlier flat backend tables, ``version2_dump``). Version-1 stage records fingerprinted the dumps with the control
    fields left out at their defaults: the recipe's stage configs in that form are the ones
    recorded before the controls existed, so those records are still recognised."""
    cfg = load_config(CPU, ["stage2.enabled=true"], model=MemoryPolicyPipeline)
    dumps = [cfg.teacher_config(), cfg.grpo_config("t", 1, "a").episode, cfg.stage2_config("t", 1, "m").episode,
             cfg.matrix_config("m", None)]
    for run in dumps:
        flat = version2_dump(run.model_dump(mode="json"))  # flat backend tables, as versions 1 and 2 dumped them
        assert "memory_sources" in json.dumps(flat) and "open_items" in json.dumps(flat)
        text = json.dumps(version1_dump(flat))
        assert "memory_sources" not in text and "open_items" not in text
        assert type(run).model_validate(run.model_dump(mode="json")) == run
        assert type(run).model_validate(json.loads(text)) == run
    assert ablation("no_sources").teacher_config().model_dump()["agent"]["memory_sources"] == "hidden"
    assert ablation("open_items").teacher_config().model_dump()["backends"]["memory"]["open_items"] is True


def test_stage2_controls_start_the_controller_from_sft_on_the_oracle_controllers_rows():
    """The three stage-2 controls train the controller from SFT on teacher2's rows (the oracle
    controller over the oracle memory); search_cost shares teacher2 and the controller's SFT with
    its control, so those stages of the control's run are reused there (the same fingerprints)."""
    control, priced, open_items = ablation("stage2_control"), ablation("search_cost"), ablation("open_items")
    teacher2 = control.controller_teacher_config()
    assert (teacher2.agent.controller, teacher2.backends.controller.kind, teacher2.backends.memory.kind) == \
        ("policy", "oracle", "oracle")
    sft2 = control.stage2_sft_config(["rows"], 1)
    assert (sft2.role, sft2.epochs, sft2.lora.r) == ("controller", 2.0, control.sft_config(["rows"], 1).lora.r)
    assert priced.controller_teacher_config() == teacher2 and priced.stage2_sft_config(["rows"], 1) == sft2
    assert open_items.controller_teacher_config().backends.memory.open_items is True  # its own teacher2
    assert control.stage2_config("t", 1, "m", adapter="sft2/adapter").adapter == "sft2/adapter"
