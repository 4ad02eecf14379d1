"""Each backend kind has a settings model with only the keys it reads: the kind picks the model,
a key of another kind is refused naming it, and the flat form earlier versions saved (every
kind's keys in every table) still reads and is rebuilt exactly by ``legacy_backend_dump``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from memsearch.config import (
    BackendConfig,
    HFSettings,
    OpenAISettings,
    OracleSettings,
    RulesSettings,
    RunConfig,
    legacy_backend_dump,
    load_config,
    validation_problems,
)
from memsearch.errors import InputError

# Backend tables and the dump the code before the split made of each (commit 702ab2b), in its key
# order; configs/api.toml's tables among them.
FLAT = json.loads((Path(__file__).parent / "flat_backend_dumps.json").read_text())
COMMON = ["kind", "sampling", "schema_mode"]
KEYS = {
    "rules": (RulesSettings, COMMON),
    "oracle": (OracleSettings, [*COMMON, "open_items"]),
    "hf": (HFSettings, [*COMMON, "model", "adapter", "max_concurrency"]),
    "openai": (OpenAISettings, [*COMMON, "model", "base_url", "max_concurrency", "timeout_s", "max_retries",
                                "retry_window_s", "extra_body", "engine", "schema_style", "context_tokens"]),
}
# Since the engines came (backends.engine_forms), an openai table's unset schema_style is "auto"
# (the engine's own form; vLLM and SGLang are also asked for token ids), which no flat form wrote:
# the flat dump of such a table differs there, so a stage record of before is not reused for it.
SINCE_ENGINES = {"openai": {"schema_style": "auto"}}


def _problems(table: dict) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as info:
        RunConfig.model_validate({"backends": {"memory": table}})
    return validation_problems(info.value)


@pytest.mark.parametrize("name", sorted(FLAT))
def test_a_table_dumps_its_kinds_keys_and_rebuilds_the_flat_dump_of_before(name):
    table, flat = FLAT[name]["table"], FLAT[name]["flat_dump"]
    settings = BackendConfig.model_validate(table)
    model, keys = KEYS[table["kind"]]
    assert type(settings) is model
    dump = settings.model_dump(mode="json")
    assert list(dump) == keys
    since = {k: v for k, v in SINCE_ENGINES.get(table["kind"], {}).items() if k not in table}  # unset ones
    assert list(legacy_backend_dump(dump).items()) == list({**flat, **since}.items())  # values and key order
    # The saved flat form reads back as the same settings (with what it wrote for those keys).
    assert BackendConfig.model_validate(flat) == settings.model_copy(update={k: flat[k] for k in since})
    # Inside a run config too: the field holds the kind's model and dumps its keys.
    run = RunConfig.model_validate({"backends": {"reader": table}})
    assert type(run.backends.reader) is model and run.model_dump(mode="json")["backends"]["reader"] == dump


def test_the_openai_max_concurrency_default_is_its_own():
    assert BackendConfig.model_validate({"kind": "openai"}).max_concurrency == 8
    assert BackendConfig.model_validate({"kind": "hf"}).max_concurrency == 16
    assert legacy_backend_dump({"kind": "rules"})["max_concurrency"] == 16


def test_a_key_of_another_kind_is_refused_naming_it_its_kind_and_the_configured_one():
    assert _problems({"kind": "hf", "extra_body": {"top_k": 1}, "open_items": True, "adapter": "a"}) == [
        ("backends.memory.extra_body", "read by kind 'openai' only (an HTTP server); kind is 'hf': remove it"),
        ("backends.memory.open_items", "read by kind 'oracle' only (the gold teacher: it reads labels); kind is "
         "'hf': remove it"),
    ]
    assert _problems({"kind": "oracle", "adapter": "runs/a", "max_concurrency": 4}) == [
        ("backends.memory.adapter", "kind 'oracle' runs no model, so adapter is never read; remove it, or set kind "
         "= 'hf'"),
        ("backends.memory.max_concurrency", "read by kind 'hf' or 'openai' only; kind is 'oracle': remove it"),
    ]
    # With another problem of the table's own keys, both are named; a key of no kind is unknown.
    assert _problems({"kind": "openai", "adapter": "a", "timeout_s": -1, "nosuch": 1}) == [
        ("backends.memory.adapter", "read by kind 'hf' only (a local transformers model); kind is 'openai': "
         "remove it"),
        ("backends.memory.timeout_s", "Input should be greater than 0"),
        ("backends.memory.nosuch", "unknown field"),
    ]
    assert _problems({"kind": "nosuch"}) == [
        ("backends.memory.kind", "unknown backend kind 'nosuch'; registered: 'rules', 'hf', 'openai' or 'oracle'")]


def test_a_flat_table_drops_other_kinds_keys_only_at_their_unset_values():
    flat = FLAT["rules"]["flat_dump"]
    # max_retries = 4 is what versions before the retry window wrote unset.
    assert BackendConfig.model_validate({**flat, "max_retries": 4}) == RulesSettings()
    # The model a pipeline filled into every role, whatever it names (tests/config/test_no_model_kinds.py).
    assert BackendConfig.model_validate({**flat, "model": "no/such/folder"}) == RulesSettings()
    assert _problems({**flat, "max_retries": 3}) == [
        ("backends.memory.max_retries", "read by kind 'openai' only (an HTTP server); kind is 'rules': remove it"),
    ]


def test_a_set_kind_picks_the_model_and_the_old_kinds_keys_are_checked():
    rules = Path(__file__).resolve().parents[2] / "configs" / "rules.toml"
    api = Path(__file__).resolve().parents[2] / "configs" / "api.toml"
    cfg = load_config(rules, ['backends.memory.kind="openai"', 'backends.memory.base_url="http://h:1/v1"'])
    assert type(cfg.backends.memory) is OpenAISettings and cfg.backends.memory.max_concurrency == 8
    assert type(cfg.backends.reader) is RulesSettings
    # api.toml's served memory made local: the file's base_url is no key of hf, named where it was written.
    with pytest.raises(InputError) as info:
        load_config(api, ['backends.memory.kind="hf"'])
    assert str(info.value) == (f"{api}: backends.memory.base_url: read by kind 'openai' only (an HTTP server); "
                               "kind is 'hf': remove it")
    local = load_config(api, ['backends.memory={kind = "hf", adapter = "runs/a"}'])
    assert local.backends.memory == HFSettings(adapter="runs/a")


def test_a_settings_class_is_built_for_its_own_kind_only():
    assert OracleSettings(open_items=True).model_dump(mode="json")["open_items"] is True
    with pytest.raises(TypeError, match="kind 'oracle' is configured by OracleSettings"):
        BackendConfig(kind="oracle")
    with pytest.raises(TypeError, match="kind 'openai' is configured by OpenAISettings"):
        HFSettings(kind="openai")
    # Validation through any of them picks the kind's model (a composed config changes the kind).
    assert type(RulesSettings.model_validate({"kind": "hf", "model": "m"})) is HFSettings


def test_replaced_copies_within_a_kind_and_validates_a_change_of_kind():
    hf = HFSettings(adapter="runs/a", max_concurrency=4)
    copy = hf.replaced(schema_mode=True, adapter=None)
    assert copy == HFSettings(max_concurrency=4, schema_mode=True)
    # A trainer answering a rules role with its hf policy: the common keys carry over.
    rules = RulesSettings.model_validate({"sampling": {"temperature": 0.5, "top_p": 1.0, "seed": 2}})
    trained = rules.replaced(kind="hf", model="m", adapter="runs/b")
    assert trained == HFSettings(model="m", adapter="runs/b", sampling=rules.sampling)
    assert type(rules.replaced(kind="hf")) is HFSettings
    with pytest.raises(ValidationError, match="kind 'rules' runs no model, so adapter is never read"):
        rules.replaced(adapter="runs/b")
    # An openai backend made local: its timeouts at their unset values go, a set one is refused.
    served = OpenAISettings(base_url="http://h:1/v1", model="m")
    assert served.replaced(kind="hf", base_url=None) == HFSettings(model="m", max_concurrency=8)
    with pytest.raises(ValidationError, match="timeout_s: read by kind 'openai' only"):
        served.replaced(kind="hf", base_url=None, timeout_s=5.0)


def test_a_pipeline_fills_its_model_only_into_the_roles_whose_kind_reads_one():
    from memsearch.pipelines.config import episode_table

    # A GPU recipe's model folder need not exist where its config is checked.
    data = {"model": "/models/not-here", "episode": {"backends": {"memory": {"kind": "rules"}}}}
    tables = episode_table(data)
    assert tables["backends"] == {"memory": {"kind": "rules"}, "reader": {"kind": "hf", "model": "/models/not-here"}}
    run = RunConfig.model_validate({**tables, "tokenizer": "embedded"})
    assert type(run.backends.memory) is RulesSettings and run.backends.reader.model == "/models/not-here"
    served = episode_table({"model": "/m", "episode": {"backends": {"reader": {"kind": "openai"}}}})
    assert served["backends"]["reader"] == {"kind": "openai", "model": "/m"}
