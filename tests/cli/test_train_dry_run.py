"""`memsearch train grpo|sft --dry-run`: the memory pre-flight through the real CLI. It reads the
model's config.json only, prints the estimate per GPU, creates nothing, and exits 0 when the step
fits the GPU and 2 (the numbers and the fix) when it does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsearch.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
QWEN_7B = json.dumps(str(ROOT / "configs" / "model_shapes" / "qwen2.5-7b-instruct"))


def dry_run(kind: str, config: Path, out: Path, *extra: str):
    return CliRunner().invoke(app, ["train", kind, "--config", str(config), "--out", str(out), "--dry-run", *extra])


def test_grpo_recipe_fits_an_80_gb_gpu_and_creates_nothing(tmp_path):
    out = tmp_path / "run"
    result = dry_run("grpo", ROOT / "configs/train/grpo_gpu.toml", out, "--set", f"model={QWEN_7B}",
                     "--gpu-memory", "79.6")
    assert result.exit_code == 0, result.output
    assert "peak per GPU" in result.stdout and "KV cache" in result.stdout and "fits: needs" in result.stdout
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_refuses_qwen_7b_at_16384_tokens_without_checkpointing(tmp_path):
    out = tmp_path / "run"
    result = dry_run("grpo", ROOT / "configs/train/grpo_gpu.toml", out, "--set", f"model={QWEN_7B}",
                     "--set", "update.micro_batch_tokens=16384", "--set", "gradient_checkpointing=false",
                     "--gpu-memory", "79.6")
    assert result.exit_code == 2, result.output
    assert "error: --gpu-memory 79.6: the step needs about" in result.stderr
    assert "gradient_checkpointing = true" in result.stderr and "lower update.micro_batch_tokens to" in result.stderr
    assert "activations" in result.stdout  # the estimate was printed before the refusal
    assert not out.exists()


def test_sft_of_the_embedded_model_and_a_too_small_gpu(tmp_path, short_sft_rows):
    out = tmp_path / "run"
    args = ("--set", f"data={json.dumps([str(short_sft_rows)])}")
    fits = dry_run("sft", ROOT / "configs/train/sft_cpu.toml", out, *args, "--gpu-memory", "24")
    assert fits.exit_code == 0, fits.output
    assert "SFT micro-batch" in fits.stdout and "llama" in fits.stdout
    refused = dry_run("sft", ROOT / "configs/train/sft_cpu.toml", out, *args, "--gpu-memory", "0.5")
    assert refused.exit_code == 2 and "error: --gpu-memory 0.5:" in refused.stderr
    assert not out.exists()


def test_a_model_without_config_json_is_refused(tmp_path):
    result = dry_run("grpo", ROOT / "configs/train/grpo_gpu.toml", tmp_path / "run", "--gpu-memory", "80")
    assert result.exit_code == 2  # the recipe's placeholder model folder
    assert "no config.json" in result.stderr and "configs/model_shapes" in result.stderr


def test_gpu_memory_belongs_to_dry_run(tmp_path):
    result = CliRunner().invoke(app, ["train", "grpo", "--config", str(ROOT / "configs/train/grpo_gpu.toml"),
                                      "--out", str(tmp_path / "run"), "--gpu-memory", "80"])
    assert result.exit_code == 2 and "--gpu-memory is for --dry-run" in result.stderr
    assert not (tmp_path / "run").exists()


def test_without_a_gpu_the_memory_must_be_given(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the dry run checks against it")
    result = dry_run("grpo", ROOT / "configs/train/grpo_gpu.toml", tmp_path / "run", "--set", f"model={QWEN_7B}")
    assert result.exit_code == 2
    assert "no GPU found: give --gpu-memory" in result.stderr and "peak per GPU" in result.stdout
    assert not (tmp_path / "run").exists()
