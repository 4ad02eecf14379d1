"""The settings file of ``memsearch experiment run``: the shipped example (GPU defaults and its CPU
profile) and the pipeline config it generates; bad fields refused naming the field, before
anything starts; a taken port refused before any folder is made; a hub id while offline."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from memsearch.errors import InputError
from memsearch.experiment.config import HOTPOT_DEV_URL, HOTPOT_TRAIN_URL, load_experiment
from memsearch.experiment.stages import pipeline_config, resolve_model

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "experiment.example.toml"


@pytest.fixture(autouse=True)
def _in_repository(monkeypatch):
    monkeypatch.chdir(ROOT)  # the recipe path is relative to the repository, as every config's


def test_the_example_is_a_gpu_node_by_default_and_its_cpu_profile_a_cpu_run():
    gpu = load_experiment(EXAMPLE)
    assert (gpu.data.train, gpu.data.dev) == (HOTPOT_TRAIN_URL, HOTPOT_DEV_URL)
    assert (gpu.services.reader.engine, gpu.services.stage1.engine) == ("vllm", "vllm")
    assert (gpu.devices.train, gpu.devices.services) == ([0], {"reader": [1], "stage1": [2]})
    cpu = load_experiment(EXAMPLE, profile="cpu")
    assert (cpu.services.reader.engine, cpu.services.stage1.engine) == ("transformers", "transformers")
    assert cpu.devices.empty and cpu.models.policy == cpu.models.reader == "embedded"
    assert cpu.recipe.pipeline == "configs/memory_policy_cpu.toml"
    # The profile's recipe overrides merge key by key with the file's (schema_mode and stage 2 kept).
    assert cpu.recipe.override["schema_mode"] is False and cpu.recipe.override["stage2"]["enabled"] is True


def test_several_training_gpus_give_every_trainer_stage_one_rank_a_gpu():
    from memsearch.train.launch import training_ranks

    cfg = load_experiment(EXAMPLE, ["devices.train=[0,3,4]"])  # the example's services keep GPUs 1 and 2
    pipeline = pipeline_config(cfg)
    assert training_ranks(pipeline.grpo_config("train", 1, None)) == 3
    assert training_ranks(pipeline.sft_config(["rows.jsonl"], 1)) == 3
    assert training_ranks(pipeline_config(load_experiment(EXAMPLE)).grpo_config("train", 1, None)) == 1
    with pytest.raises(InputError, match="GPU 2 is given to both 'train' and 'stage1'"):
        load_experiment(EXAMPLE, ["devices.train=[0,2]"])


def test_the_generated_pipeline_config_serves_the_reader_and_stage_1():
    cfg = load_experiment(EXAMPLE, [f'data.dev_questions={5}'], profile="cpu")
    pipeline = pipeline_config(cfg)
    reader = pipeline.episode.backends.reader
    assert (reader.kind, reader.base_url) == ("openai", "http://127.0.0.1:8001/v1")
    from memsearch.assets.embedded import model_dir

    assert reader.model == str(model_dir())  # transformers serve lists the folder it serves
    stage2 = pipeline.stage2
    assert (pipeline.stage1_serving, stage2.memory_serving, stage2.serve_port) == ("http", "http", 8002)
    assert pipeline.stage2.enabled and not pipeline.schema_mode
    assert (pipeline.data.dev_questions, pipeline.data.train_questions, pipeline.seeds) == (5, 3, [1])
    # B/D read the served stage 1, A/C the original model in process (baseline_memory set explicitly).
    matrix = pipeline.matrix_config("OUT/seed-1/merged1", None, ("http://127.0.0.1:8002/v1", "OUT/seed-1/merged1"))
    assert (matrix.backends.memory.kind, matrix.backends.memory.model) == ("openai", "OUT/seed-1/merged1")
    assert (matrix.backends.baseline_memory.kind, matrix.backends.baseline_memory.model) == ("hf", "embedded")


def test_stage_1_is_served_as_its_adapter_where_the_engine_serves_adapters(tmp_path):
    """GPU default and cpu-vllm: each seed's adapter loaded on the reader's vLLM (reader = policy),
    which starts ready for the recipe's LoRA rank; schema mode kept. Another reader model: the
    adapter on a stage-1 server of the policy model. transformers: merged, schema mode off."""
    from memsearch.experiment.stages import reader_spec, stage1_spec
    from memsearch.serving import launch_command

    gpu = load_experiment(EXAMPLE)
    assert gpu.stage1_on_reader() and reader_spec(gpu).max_lora_rank == 64  # the GPU recipe's r
    assert pipeline_config(gpu).schema_mode and pipeline_config(gpu).stage2.serve_engine == "vllm"
    vllm = load_experiment(EXAMPLE, profile="cpu-vllm")
    command = launch_command(reader_spec(vllm))
    assert vllm.stage1_on_reader() and command[command.index("--max-lora-rank") + 1] == "16"
    assert pipeline_config(vllm).schema_mode and pipeline_config(vllm).stage2.serve_port == 8001
    apart = load_experiment(EXAMPLE, ['models.reader="Qwen/Qwen2.5-0.5B-Instruct"'])
    assert not apart.stage1_on_reader() and apart.stage1_as_adapter()
    spec = stage1_spec(apart, "OUT/seed-1/merged1", "OUT/seed-1/grpo1/adapter", 1)
    assert (spec.model, spec.adapters) == ("Qwen/Qwen2.5-7B-Instruct", {"stage1-seed1": "OUT/seed-1/grpo1/adapter"})
    cpu = load_experiment(EXAMPLE, profile="cpu")
    assert not cpu.stage1_as_adapter() and not pipeline_config(cpu).schema_mode
    assert stage1_spec(cpu, "OUT/seed-1/merged1", "OUT/seed-1/grpo1/adapter", 1).model == "OUT/seed-1/merged1"
    with pytest.raises(InputError, match="services.stage1.serve_as: 'adapter' needs an engine that serves LoRA"):
        load_experiment(EXAMPLE, ['services.stage1.serve_as="adapter"'], profile="cpu")
    with pytest.raises(InputError, match="schema_mode = true on the `transformers serve`|constrains no output"):
        pipeline_config(load_experiment(EXAMPLE, ["recipe.override.schema_mode=true"], profile="cpu"))


@pytest.mark.parametrize("setting, problem", [
    ("data.train_sha256=\"abc\"", "data.train_sha256: 'abc': expected 64 lowercase hex digits"),
    ("data.dev_questions=0", "data.dev_questions: Input should be greater than or equal to 1"),
    ("models.nosuch=1", "models.nosuch: unknown field"),
    ("services.reader.engine=\"tgi\"", "services.reader.engine: Input should be"),
    ("services.stage1.model=\"/m\"", "services.stage1.model: set by the experiment"),
    ("services.stage1.engine=\"llama.cpp\"", "services.stage1.engine: llama.cpp serves GGUF files"),
    ("devices.cpu_ranks=2", "devices.cpu_ranks: 2: for a CPU run only; with training GPUs [0]"),
    ("devices.services={reader=[1]}", "devices.services: no GPUs for service 'stage1'"),
    ("recipe.override.model=\"x\"", "recipe.override.model: set by the experiment from [models] policy"),
    ("recipe.override.stage2.memory_url=\"http://h/v1\"", "recipe.override.stage2.memory_url: set by the experiment"),
    ("recipe.override.data={dev_questions=2}", "recipe.override.data: set by the experiment from [data]"),
])
def test_bad_fields_are_refused_naming_the_field(setting, problem):
    with pytest.raises(InputError) as info:
        load_experiment(EXAMPLE, [setting])
    assert problem in str(info.value)
    assert f"--set {setting}" in str(info.value)  # the flag that set it, not the file


def test_a_recipe_the_pipeline_refuses_names_the_recipe_field():
    cfg = load_experiment(EXAMPLE, ["recipe.override.grpo.steps=true"], profile="cpu")
    with pytest.raises(InputError, match=r"configs/memory_policy_cpu.toml \(with \[recipe.override\].*grpo"):
        pipeline_config(cfg)


def test_an_unknown_profile_names_the_ones_there_are():
    with pytest.raises(InputError, match=r"--profile gpu2: .* has no \[profile.gpu2\]; it has \['cpu', 'cpu-vllm'\]"):
        load_experiment(EXAMPLE, profile="gpu2")


def test_a_taken_port_is_refused_before_any_folder_is_made(tmp_path):
    from memsearch.experiment.run import run_experiment

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = load_experiment(EXAMPLE, [f"services.reader.port={port}"], profile="cpu")
        with pytest.raises(InputError, match=rf"port {port} \(service reader\) is already in use"):
            run_experiment(cfg, tmp_path / "exp", echo=lambda _: None)
    assert not (tmp_path / "exp").exists()
    cfg = load_experiment(EXAMPLE, ["services.stage1.port=8001"], profile="cpu")
    with pytest.raises(InputError, match="port 8001 is given to both service reader and service stage1"):
        run_experiment(cfg, tmp_path / "exp", echo=lambda _: None)
    assert not (tmp_path / "exp").exists()


def test_models_resolve_to_local_folders_and_a_hub_id_offline_is_a_clear_error(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from memsearch.assets.embedded import model_dir

    assert resolve_model("policy", "embedded", tmp_path) == Path(model_dir())
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="models.reader: .*empty is no Hugging Face model folder"):
        resolve_model("reader", str(tmp_path / "empty"), tmp_path)
    with pytest.raises(InputError, match="models.policy: ./nowhere/at/all: no such folder, and not a hub id"):
        resolve_model("policy", "./nowhere/at/all", tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # no network here either way; offline answers at once
    with pytest.raises(InputError, match=r"models.policy: could not fetch Qwen/Qwen2.5-0.5B-Instruct into .*offline\?"):
        resolve_model("policy", "Qwen/Qwen2.5-0.5B-Instruct", tmp_path / "cache")
    # A hub id already fetched into the cache is used as it is, without the hub.
    cached = tmp_path / "cache" / "org" / "model"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert resolve_model("policy", "org/model", tmp_path / "cache") == cached


BAD = """\
[models]
policy = "embedded"
reader = "embedded"

[services.reader]
engine = "transformers"
prot = 8001

[services.stage1]
engine = "transformers"
port = "8002"

[profile.cpu.services.stage1]
start_timout_s = 30
"""
READER_KEYS = ("adapters, command, engine, env, extra_args, host, max_lora_rank, model, port, python, served_name, "
               "start_timeout_s")


def test_a_bad_key_in_the_file_names_its_line_and_the_keys_its_table_takes(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD)
    with pytest.raises(InputError) as info:
        load_experiment(bad, profile="cpu")
    assert str(info.value).splitlines() == [
        f"{bad}:5: services.reader.port: Field required",  # a missing key: its table's header
        f"{bad}:7: services.reader.prot: unknown field (did you mean 'port'?); valid keys of [services.reader]: "
        + READER_KEYS,
        f"{bad}:11: services.stage1.port: Input should be a valid integer; got '8002'",
        # a key of the profile is named as the file writes it, with the keys of that table
        f"{bad}:14: profile.cpu.services.stage1.start_timout_s: unknown field (did you mean 'start_timeout_s'?); "
        "valid keys of [profile.cpu.services.stage1]: adapters, command, engine, env, extra_args, host, "
        "max_lora_rank, model, port, python, serve_as, served_name, start_timeout_s",
    ]


def test_a_profile_value_that_replaces_the_files_is_named_in_the_profile(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD.replace('prot = 8001\n', 'port = 8001\n').replace('"8002"', "8002")
                   + "\n[profile.gpu]\nmodels = { polcy = 'x' }\nservices.reader.port = 'x'\nservics = {}\n")
    with pytest.raises(InputError) as info:
        load_experiment(bad, profile="gpu")
    assert str(info.value).splitlines() == [
        f"{bad}:17: profile.gpu.models.polcy: unknown field (did you mean 'policy'?); valid keys of "
        "[profile.gpu.models]: cache_dir, policy, reader",
        f"{bad}:18: profile.gpu.services.reader.port: Input should be a valid integer; got 'x'",
        f"{bad}:19: profile.gpu.servics: unknown field (did you mean 'services'?); valid keys of [profile.gpu]: "
        "data, devices, models, recipe, services",
    ]
    load_experiment(bad)  # without the profile the file is fine


def test_a_bad_top_level_key_lists_the_top_level_keys_profile_included(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[servics.reader]\nengine = "vllm"\n' + BAD.split("[services.reader]")[0])
    with pytest.raises(InputError) as info:
        load_experiment(bad)
    assert (f"{bad}:1: servics: unknown field (did you mean 'services'?); valid top-level keys: data, devices, "
            "models, profile, recipe, services") in str(info.value).splitlines()


def test_a_bad_key_given_with_set_names_the_flag_and_the_keys_its_table_takes():
    with pytest.raises(InputError) as info:
        load_experiment(EXAMPLE, ["services.reader.prot=8001", "services.stage1.port=true"], profile="cpu")
    assert str(info.value).splitlines() == [
        f"--set services.reader.prot=8001: services.reader.prot: unknown field (did you mean 'port'?); valid keys "
        f"of [services.reader]: {READER_KEYS}",
        "--set services.stage1.port=true: services.stage1.port: Input should be a valid integer; got True",
    ]
