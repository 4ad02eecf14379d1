"""The shipped memory-policy adapter: where it is found, its fingerprint, and loading refusing a
changed file (memsearch.assets.adapter; docs/memory_policy.md "The shipped adapter and group B configs")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.assets.adapter import (
    ADAPTER_ENV,
    FINGERPRINT,
    read_fingerprint,
    shipped_adapter_dir,
    verify_adapter,
    write_fingerprint,
)
from memsearch.errors import InputError
from memsearch.io import sha256_file

ROOT = Path(__file__).resolve().parents[2]


def fake_adapter(folder: Path) -> Path:
    """An adapter-shaped folder (the fingerprint never parses the weights)."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 2, "peft_type": "LORA"}), encoding="utf-8")
    (folder / "adapter_model.safetensors").write_bytes(b"\x00weights" * 100)
    return folder


def test_shipped_adapter_dir_is_the_checkout_folder_unless_the_variable_names_another(monkeypatch, tmp_path):
    monkeypatch.delenv(ADAPTER_ENV, raising=False)
    assert shipped_adapter_dir() == ROOT / "models" / "memory-policy-cpu"
    monkeypatch.setenv(ADAPTER_ENV, str(tmp_path / "elsewhere"))
    assert shipped_adapter_dir() == tmp_path / "elsewhere"


def test_fingerprint_records_every_file_the_base_and_the_provenance(tmp_path):
    folder = fake_adapter(tmp_path / "a")
    (folder / "README.md").write_text("card", encoding="utf-8")
    provenance = {"run": "runs/mp", "seed": 1, "heldout": {"grpo": {"memory_support_recall": 0.41}}}
    record = write_fingerprint(folder, "embedded", provenance)
    assert record == read_fingerprint(folder)
    assert record["base_model"] == "embedded" and record["provenance"] == provenance
    assert record["files"] == {name: sha256_file(folder / name)
                               for name in ("README.md", "adapter_config.json", "adapter_model.safetensors")}
    assert verify_adapter(folder, base_model="embedded", required=True) == record


def test_a_changed_file_is_refused_naming_the_file_and_both_hashes(tmp_path):
    folder = fake_adapter(tmp_path / "a")
    shipped = write_fingerprint(folder, "embedded", {})["files"]["adapter_model.safetensors"]
    (folder / "adapter_model.safetensors").write_bytes(b"\x01tampered" * 100)
    now = sha256_file(folder / "adapter_model.safetensors")
    with pytest.raises(InputError) as err:
        verify_adapter(folder)
    message = str(err.value)
    changed = folder / "adapter_model.safetensors"
    assert f"{changed}: sha256 {now} does not match {folder / FINGERPRINT}'s {shipped}" in message
    assert "adapter_config.json" not in message.split("\n")[0]


def test_a_missing_or_extra_file_is_refused(tmp_path):
    folder = fake_adapter(tmp_path / "a")
    write_fingerprint(folder, "embedded", {})
    (folder / "adapter_model.bin").write_bytes(b"other weights")
    with pytest.raises(InputError, match=r"adapter_model\.bin: not listed in"):
        verify_adapter(folder)
    (folder / "adapter_model.bin").unlink()
    (folder / "adapter_config.json").unlink()
    with pytest.raises(InputError, match=r"adapter_config\.json: listed in .* but missing"):
        verify_adapter(folder)


def test_without_fingerprint_only_a_required_check_fails_and_it_names_the_path(tmp_path):
    folder = fake_adapter(tmp_path / "a")
    assert verify_adapter(folder) is None  # an ordinary training adapter: nothing to check
    with pytest.raises(InputError, match=rf"{tmp_path / 'a' / FINGERPRINT}: missing"):
        verify_adapter(folder, required=True)
    with pytest.raises(InputError, match=rf"{tmp_path / 'absent'}: no such adapter folder"):
        verify_adapter(tmp_path / "absent", required=True)


def test_an_embedded_adapter_is_refused_on_another_base(tmp_path):
    folder = fake_adapter(tmp_path / "a")
    write_fingerprint(folder, "embedded", {})
    with pytest.raises(InputError, match="trained on base model 'embedded'"):
        verify_adapter(folder, base_model=str(tmp_path / "some-model"))


def test_the_trained_group_b_config_refuses_a_changed_adapter_before_any_run_folder(tmp_path, hotpot_dev_dir):
    """Loading through configs/group_b_trained.toml: `memsearch eval` fails, naming the file and
    both hashes, and leaves no run folder."""
    from memsearch.config import load_config
    from memsearch.eval.runner import run_eval

    folder = fake_adapter(tmp_path / "memory-policy-cpu")
    shipped = write_fingerprint(folder, "embedded", {})["files"]["adapter_config.json"]
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8}), encoding="utf-8")
    cfg = load_config(ROOT / "configs" / "group_b_trained.toml", [f"backends.memory.adapter={folder}", "limit=1"])
    with pytest.raises(InputError) as err:
        run_eval(cfg, hotpot_dev_dir, tmp_path / "run", show_progress=False)
    assert f"sha256 {sha256_file(folder / 'adapter_config.json')} does not match" in str(err.value)
    assert shipped in str(err.value)
    assert not (tmp_path / "run").exists()


def test_the_trained_format_is_read_from_the_provenance_and_text_when_it_names_none():
    import json

    from memsearch.assets.adapter import trained_memory_format

    # v2's run (docs/results/memory_policy_cpu_v2) predates the field: it trained the text format, and
    # the adapter it shipped recorded that config as its provenance.
    v2 = Path(__file__).resolve().parents[2] / "docs" / "results" / "memory_policy_cpu_v2" / "invocations.jsonl"
    shipped = {"provenance": {"config": json.loads(v2.read_text(encoding="utf-8").splitlines()[-1])["config"]}}
    assert "memory_format" not in shipped["provenance"]["config"]["episode"]["agent"]
    assert trained_memory_format(shipped) == "text"
    extractive = {"provenance": {"config": {"episode": {"agent": {"memory_format": "extractive"}}}}}
    assert trained_memory_format(extractive) == "extractive"
    assert trained_memory_format(None) is trained_memory_format({"provenance": {"test": 1}}) is None  # unknown
    from memsearch.assets.adapter import check_memory_format

    for fingerprint, fmt in ((shipped, "text"), (extractive, "extractive"), (None, "text"), (None, "extractive")):
        check_memory_format("adapter", fingerprint, fmt)  # the trained format, or an unknown one: allowed
    with pytest.raises(InputError, match="trained in the 'text' memory format"):
        check_memory_format("adapter", shipped, "extractive")


def test_eval_refuses_an_adapter_in_another_format_than_it_was_trained_in(tmp_path, hotpot_dev_dir):
    """group_b_trained.toml (extractive format) with an adapter whose provenance says text: refused
    before any run folder exists, naming the folder, both formats and the setting that fixes it."""
    from memsearch.config import load_config
    from memsearch.eval.runner import run_eval

    folder = fake_adapter(tmp_path / "memory-policy-cpu")
    write_fingerprint(folder, "embedded", {"config": {"episode": {"agent": {"memory_format": "text"}}}})
    cfg = load_config(ROOT / "configs" / "group_b_trained.toml", [f"backends.memory.adapter={folder}", "limit=1"])
    with pytest.raises(InputError) as err:
        run_eval(cfg, hotpot_dev_dir, tmp_path / "run", show_progress=False)
    message = str(err.value)
    assert str(folder) in message and "trained in the 'text' memory format" in message
    assert "agent.memory_format is 'extractive'" in message and "--set agent.memory_format=text" in message
    assert not (tmp_path / "run").exists()
