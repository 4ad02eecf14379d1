"""Configs composed as values (``config.compose``): ``with_values`` sets dotted keys and validates
once, with the problems a file would get; ``group_config`` is composed so, and gives what the
earlier dump-edit-revalidate gave (same dumps, same problems)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from memsearch.config import (
    HFSettings,
    RunConfig,
    config_json,
    group_config,
    merge_tables,
    validation_problems,
    with_values,
)
from memsearch.config.run import _AS_GROUP, GROUP_DESIGNS, baseline_memory_backend


def test_with_values_sets_keys_and_keeps_what_no_key_reaches():
    base = RunConfig.model_validate({"backends": {"memory": {"kind": "hf", "adapter": "/a"}}})
    out = with_values(base, {"backends.memory.adapter": None, "agent.memory_format": "extractive", "concurrency": 2})
    assert (out.backends.memory.adapter, out.agent.memory_format, out.concurrency) == (None, "extractive", 2)
    assert out.backends.reader is base.backends.reader  # not dumped and read back
    assert out.budgets is base.budgets
    assert config_json(base) == base.model_dump(mode="json")  # the one JSON form, unchanged


def test_with_values_merges_a_dict_and_validates_a_model_where_it_is_set():
    base = RunConfig.model_validate({"backends": {"memory": {"kind": "hf", "model": "m", "adapter": "/a"}}})
    assert with_values(base, {"backends.memory": {}}) == base  # an empty table changes nothing
    merged = with_values(base, {"backends.memory": {"adapter": None}})
    assert (merged.backends.memory.model, merged.backends.memory.adapter) == ("m", None)
    q4 = HFSettings.model_construct(**{**dict(HFSettings()), "model": "m", "weights": "q4"})  # unchecked
    with pytest.raises(ValidationError) as exc:
        with_values(base, {"backends.memory": q4})
    assert [path for path, _ in validation_problems(exc.value)] == ["backends.memory.weights"]


def test_with_values_problems_name_the_key_as_a_file_would():
    base = RunConfig()
    with pytest.raises(ValidationError) as exc:
        with_values(base, [("backends.memory.adapter", "/a"), ("nosuch.key", 1), ("agent.memory_format", {})])
    paths = [path for path, _ in validation_problems(exc.value)]
    with pytest.raises(ValidationError) as written:
        RunConfig.model_validate({"backends": {"memory": {"adapter": "/a"}}, "nosuch": {"key": 1},
                                  "agent": {"memory_format": {}}})
    assert paths == [path for path, _ in validation_problems(written.value)]
    assert "backends.memory.adapter" in paths and "nosuch" in paths


def _nested(dotted):
    nested = {}
    for key, value in dotted.items():
        *tables, last = key.split(".")
        node = nested
        for part in tables:
            node = node.setdefault(part, {})
        node[last] = value
    return nested


def _dump_edit_revalidate(base: RunConfig, group: str) -> RunConfig:
    """group_config as it was before it composed values: kept here to pin that nothing changed."""
    memory, controller = GROUP_DESIGNS[group]
    data = base.model_dump(mode="json")
    data["agent"].update(memory=memory, controller=controller)
    if memory == "summary":
        data["backends"]["memory"] = baseline_memory_backend(base.backends).model_dump(mode="json")
        data["agent"]["memory_format"] = "text"
    data = merge_tables(data, _nested(base.matrix.overrides.get(group, {})))
    return RunConfig.model_validate(data, context={_AS_GROUP: True})


def _outcome(make, base, group):
    try:
        return json.dumps(make(base, group).model_dump(mode="json"))
    except ValidationError as exc:
        return validation_problems(exc)


@pytest.mark.parametrize("memory", [{}, {"kind": "hf", "adapter": "/a"}, {"kind": "hf", "weights": "q4"},
                                    {"kind": "hf", "schema_mode": True, "sampling": {"temperature": 0.7}}])
@pytest.mark.parametrize("overrides", [
    {}, {"backends.memory.adapter": "runs/x"}, {"backends.memory.kind": "rules"}, {"backends.memory": {}},
    {"backends.memory.weights": "q4"}, {"agent.memory_format": "extractive"}, {"agent.memory_format": {}},
    {"backends.memory.kind": "openai", "backends.memory.base_url": "http://z/v1"}, {"nosuch.key": 1},
    {"backends.memory.sampling.temperature": 0.5},
    {"backends.controller.kind": "oracle", "backends.controller.model": "x"},
])
def test_group_config_is_what_dump_edit_revalidate_gave(memory, overrides):
    base = RunConfig.model_validate({"backends": {"memory": memory, "baseline_memory": None}})
    matrix = base.matrix.model_copy(update={"overrides": dict.fromkeys("ABCD", overrides)})
    base = base.model_copy(update={"matrix": matrix})
    for group in "ABCD":
        assert _outcome(group_config, base, group) == _outcome(_dump_edit_revalidate, base, group)
