"""The GPU layout (``memsearch.devices``): one ``[devices]`` table says which GPUs train and which
serve; a GPU in two uses is refused, the trainer's ranks see exactly their GPUs, the pipelines
hand the same layout to every stage, and placement never changes what must match on resume or in
a stage's fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsearch.cli.app import app
from memsearch.config import config_from_tables, load_config
from memsearch.devices import DeviceLayout, apply_training_layout
from memsearch.errors import InputError
from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline
from memsearch.train.config import GRPOConfig, without_placement
from memsearch.train.distributed import Dist
from memsearch.train.run_folder import check_run_folder

ROOT = Path(__file__).resolve().parents[1]
MP_CPU = ROOT / "configs" / "memory_policy_cpu.toml"


def _layout(table: dict) -> DeviceLayout:
    return config_from_tables(table, [], DeviceLayout, "node.toml")


def test_a_gpu_given_to_a_service_and_the_trainer_is_refused_naming_it():
    with pytest.raises(InputError) as info:
        _layout({"train": [0, 1], "services": {"reader": [1]}})
    assert "node.toml: services: GPU 1 is given to both 'train' and 'reader'" in str(info.value)
    with pytest.raises(InputError) as info:
        _layout({"services": {"reader": [2], "stage1": [2, 3]}})
    assert "GPU 2 is given to both 'reader' and 'stage1'" in str(info.value)
    shared = _layout({"train": [0, 1], "services": {"reader": [1]}, "allow_shared": True})
    assert shared.lines() == ["GPU 0: train", "GPU 1: train, reader"]


@pytest.mark.parametrize("table, problem", [
    ({"train": [0, 0]}, "train: [0, 0]: a GPU is listed twice"),
    ({"train": [-1]}, "train: [-1]: expected GPU indices >= 0"),
    ({"services": {"reader": []}}, "services.reader: []: expected at least one GPU"),
    ({"services": {"train": [3]}}, "services.train: 'train' names the trainer's GPUs"),
    ({"train": [0], "cpu_ranks": 2}, "cpu_ranks: 2: for a CPU run only; with training GPUs [0]"),
    ({"cpu_ranks": 0}, "cpu_ranks: Input should be greater than or equal to 1"),
])
def test_malformed_layouts_are_refused_naming_the_key(table, problem):
    with pytest.raises(InputError) as info:
        _layout(table)
    assert f"node.toml: {problem}" in str(info.value)


def test_the_training_layout_sets_cuda_visible_devices_or_refuses_a_disagreement():
    layout = DeviceLayout(train=[2, 3], services={"reader": [0]})
    env: dict[str, str] = {"LOCAL_WORLD_SIZE": "2"}
    apply_training_layout(layout, environ=env)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"  # local rank r runs on train[r]
    apply_training_layout(layout, environ=env)  # the same value again (a later stage): accepted
    with pytest.raises(InputError, match="CUDA_VISIBLE_DEVICES=0,1 is set and differs"):
        apply_training_layout(layout, environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    with pytest.raises(InputError, match="3 local ranks but 2 training GPU"):
        apply_training_layout(layout, environ={"LOCAL_WORLD_SIZE": "3"})
    untouched: dict[str, str] = {}
    apply_training_layout(DeviceLayout(), environ=untouched)  # no layout: nothing placed
    assert untouched == {}


def test_a_layout_naming_a_missing_gpu_is_refused():
    with pytest.raises(InputError, match="GPU 7 named in the layout, but this node has 4 GPU"):
        DeviceLayout(train=[0, 1], services={"reader": [7]}).check_count(4)
    DeviceLayout(train=[0, 1], services={"reader": [3]}).check_count(4)


def test_the_devices_command_prints_the_layout_and_one_use(tmp_path):
    config = tmp_path / "node.toml"
    config.write_text('model = "x"\n[devices]\ntrain = [0, 1, 2]\nservices = { reader = [3] }\n', encoding="utf-8")
    runner = CliRunner()
    shown = runner.invoke(app, ["devices", "--config", str(config)])
    assert shown.exit_code == 0 and shown.output.splitlines() == [
        "GPU 0: train", "GPU 1: train", "GPU 2: train", "GPU 3: reader"]
    assert runner.invoke(app, ["devices", "--config", str(config), "--for", "reader"]).output == "3\n"
    assert runner.invoke(app, ["devices", "--config", str(config), "--for", "train"]).output == "0,1,2\n"
    unknown = runner.invoke(app, ["devices", "--config", str(config), "--for", "judge"])
    assert unknown.exit_code == 2 and "expected one of: train, reader" in unknown.output
    clash = runner.invoke(app, ["devices", "--config", str(config), "--set", "devices.services.reader=[2]"])
    assert clash.exit_code == 2
    assert "--set devices.services.reader=[2]: devices.services: GPU 2 is given to both" in clash.output


def test_the_pipeline_gives_every_stage_its_layout_and_refuses_a_launched_server_without_gpus():
    sets = ["devices.train=[0]", 'devices.services={reader = [1]}']
    cfg = load_config(MP_CPU, sets, model=MemoryPolicyPipeline)
    layout = DeviceLayout(train=[0], services={"reader": [1]})
    assert cfg.sft_config(["rows.jsonl"], 1).devices == layout
    assert cfg.grpo_config("train", 1, None).devices == layout
    with pytest.raises(InputError, match="grpo: devices set by the pipeline itself"):
        load_config(MP_CPU, ["grpo.devices={train = [3]}"], model=MemoryPolicyPipeline)
    launched = ["stage2.enabled=true", 'stage2.memory_serving="http"', "schema_mode=false",
                "episode.backends.memory.sampling.temperature=0"]
    with pytest.raises(InputError, match="give it GPUs of its own in the layout, e.g. services = { stage1 = .1. }"):
        load_config(MP_CPU, sets + launched, model=MemoryPolicyPipeline)
    ok = load_config(MP_CPU, ["devices.train=[0]", 'devices.services={reader = [1], stage1 = [2]}', *launched],
                     model=MemoryPolicyPipeline)
    assert ok.stage2_config("train", 1, "merged1").devices.services["stage1"] == [2]


def test_placement_changes_neither_a_resume_nor_a_stage_fingerprint(tmp_path):
    from memsearch.pipelines.trainer_stages import _trainer_record

    plain = GRPOConfig(data="train")
    placed = plain.model_copy(update={"devices": DeviceLayout(train=[0, 1]), "gradient_checkpointing": True})
    cpu_ranks = plain.model_copy(update={"devices": DeviceLayout(cpu_ranks=2)})
    record = tmp_path / "grpo.stage.json"
    assert (_trainer_record(tmp_path / "a", record, "grpo", plain, {}).fingerprint
            == _trainer_record(tmp_path / "a", record, "grpo", placed, {}).fingerprint
            == _trainer_record(tmp_path / "a", record, "grpo", cpu_ranks, {}).fingerprint)
    changed = plain.model_copy(update={"steps": plain.steps + 1})
    assert (_trainer_record(tmp_path / "a", record, "grpo", changed, {}).fingerprint
            != _trainer_record(tmp_path / "a", record, "grpo", plain, {}).fingerprint)
    # a run folder written before the placement fields existed resumes with them at any value
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(without_placement(plain.model_dump(mode="json"))), encoding="utf-8")
    check_run_folder(placed, run, resume=True, dist=Dist())
    check_run_folder(cpu_ranks, run, resume=True, dist=Dist())
    with pytest.raises(InputError, match="config differs from the run being resumed"):
        check_run_folder(changed, run, resume=True, dist=Dist())


def test_the_device_check_of_a_cpu_layout_and_its_refusal_of_gpus_torch_cannot_see():
    """The GPU path (matmul and one-token generate per GPU) needs CUDA and does not run here."""
    import torch

    from memsearch.experiment.device_check import check_devices

    assert not torch.cuda.is_available()  # this CPU machine: the refusal below is the real one
    lines: list[str] = []
    assert check_devices(DeviceLayout(), echo=lines.append) == {
        "cuda": False, "gpus": [], "note": "no GPU in the layout: CPU run"}
    assert lines == ["devices: no GPU in the layout: CPU run"]
    with pytest.raises(InputError) as info:
        check_devices(DeviceLayout(train=[0, 1], services={"reader": [3]}), echo=lines.append)
    message = str(info.value)
    assert message.startswith("devices: the layout names 3 GPU(s) (0, 1, 3; indices up to 3 need 4), but torch "
                              f"sees 0: torch {torch.__version__} ")
    assert "NVIDIA driver " in message and "install the torch build for this node's driver" in message
    assert len(lines) == 1  # refused before any GPU was tried
