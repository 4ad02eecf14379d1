"""`memsearch demo`'s B-trained row: group B with the trained memory-policy adapter beside A-D."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.assets.adapter import ADAPTER_ENV, FINGERPRINT, write_fingerprint
from memsearch.errors import InputError

ROOT = Path(__file__).resolve().parents[2]


def test_the_hf_demo_fails_at_once_naming_a_missing_adapter(monkeypatch, tmp_path):
    from memsearch.pipelines.demo import run_demo

    monkeypatch.setenv(ADAPTER_ENV, str(tmp_path / "no-adapter"))
    with pytest.raises(
        InputError, match=rf"{tmp_path / 'no-adapter'}: no such adapter folder \(the shipped memory-policy adapter"
    ):
        run_demo(backend="hf", limit=1, out=tmp_path / "demo", echo=lambda _: None, show_progress=False)
    assert not (tmp_path / "demo").exists()  # refused before the data was prepared


def test_the_hf_demo_refuses_a_changed_adapter_before_writing_anything(tmp_path):
    from memsearch.pipelines.demo import run_demo

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}", encoding="utf-8")
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    write_fingerprint(adapter, "embedded", {})
    (adapter / "adapter_model.safetensors").write_bytes(b"other weights")
    with pytest.raises(
        InputError, match=r"adapter_model\.safetensors: sha256 [0-9a-f]{64} does not match .*'s [0-9a-f]{64}"
    ):
        run_demo(
            backend="hf", limit=1, out=tmp_path / "demo", echo=lambda _: None, show_progress=False, adapter=adapter
        )
    assert not (tmp_path / "demo").exists()


def test_the_trained_group_is_group_b_with_only_the_memory_adapter_and_schema_mode_changed(tmp_path):
    from memsearch.config import group_config, load_config
    from memsearch.pipelines.demo import trained_group_config

    config = load_config(ROOT / "configs" / "demo.toml", ["limit=4"])
    trained = trained_group_config(config, tmp_path / "adapter").model_dump(mode="json")
    b = group_config(config, "B").model_dump(mode="json")
    assert trained["backends"]["memory"] == {
        **b["backends"]["memory"],
        "adapter": str((tmp_path / "adapter").resolve()),
        "schema_mode": True,
    }
    trained["backends"]["memory"] = b["backends"]["memory"]
    assert trained == b  # same budgets, reader, controller, retrieval, limit


def test_both_rows_beside_b_take_the_format_the_adapter_was_trained_in(tmp_path):
    from memsearch.config import group_config, load_config
    from memsearch.pipelines.demo import rules_group_config, trained_group_config

    config = load_config(ROOT / "configs" / "demo.toml", ["limit=4"])
    b = group_config(config, "B").model_dump(mode="json")
    assert b["agent"]["memory_format"] == "text"
    for row in (trained_group_config(config, tmp_path / "adapter", "extractive"),
                rules_group_config(config, "extractive")):
        data = row.model_dump(mode="json")
        assert data["agent"] == {**b["agent"], "memory_format": "extractive"}
        assert data["budgets"] == b["budgets"] and data["backends"]["reader"] == b["backends"]["reader"]


def test_the_rules_row_is_group_b_with_only_the_memory_backend_changed():
    from memsearch.config import group_config, load_config
    from memsearch.pipelines.demo import rules_group_config

    config = load_config(ROOT / "configs" / "demo.toml", ["limit=4"])
    rules = rules_group_config(config).model_dump(mode="json")
    b = group_config(config, "B").model_dump(mode="json")
    # the rules kind keeps what every kind shares and holds no model settings
    assert rules["backends"]["memory"] == {"kind": "rules", "sampling": b["backends"]["memory"]["sampling"],
                                           "schema_mode": False}
    assert b["backends"]["memory"]["kind"] == "hf" and b["backends"]["memory"]["schema_mode"] is False
    rules["backends"]["memory"] = b["backends"]["memory"]
    assert rules == b  # same budgets, reader, controller, retrieval, limit


@pytest.mark.slow  # the embedded model twice on one question, and the whole dev sample prepared (~1-2 min on 2 cores)
def test_the_hf_demo_runs_b_trained_beside_the_other_groups(tmp_path, embedded_lora_adapter):
    import shutil

    from memsearch.pipelines.demo import run_demo

    # The stand-in adapter's provenance says it was trained in the extractive format, as a v3 run's is.
    adapter = tmp_path / embedded_lora_adapter.name
    shutil.copytree(embedded_lora_adapter, adapter)
    write_fingerprint(adapter, "embedded", {"config": {"episode": {"agent": {"memory_format": "extractive"}}}})
    embedded_lora_adapter = adapter
    lines: list[str] = []
    result = run_demo(
        backend="hf",
        limit=1,
        out=tmp_path / "demo",
        echo=lines.append,
        show_progress=False,
        adapter=embedded_lora_adapter,
        overrides=['matrix.groups=["B"]'],
    )
    matrix = tmp_path / "demo" / "matrix"
    assert list(result["groups"]) == ["B", "B-rules", "B-trained"]
    # The row is in the printed table and in matrix.md, with the adapter named as the memory backend.
    row = next(line for line in lines[2].splitlines() if line.startswith("| B-trained |"))
    assert f"| decision | fixed | hf:embedded+{embedded_lora_adapter.name} |" in row
    assert (matrix / "matrix.md").read_text(encoding="utf-8") == lines[2]
    written = json.loads((matrix / "matrix.json").read_text(encoding="utf-8"))
    assert set(written["groups"]) == {"B", "B-rules", "B-trained"}
    # B-rules: the same group B with the hand-written memory policy, the one a trained policy must beat.
    rules = json.loads((matrix / "B-rules" / "config.json").read_text(encoding="utf-8"))
    assert rules["backends"]["memory"]["kind"] == "rules" and written["groups"]["B-rules"]["complete"]
    fingerprint = json.loads((embedded_lora_adapter / FINGERPRINT).read_text(encoding="utf-8"))
    assert written["trained_adapter"]["files"] == fingerprint["files"]
    # The B-trained run used that adapter, in schema mode, under B's budgets on the same question.
    summary = json.loads((matrix / "B-trained" / "summary.json").read_text(encoding="utf-8"))
    b_summary = json.loads((matrix / "B" / "summary.json").read_text(encoding="utf-8"))
    assert summary["memory_backend"]["adapter"] == str(embedded_lora_adapter.resolve())
    resolved = {g: json.loads((matrix / g / "config.json").read_text(encoding="utf-8")) for g in ("B", "B-trained")}
    assert resolved["B-trained"]["backends"]["memory"]["schema_mode"] is True
    assert resolved["B"]["backends"]["memory"]["schema_mode"] is False
    # Both rows beside B run in the adapter's format; B keeps the demo's.
    assert resolved["B"]["agent"]["memory_format"] == "text"
    assert resolved["B-trained"]["agent"]["memory_format"] == rules["agent"]["memory_format"] == "extractive"
    assert "extractive memory format" in lines[1]
    assert resolved["B-trained"]["backends"]["reader"] == resolved["B"]["backends"]["reader"]
    assert summary["budgets"] == b_summary["budgets"] == result["budgets"]
    assert summary["tasks"]["scored"] == b_summary["tasks"]["scored"] == 1
    run = json.loads((matrix / "B-trained" / "run.json").read_text(encoding="utf-8"))
    assert {k: v for k, v in run["models"]["memory"]["adapter_files"].items() if k != FINGERPRINT} == fingerprint[
        "files"
    ]
    # Its pair with B is compared on that question, and the report shows both runs.
    pair = next(p for p in result["pairs"] if (p["a"], p["b"]) == ("B", "B-trained"))
    assert pair["f1"]["n"] == 1
    b_f1 = b_summary["metrics"]["f1"]
    assert pair["f1"]["diff"] == pytest.approx(b_f1 - summary["metrics"]["f1"])
    from memsearch.report.html import payload_of_html

    payload = payload_of_html((tmp_path / "demo" / "report.html").read_text(encoding="utf-8"))
    assert payload["run_order"] == ["B", "B-rules", "B-trained"]


@pytest.mark.slow  # prepares the whole 1000-question dev sample, as the demo does
def test_the_rules_demo_has_no_trained_row_and_says_so(monkeypatch, tmp_path):
    from memsearch.pipelines.demo import run_demo

    monkeypatch.setenv(ADAPTER_ENV, str(tmp_path / "no-adapter"))  # not needed, so not checked
    lines: list[str] = []
    result = run_demo(backend="rules", limit=1, out=tmp_path / "demo", echo=lines.append, show_progress=False)
    assert lines[1].startswith(
        "B-trained: not run with --backend rules: the trained adapter is a LoRA on the embedded model"
    )
    assert list(result["groups"]) == ["A", "B", "C", "D"] and "trained_adapter" not in result
    assert not (tmp_path / "demo" / "matrix" / "B-trained").exists()
    assert "B-trained" not in (tmp_path / "demo" / "matrix" / "matrix.md").read_text(encoding="utf-8")
