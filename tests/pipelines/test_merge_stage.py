"""The merge stage: it records the merged folder's hash, refuses a merged folder changed since,
and merges again when an older record names no hash."""

from __future__ import annotations

import json

import pytest

from memsearch.errors import InputError
from memsearch.pipelines.stage_record import folder_sha256


@pytest.fixture(scope="module")
def tiny_adapter(tiny_model_dir, tmp_path_factory):
    """A real LoRA adapter (fresh, seeded) on the tiny Llama, saved as the trainers save it."""
    from memsearch.train.config import LoraSettings
    from memsearch.train.policy import load_policy, save_adapter

    policy, _, _ = load_policy(str(tiny_model_dir), None, LoraSettings(r=2, target_modules=["q_proj"]), device="cpu")
    out = tmp_path_factory.mktemp("adapter") / "adapter"
    save_adapter(policy, out)
    return out


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_merge_stage_records_the_merged_hash_and_refuses_a_changed_merge(tiny_model_dir, tiny_adapter, tmp_path):
    """Before, a truncated merged model passed as 'merge: done' and a later stage failed on it."""
    from memsearch.pipelines.merge_stage import merge_stage

    folder, record = tmp_path / "merged", tmp_path / "merge.stage.json"
    args = (folder, record, str(tiny_model_dir), tiny_adapter, "float32")
    merge_stage(*args, echo=lambda m: None)
    assert json.loads(record.read_text())["outputs"]["merged_sha256"] == folder_sha256(folder)
    lines: list[str] = []
    merge_stage(*args, echo=lines.append)
    assert lines == [f"merge: done ({folder})"]
    _truncate(folder / "model.safetensors")
    with pytest.raises(InputError) as exc:
        merge_stage(*args, echo=lambda m: None)
    assert str(exc.value).splitlines() == [
        f"{folder}: missing or changed since the merge finished (sha256 {folder_sha256(folder)}, recorded "
        f"{json.loads(record.read_text())['outputs']['merged_sha256']}); delete {folder} and {record} to merge "
        "again, or choose a new --out"]


def test_a_merge_recorded_without_a_hash_is_merged_again(tiny_model_dir, tiny_adapter, tmp_path):
    """A record of an older memsearch names no hash, so what the folder holds is unknown: the merge
    (deterministic, from fingerprinted inputs) is redone and its hash recorded."""
    from memsearch.pipelines.merge_stage import merge_stage

    folder, record = tmp_path / "merged", tmp_path / "merge.stage.json"
    args = (folder, record, str(tiny_model_dir), tiny_adapter, "float32")
    merge_stage(*args, echo=lambda m: None)
    intact = folder_sha256(folder)
    old = json.loads(record.read_text())
    del old["outputs"]["merged_sha256"]
    record.write_text(json.dumps(old))
    _truncate(folder / "model.safetensors")
    lines: list[str] = []
    merge_stage(*args, echo=lines.append)
    assert any("no hash" in line and "merging again" in line for line in lines), lines
    assert folder_sha256(folder) == intact == json.loads(record.read_text())["outputs"]["merged_sha256"]
