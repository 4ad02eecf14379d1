"""studies.memory_policy.ship (module and command): an adapter copied out of a memory-policy run
folder with its fingerprint and the run's provenance; refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from studies.memory_policy import ship

from memsearch.assets.adapter import FINGERPRINT, verify_adapter
from memsearch.errors import InputError
from memsearch.io import sha256_file, write_json
from memsearch.pipelines.stage_record import Stage, folder_sha256

ROOT = Path(__file__).resolve().parents[2]


def _script():
    return ship


def _summary(folder: Path, recall: float, scored: int = 4) -> None:
    folder.mkdir(parents=True)
    write_json(folder / "summary.json", {"metrics": {"memory_support_recall": recall, "retrieval_support_recall": 0.5,
                                                      "f1": 0.25, "em": 0.0, "invalid_action_rate": 0.1},
                                         "tasks": {"expected": scored, "scored": scored, "failed": 0},
                                         "complete": True, "usable_for_comparison": True, "note": None,
                                         "evaluator_version": "eval-5", "request_errors": 0})


def make_run(run: Path, seed: int = 1) -> Path:
    """The files of a finished `memsearch pipeline memory-policy` run that shipping reads, laid out
    as the pipeline lays them out (records written with the pipeline's own Stage)."""
    run.mkdir(parents=True)
    (run / "invocations.jsonl").write_text(
        json.dumps({"time": "t0", "config": {"model": "embedded", "seeds": [9]}}) + "\n"
        + json.dumps({"time": "t1", "config": {"model": "embedded", "seeds": [seed], "schema_mode": True}}) + "\n",
        encoding="utf-8")
    prepare = Stage(
        run / "prepare",
        "prepare",
        {"data": {"train_questions": 4}, "train_sha256": "aa", "dev_sha256": "bb"},
        run / "prepare.stage.json",
    )
    prepare.start()
    (run / "prepare" / "train").mkdir(parents=True)
    write_json(run / "prepare" / "train" / "manifest.json", {"files": {"tasks.jsonl": "cc"}})
    prepare.finish({"train_dev_overlap": 0})
    export = Stage(run / "teacher" / "export", "export-sft", {}, run / "teacher" / "export.stage.json")
    export.start()
    export.finish({"rows_sha256": "dd"})
    grpo1 = run / f"seed-{seed}" / "grpo1"
    stage = Stage(grpo1, "grpo1", {"grpo": {"steps": 1}}, run / f"seed-{seed}" / "grpo1.stage.json")
    stage.start()
    (grpo1 / "adapter").mkdir(parents=True)
    (grpo1 / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 16}), encoding="utf-8")
    (grpo1 / "adapter" / "adapter_model.safetensors").write_bytes(b"\x07weights" * 50)
    (grpo1 / "adapter" / "README.md").write_text("peft model card", encoding="utf-8")
    stage.finish({"adapter": "adapter", "adapter_sha256": folder_sha256(grpo1 / "adapter")})
    _summary(run / "heldout" / "rules", 0.30)
    _summary(run / "heldout" / "base", 0.10)
    _summary(run / f"seed-{seed}" / "heldout" / "sft", 0.35)
    _summary(run / f"seed-{seed}" / "heldout" / "grpo", 0.42)
    write_json(run / "heldout" / "summary.json", {"per_seed": {str(seed): {"grpo-rules": {"f1": {"diff": 0.1}}}}})
    return grpo1 / "adapter"


def test_ship_copies_the_adapter_files_and_records_the_runs_provenance(tmp_path, capsys):
    source = make_run(tmp_path / "mp")
    dest = tmp_path / "models" / "memory-policy-cpu"
    assert _script().main([str(source), "--run", str(tmp_path / "mp"), "--seed", "1", "--dest", str(dest)]) == 0
    assert sorted(p.name for p in dest.iterdir()) == ["adapter_config.json", "adapter_model.safetensors", FINGERPRINT]
    record = verify_adapter(dest, base_model="embedded", required=True)
    assert record["files"] == {n: sha256_file(source / n) for n in ("adapter_config.json", "adapter_model.safetensors")}
    p = record["provenance"]
    assert (p["seed"], p["source"], p["config"]["schema_mode"]) == (
        1,
        "seed-1/grpo1/adapter",
        True,
    )  # the last invocation
    assert p["stage"]["outputs"]["adapter_sha256"] == folder_sha256(source)
    assert p["data"]["prepare_inputs"]["train_sha256"] == "aa" and p["data"]["prepared"]["train"] == {
        "tasks.jsonl": "cc"
    }
    assert p["data"]["teacher_rows"] == {"export": "dd"}
    assert {k: v["metrics"]["memory_support_recall"] for k, v in p["heldout"].items() if k != "differences"} == {
        "base": 0.10,
        "rules": 0.30,
        "sft": 0.35,
        "grpo": 0.42,
    }
    assert p["heldout"]["differences"] == {"grpo-rules": {"f1": {"diff": 0.1}}}
    out = capsys.readouterr().out
    assert f"adapter_model.safetensors  sha256 {sha256_file(source / 'adapter_model.safetensors')}" in out


def test_shipped_adapter_config_names_the_base_as_the_config_does_not_a_machine_path(tmp_path):
    """peft writes the trainer's base folder (an absolute cache path for the embedded model) into
    adapter_config.json; the shipped copy says ``embedded`` and the provenance keeps the source hash."""
    source = make_run(tmp_path / "mp")
    cache_path = "/" + "/".join(["home", "someone", ".cache", "memsearch", "embedded", "model"])
    (source / "adapter_config.json").write_text(
        json.dumps({"r": 16, "base_model_name_or_path": cache_path}), encoding="utf-8"
    )
    stage_file = tmp_path / "mp" / "seed-1" / "grpo1.stage.json"
    stage = json.loads(stage_file.read_text())  # the trainer's own output, recorded as the pipeline records it
    stage["outputs"]["adapter_sha256"] = folder_sha256(source)
    stage_file.write_text(json.dumps(stage))
    dest = tmp_path / "shipped"
    _script().main([str(source), "--run", str(tmp_path / "mp"), "--seed", "1", "--dest", str(dest)])
    shipped = json.loads((dest / "adapter_config.json").read_text())
    assert shipped == {"r": 16, "base_model_name_or_path": "embedded"}
    record = verify_adapter(dest, base_model="embedded", required=True)
    assert record["provenance"]["adapter_config_normalized"]["source_sha256"] == sha256_file(
        source / "adapter_config.json"
    )
    assert record["files"]["adapter_model.safetensors"] == sha256_file(source / "adapter_model.safetensors")
    assert cache_path not in (dest / FINGERPRINT).read_text()


def test_ship_refuses_to_overwrite_without_force(tmp_path, capsys):
    source = make_run(tmp_path / "mp")
    dest = tmp_path / "shipped"
    args = [str(source), "--run", str(tmp_path / "mp"), "--seed", "1", "--dest", str(dest)]
    script = _script()
    assert script.main(args) == 0
    before = (dest / FINGERPRINT).read_bytes()
    assert script.main(args) == 2
    assert f"{dest}: exists and is not empty; pass --force" in capsys.readouterr().err
    assert (dest / FINGERPRINT).read_bytes() == before
    assert script.main(args + ["--force"]) == 0
    verify_adapter(dest, required=True)


def test_ship_refuses_an_adapter_that_is_not_the_runs_stage1_output(tmp_path):
    from studies.memory_policy.ship import ship_adapter

    source = make_run(tmp_path / "mp")
    (source / "adapter_model.safetensors").write_bytes(b"edited after training")
    with pytest.raises(InputError, match="is not the stage-1 adapter recorded in"):
        ship_adapter(source, tmp_path / "mp", 1, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
    with pytest.raises(InputError, match=r"seed-2/grpo1\.stage\.json: missing"):
        ship_adapter(source, tmp_path / "mp", 2, tmp_path / "dest")


def test_ship_refuses_a_seed_without_its_heldout_evaluation(tmp_path):
    from studies.memory_policy.ship import ship_adapter

    source = make_run(tmp_path / "mp")
    (tmp_path / "mp" / "seed-1" / "heldout" / "grpo" / "summary.json").unlink()
    with pytest.raises(InputError, match=r"heldout/grpo/summary\.json: missing; ship an adapter only after"):
        ship_adapter(source, tmp_path / "mp", 1, tmp_path / "dest")


def test_ship_with_dtype_stores_bf16_weights_and_records_the_cast(tmp_path):
    """--dtype bfloat16 halves the float weights (integer tensors kept), the fingerprint pins the
    cast file, and the provenance names the float32 source by hash."""
    import torch
    from safetensors.torch import load_file, save_file

    source = make_run(tmp_path / "mp")
    weights = {
        "base_model.model.layers.0.q_proj.lora_A.weight": torch.randn(16, 64),
        "base_model.model.layers.0.q_proj.lora_B.weight": torch.randn(64, 16),
        "steps": torch.arange(3),
    }
    save_file(weights, str(source / "adapter_model.safetensors"), metadata={"format": "pt"})
    stage_file = tmp_path / "mp" / "seed-1" / "grpo1.stage.json"
    stage = json.loads(stage_file.read_text())
    stage["outputs"]["adapter_sha256"] = folder_sha256(source)
    stage_file.write_text(json.dumps(stage))
    dest = tmp_path / "shipped"
    assert (
        _script().main(
            [str(source), "--run", str(tmp_path / "mp"), "--seed", "1", "--dest", str(dest), "--dtype", "bfloat16"]
        )
        == 0
    )
    shipped = load_file(str(dest / "adapter_model.safetensors"))
    assert {k: v.dtype for k, v in shipped.items()} == {
        "base_model.model.layers.0.q_proj.lora_A.weight": torch.bfloat16,
        "base_model.model.layers.0.q_proj.lora_B.weight": torch.bfloat16,
        "steps": torch.int64,
    }
    for name in ("base_model.model.layers.0.q_proj.lora_A.weight", "base_model.model.layers.0.q_proj.lora_B.weight"):
        assert torch.equal(shipped[name], weights[name].to(torch.bfloat16))
    record = verify_adapter(dest, base_model="embedded", required=True)
    cast = record["provenance"]["weights_cast"]
    assert cast["source_sha256"] == sha256_file(source / "adapter_model.safetensors") and cast["dtype"] == "bfloat16"
    assert cast["source_dtypes"] == ["float32", "int64"] and cast["bytes"] < 0.6 * cast["source_bytes"]
    assert record["files"]["adapter_model.safetensors"] == sha256_file(dest / "adapter_model.safetensors")
