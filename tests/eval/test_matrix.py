"""Matrix groups: summary groups A/C write memory with the baseline memory backend, never with
the trained memory policy of B/D, and every group's summary says which backend wrote its memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.config import group_config, load_config
from memsearch.eval.matrix import run_matrix

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"


def _memory(cfg) -> tuple:
    m = cfg.backends.memory
    return m.kind, m.model, m.adapter


def test_summary_groups_drop_the_trained_adapter_by_default():
    cfg = load_config(RULES, ['backends.memory.kind="hf"', 'backends.memory.adapter="runs/stage1/adapter"'])
    assert cfg.backends.baseline_memory is None
    groups = {g: group_config(cfg, g) for g in "ABCD"}
    assert _memory(groups["B"]) == _memory(groups["D"]) == ("hf", "embedded", "runs/stage1/adapter")
    assert _memory(groups["A"]) == _memory(groups["C"]) == ("hf", "embedded", None)
    # everything else about the memory backend is the run's own
    assert groups["A"].backends.memory.sampling == cfg.backends.memory.sampling


def test_summary_groups_take_the_base_of_a_merged_checkpoint(tmp_path):
    """A stage-1 policy served merged (``memsearch merge-adapter`` records its base) is not the
    baseline either: A/C use the recorded base model."""
    merged = tmp_path / "stage1-merged"
    merged.mkdir()
    (merged / "memsearch_merge.json").write_text(json.dumps({"base": "embedded", "adapter": "runs/stage1/adapter"}))
    cfg = load_config(RULES, ['backends.memory.kind="hf"', f"backends.memory.model={json.dumps(str(merged))}"])
    assert _memory(group_config(cfg, "B")) == ("hf", str(merged), None)
    assert _memory(group_config(cfg, "A")) == ("hf", "embedded", None)


def test_baseline_memory_is_used_by_summary_groups_and_group_overrides_still_win():
    cfg = load_config(RULES, ['backends.memory.kind="hf"', 'backends.memory.adapter="runs/stage1/adapter"',
                              'backends.baseline_memory={kind="openai", model="base-7b", '
                              'base_url="http://127.0.0.1:8000/v1"}',
                              'matrix.overrides.C={"backends.memory.model" = "other-7b"}'])
    assert _memory(group_config(cfg, "A")) == ("openai", "base-7b", None)
    assert _memory(group_config(cfg, "C")) == ("openai", "other-7b", None)  # the group's own override is applied last
    assert _memory(group_config(cfg, "B")) == ("hf", "embedded", "runs/stage1/adapter")


def test_matrix_summaries_record_which_backend_wrote_the_memory(hotpot_dev_dir, tiny_model_dir, tmp_path):
    """A real run: B/D's memory is a (tiny, real) hf model, A/C's the rules baseline; each
    group's summary, matrix.json and matrix.md name the backend that wrote its memory."""
    model = json.dumps(str(tiny_model_dir))
    cfg = load_config(RULES, ["limit=2", 'matrix.groups=["A", "B"]', 'backends.memory.kind="hf"',
                              f"backends.memory.model={model}", "budgets.policy_tokens=8",
                              'backends.baseline_memory={kind="rules"}'])
    out = tmp_path / "matrix"
    result = run_matrix(cfg, hotpot_dev_dir, out, show_progress=False)
    summaries = {g: json.loads((out / g / "summary.json").read_text()) for g in "AB"}
    assert summaries["A"]["memory_backend"] == {"kind": "rules", "model": "embedded", "adapter": None, "name": "rules"}
    assert summaries["B"]["memory_backend"] == {
        "kind": "hf",
        "model": str(tiny_model_dir),
        "adapter": None,
        "name": "hf",
    }
    assert summaries["A"]["backends"]["memory"] == "rules" and summaries["B"]["backends"]["memory"] == "hf"
    for g in "AB":
        assert result["groups"][g]["memory_backend"] == summaries[g]["memory_backend"]
        # every memory call of the group was answered by that backend (rules reports no usage, hf its own)
        calls = [json.loads(line) for line in (out / g / "trajectories.jsonl").read_text().splitlines()]
        memory_calls = [e for t in calls for e in t["events"] if e["type"] == "policy_call" and e["role"] == "memory"]
        assert memory_calls and {e["usage"]["source"] for e in memory_calls} == ({"none"} if g == "A" else {"reported"})
    table = (out / "matrix.md").read_text()
    assert (
        "| A | summary | fixed | rules |" in table and f"| B | decision | fixed | hf:{tiny_model_dir.name} |" in table
    )


def test_baseline_memory_must_be_a_backend_table():
    with pytest.raises(Exception, match="baseline_memory"):
        load_config(RULES, ['backends.baseline_memory="embedded"'])
