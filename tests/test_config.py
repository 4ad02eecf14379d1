"""The config base and the one table merge (memsearch.config): every config model is strict
(no bool for an int, no string for a number, no unknown key), and legitimate TOML and JSON
inputs still validate (ints for floats, arrays for tuples)."""

from __future__ import annotations

import inspect

import pytest
from pydantic import BaseModel, ValidationError

import memsearch.config.backend
import memsearch.config.run
import memsearch.pipelines.config
import memsearch.pipelines.memagent.config
import memsearch.pipelines.memory_policy.config
import memsearch.train.config
from memsearch.config import RunConfig, StrictConfig, apply_overrides, merge_tables
from memsearch.errors import InputError
from memsearch.train.config import GRPOConfig, OptimSettings, SFTConfig

CONFIG_MODULES = (memsearch.config.run, memsearch.config.backend, memsearch.train.config, memsearch.pipelines.config,
                  memsearch.pipelines.memagent.config, memsearch.pipelines.memory_policy.config)


def test_every_config_model_is_a_strict_config_and_documents_every_field():
    models = [obj for module in CONFIG_MODULES for _, obj in inspect.getmembers(module, inspect.isclass)
              if issubclass(obj, BaseModel) and obj.__module__ == module.__name__]
    assert len(models) >= 20
    for model in models:
        assert issubclass(model, StrictConfig), model
        assert model.model_config["strict"] and model.model_config["frozen"] and model.model_config["extra"] == "forbid"
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name}"


@pytest.mark.parametrize("model, fields", [
    (GRPOConfig, {"steps": True}), (GRPOConfig, {"max_failed_share": "0.5"}), (GRPOConfig, {"save_rollouts": 1}),
    (SFTConfig, {"checkpoint_every": True}), (RunConfig, {"concurrency": True}),
])
def test_a_value_of_the_wrong_type_is_refused_not_coerced(model, fields):
    base = {"data": ["r.jsonl"]} if model is SFTConfig else {"data": "x"} if model is GRPOConfig else {}
    with pytest.raises(ValidationError) as exc:
        model.model_validate({**base, **fields})
    assert [e["loc"] for e in exc.value.errors()] == [(next(iter(fields)),)]


def test_ints_for_floats_and_arrays_for_tuples_validate_and_a_saved_config_reads_back():
    optim = OptimSettings.model_validate({"lr": 1, "betas": [0.9, 0.95]})
    assert optim.lr == 1.0 and optim.betas == (0.9, 0.95)
    with pytest.raises(ValidationError):
        OptimSettings.model_validate({"betas": ["0.9", 0.95]})  # the items stay strict
    with pytest.raises(ValidationError):
        OptimSettings.model_validate({"betas": [0.9]})
    cfg = GRPOConfig(data="x", optim={"betas": [0.9, 0.95]}, dual_clip=0)
    assert GRPOConfig.model_validate(cfg.model_dump(mode="json")) == cfg  # config.json as the trainer saves it
    sft = SFTConfig(data=["r.jsonl"])
    assert SFTConfig.model_validate(sft.model_dump(mode="json")) == sft


def test_a_dump_writes_every_field_the_defaults_included():
    dump = RunConfig().model_dump(mode="json")
    assert dump["agent"]["memory_sources"] == "shown"
    rules = {"kind": "rules", "sampling": {"temperature": 0.0, "top_p": 1.0, "seed": 0}, "schema_mode": False}
    assert all(dump["backends"][role] == rules for role in ("memory", "controller", "reader"))


def test_a_non_bool_schema_mode_is_refused_once_not_copied_into_the_episode():
    for fields in ({"rollout": {"schema_mode": "true"}}, {"schema_mode": "true"}):  # the earlier spelling too
        with pytest.raises(ValidationError) as exc:
            GRPOConfig.model_validate({"data": "x", **fields})
        assert [e["loc"] for e in exc.value.errors()] == [("rollout", "schema_mode")]


def test_merge_tables_merges_tables_and_replaces_other_values_without_changing_its_arguments():
    base = {"a": {"b": 1, "c": {"d": 2}}, "e": [1], "f": 1}
    top = {"a": {"c": {"x": 3}}, "e": [2], "f": {"g": 1}}
    assert merge_tables(base, top) == {"a": {"b": 1, "c": {"d": 2, "x": 3}}, "e": [2], "f": {"g": 1}}
    assert base == {"a": {"b": 1, "c": {"d": 2}}, "e": [1], "f": 1}
    assert top == {"a": {"c": {"x": 3}}, "e": [2], "f": {"g": 1}}


def test_a_set_value_replaces_what_the_key_holds_and_a_path_through_a_value_is_refused():
    data = {"matrix": {"overrides": {"B": {"limit": 2}}}, "limit": 3}
    assert apply_overrides(data, ["matrix.overrides={C = {limit = 1}}"])["matrix"]["overrides"] == {"C": {"limit": 1}}
    with pytest.raises(InputError, match=r"limit is not a table"):
        apply_overrides(data, ["limit.x=1"])


def test_every_config_check_of_a_model_and_its_bases_runs_and_all_problems_are_reported_together():
    # The mechanism any config model uses for checks across fields (memsearch.config.config_check).
    from memsearch.config import KeyProblems, StrictConfig, config_check, validation_problems

    class Base(StrictConfig):
        low: int = 0
        high: int = 10

        @config_check
        def _ordered(self, context):
            if self.low > self.high:
                raise KeyProblems(("low", "above high"))

    class Child(Base):
        steps: int = 1
        rate: float = 0.5

        @config_check
        def _two_at_once(self, context):
            problems = [(k, "odd") for k in ("steps", "low") if getattr(self, k) % 2]
            if context.get("strict_rate") and self.rate > 0.1:
                problems.append(("rate", "above 0.1"))
            if problems:
                raise KeyProblems(*problems)

    with pytest.raises(ValidationError) as refused:
        Child.model_validate({"low": 11, "steps": 3}, context={"strict_rate": True})
    assert validation_problems(refused.value) == [
        ("low", "above high"), ("steps", "odd"), ("low", "odd"), ("rate", "above 0.1")]
    assert Child.model_validate({"low": 2, "steps": 4}).steps == 4
    with pytest.raises(ValidationError, match="finite number"):
        Child.model_validate({"rate": float("nan")})
