"""A ``model`` on a kind that runs none (rules, oracle) validates alike whether or not the folder
it names exists: refused in every config a person writes (a file, a ``--set``, a pipeline config
read as a run config), read only where an earlier version wrote it (a flat backend table of a
saved run, into which a pipeline filled its model whatever the kind). Every case runs with the
folder made and without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from memsearch.config import BackendConfig, HFSettings, OracleSettings, RulesSettings, legacy_backend_dump, load_config
from memsearch.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"
FLAT = json.loads((Path(__file__).parent / "flat_backend_dumps.json").read_text())


def _refused(kind: str) -> str:
    return f"kind {kind!r} runs no model, so model is never read; remove it, or set kind = 'hf' or 'openai'"


@pytest.fixture(params=["folder there", "no folder"])
def folder(request, tmp_path) -> str:
    path = tmp_path / "models" / "base"
    if request.param == "folder there":
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")
    return str(path)


@pytest.mark.parametrize("kind", ["rules", "oracle"])
def test_a_file_or_a_set_giving_a_no_model_kind_a_model_is_refused_naming_the_field(folder, tmp_path, kind):
    file = tmp_path / "run.toml"
    file.write_text(f"[backends.reader]\nkind = {json.dumps(kind)}\nmodel = {json.dumps(folder)}\n")
    with pytest.raises(InputError) as info:
        load_config(file)
    assert str(info.value) == f"{file}: backends.reader.model: {_refused(kind)}"
    flag = f"backends.memory.model={json.dumps(folder)}"
    with pytest.raises(InputError) as info:
        load_config(RULES, [flag])
    assert str(info.value) == f"--set {flag}: backends.memory.model: {_refused('rules')}"
    # What the flat form wrote unset is dropped, as every other kind's key at its unset value.
    assert BackendConfig.model_validate({"kind": kind, "model": "embedded"}) == BackendConfig.model_validate(
        {"kind": kind})


@pytest.mark.parametrize("name", ["rules", "oracle_with_open_items"])
def test_a_flat_table_of_an_earlier_version_reads_whatever_model_its_pipeline_filled_in(folder, name):
    flat, kind = FLAT[name]["flat_dump"], FLAT[name]["table"]["kind"]
    settings = BackendConfig.model_validate(FLAT[name]["table"])
    assert BackendConfig.model_validate({**flat, "model": folder}) == settings
    # The first flat form had fewer keys; every later one kept them.
    first = {key: flat[key] for key in ("kind", "model", "adapter", "base_url", "max_concurrency", "timeout_s",
                                        "max_retries", "sampling")}
    assert BackendConfig.model_validate({**first, "model": folder, "max_retries": 4}) == BackendConfig.model_validate(
        {"kind": kind})
    # A table lacking a key of that form is no earlier record: its model is refused.
    with pytest.raises(ValidationError, match="runs no model, so model is never read"):
        BackendConfig.model_validate({**{k: v for k, v in flat.items() if k != "timeout_s"}, "model": folder})


def test_an_earlier_run_folder_resumes_and_one_in_this_form_with_a_model_does_not(folder, tmp_path):
    from memsearch.eval.run_folder import check_run_folder

    config = load_config(RULES).model_dump(mode="json")
    roles = [role for role, table in config["backends"].items() if table is not None]
    assert all(config["backends"][role]["kind"] == "rules" for role in roles)
    run = {"data": {"sha256": "d"}, "models": {}}
    for name, table_of in (("earlier", lambda t: {**legacy_backend_dump(t), "model": folder}),
                           ("current", lambda t: {**t, "model": folder})):
        out = tmp_path / name
        out.mkdir()
        saved = {**config, "backends": {**config["backends"], **{r: table_of(config["backends"][r]) for r in roles}}}
        (out / "config.json").write_text(json.dumps(saved))
        (out / "run.json").write_text(json.dumps(run))
        if name == "earlier":
            check_run_folder(out, True, config, run)
        else:  # this version never writes it: another run's config
            with pytest.raises(InputError, match="config differs from the run being resumed"):
                check_run_folder(out, True, config, run)


def test_a_trainer_folder_of_an_earlier_version_resumes(folder):
    from memsearch.train.config import GRPOConfig
    from memsearch.train.run_folder import saved_config

    dump = load_config(ROOT / "configs" / "train" / "grpo_cpu.toml", model=GRPOConfig).model_dump(mode="json")
    backends = dump["episode"]["backends"]
    assert backends["controller"]["kind"] == "rules"
    flat = {role: {**legacy_backend_dump(table), **({"model": folder} if table["kind"] == "rules" else {})}
            for role, table in backends.items() if table is not None}
    saved = {**dump, "episode": {**dump["episode"], "backends": {**backends, **flat}}}
    assert saved != dump and saved_config(GRPOConfig, saved) == dump


def test_a_pipeline_config_fills_its_model_only_into_the_roles_a_set_leaves_a_model_kind(folder, tmp_path):
    from memsearch.pipelines.config import load_run_config

    file = tmp_path / "pipeline.toml"
    file.write_text(f'pipeline = "memagent"\nmodel = {json.dumps(folder)}\n[episode]\ntokenizer = "lexical"\n')
    filled = load_run_config(file)
    assert filled.backends.memory == filled.backends.reader == HFSettings(model=folder)
    run = load_run_config(file, ['backends.memory.kind="rules"', 'backends.reader={kind = "oracle"}'])
    assert run.backends.memory == RulesSettings() and run.backends.reader == OracleSettings()
    # A model written for a rules role is the writer's: refused, named where it was written.
    file.write_text(file.read_text() + f'[episode.backends.reader]\nkind = "rules"\nmodel = {json.dumps(folder)}\n')
    with pytest.raises(InputError) as info:
        load_run_config(file)
    assert str(info.value) == f"{file}: backends.reader.model: {_refused('rules')}"


def test_a_kind_that_runs_no_model_takes_none_from_the_settings_it_replaces(folder):
    hf = HFSettings(model=folder, adapter=folder, schema_mode=True)
    assert hf.replaced(kind="rules", schema_mode=False) == RulesSettings()
    with pytest.raises(ValidationError, match="runs no model, so model is never read"):
        hf.replaced(kind="rules", model=folder)  # given, not carried over
