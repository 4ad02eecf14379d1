"""scripts/gpu_smoke.sh (bench/gpu_smoke.py): its CPU dry run writes a strict-JSON record per part
with sane values, a failing part records its error and the next part still runs, a hung part is
killed at its limit."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest

from memsearch.assets.samples import repository_root

_REPO = repository_root()
SHAPES = ("qwen2.5-0.5b-instruct", "qwen2.5-7b-instruct")
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)


def _refuse_constant(name: str):
    raise AssertionError(f"not strict JSON: {name}")


def _records(out) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text(), parse_constant=_refuse_constant) for p in out.glob("*.json")}


def _env(tmp_path) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable,
           # the parts are separate processes: let them share compiled bytecode (in tmp_path, not the tree)
           "PYTHONPYCACHEPREFIX": str(tmp_path / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _smoke(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(_REPO / "scripts" / "gpu_smoke.sh"), "--dry-run", *args],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path, env=_env(tmp_path))


def _lora_elements(shape: str, r: int) -> int:
    """LoRA r x (in + out) of the seven projections of every layer, from the shape's config."""
    config = {**json.loads((_REPO / "configs" / "model_shapes" / shape / "config.json").read_text()), **TINY}
    h, i = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * h // config["num_attention_heads"]
    per_layer = 2 * (h + h) + 2 * (h + kv) + 3 * (h + i)  # q, o; k, v; gate, up, down
    return r * per_layer * config["num_hidden_layers"]


@pytest.mark.slow
def test_dry_run_writes_a_sane_record_per_part(tmp_path):
    out = tmp_path / "records"
    t0 = time.perf_counter()
    done = _smoke(tmp_path, "--out", str(out))
    took = time.perf_counter() - t0
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    records = _records(out)
    parts = ["device", "nccl", *(f"grpo-{s}" for s in SHAPES)]
    assert sorted(records) == sorted([*parts, "summary"])
    summary = records.pop("summary")
    assert summary["ok"] is True and summary["dry_run"] is True
    assert [p["part"] for p in summary["parts"]] == parts and all(p["ok"] for p in summary["parts"])
    assert 0 < summary["total_s"] <= took
    for name, rec in records.items():
        assert rec["part"] == name and rec["ok"] is True and rec["error"] is None, rec
        assert 0 < rec["wall_s"] <= rec["time_limit_s"] and "non_finite" not in rec

    device = records["device"]
    import torch

    assert device["kind"] == "cpu" and device["torch"] == torch.__version__ and device["memory_bytes"] > 2**30
    assert device["packages"]["transformers"] and device["packages"]["pydantic"]

    nccl = records["nccl"]
    assert nccl["backend"] == "gloo" and "gloo" in nccl["fallback"] and nccl["world_size"] == 1
    assert nccl["buffer_elements"] == _lora_elements(SHAPES[-1], r=4) and nccl["buffer_bytes"] == 4 * nccl[
        "buffer_elements"]
    assert nccl["sum_unchanged"] is True and len(nccl["all_reduce_s"]) == nccl["iterations"] == 10
    assert all(t > 0 for t in nccl["all_reduce_s"]) and nccl["algbw_gb_s"] > 0

    for shape in SHAPES:
        rec = records[f"grpo-{shape}"]
        config = json.loads((_REPO / "configs" / "model_shapes" / shape / "config.json").read_text())
        model = rec["model"]
        # the real vocabulary and head tying, tiny layers; the tokenizer is the embedded one
        assert model["vocab_size"] == config["vocab_size"] and model["tokenizer_ids"] == 49152
        assert model["tie_word_embeddings"] == config.get("tie_word_embeddings", False)
        assert (model["hidden_size"], model["num_hidden_layers"]) == (64, 2) and model["dtype"] == "float32"
        run = rec["run"]
        assert run["micro_batch_tokens"] == 4096 and run["gradient_checkpointing"] is True
        assert run["steps"] == 2 and run["rollout_backend"] == "hf" and run["device"] == "cpu"
        assert [s["step"] for s in rec["steps"]] == [1, 2]
        for step in rec["steps"]:
            assert step["generated_tokens"] > 0 and step["trained_tokens"] > 0
            assert step["rollout_tok_s"] > 0 and step["update_tok_s"] > 0
            assert math.isfinite(step["logprob_mismatch_mean"])
        assert rec["rollout_tok_s"] == rec["steps"][-1]["rollout_tok_s"] > 0
        assert rec["update_tok_s"] == rec["steps"][-1]["update_tok_s"] > 0
        # float32 sampler and trainer agree to round-off (the bf16 gap on a GPU is ~1e-2)
        assert 0 <= rec["logprob_mismatch_mean"] < 1e-4
        assert rec["estimate_bytes"] > 0 and rec["estimate_lines"]
        assert rec["peak_bytes"] > 0 and "stand-in" in rec["peak_source"]
        assert rec["peak_over_estimate"] == pytest.approx(rec["peak_bytes"] / rec["estimate_bytes"])


@pytest.mark.slow
def test_a_failing_part_records_its_error_and_the_next_part_runs(tmp_path):
    out = tmp_path / "records"
    done = _smoke(tmp_path, "--out", str(out), "--shapes", "no-such-shape")
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-4000:]
    records = _records(out)
    assert records["device"]["ok"] is True  # the first part passed; the failures came after it
    for part in ("nccl", "grpo-no-such-shape"):
        error = records[part]["error"]
        assert records[part]["ok"] is False and error["type"] == "FileNotFoundError"
        assert "no-such-shape" in error["message"] and "Traceback" in error["traceback"]
    assert records["summary"]["ok"] is False
    assert [p["ok"] for p in records["summary"]["parts"]] == [True, False, False]


def test_parts_the_budget_cannot_hold_are_recorded_as_skipped(tmp_path):
    out = tmp_path / "records"
    done = subprocess.run([sys.executable, str(_REPO / "bench" / "gpu_smoke.py"), "--dry-run", "--out", str(out),
                           "--budget-s", "5"], capture_output=True, text=True, timeout=120, env=_env(tmp_path))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    records = _records(out)
    assert sorted(records) == sorted(["summary", "device", "nccl", *(f"grpo-{s}" for s in SHAPES)])
    assert records["summary"]["ok"] is False and all(p["error"] == "Skipped" for p in records["summary"]["parts"])
    assert records["nccl"]["error"]["type"] == "Skipped" and "budget of 5 s" in records["nccl"]["error"]["message"]


def _bench_module(monkeypatch):
    monkeypatch.syspath_prepend(str(_REPO / "bench"))
    import gpu_smoke

    return gpu_smoke


def test_a_part_past_its_limit_is_killed_and_recorded_with_its_output(tmp_path, monkeypatch):
    smoke = _bench_module(monkeypatch)
    log = tmp_path / "part.log"
    cmd = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    code, wall, _ = smoke.run_child(cmd, dict(os.environ), log, limit_s=3)
    assert code is None and 3 <= wall < 30
    record = smoke.part_record("nccl", tmp_path / "absent.json", code, log.read_text(), wall, 3)
    assert record["ok"] is False and record["error"]["type"] == "Timeout"
    assert "time limit of 3 s" in record["error"]["message"] and "started" in record["error"]["traceback"]


def test_a_record_is_strict_json_with_non_finite_numbers_named(tmp_path, monkeypatch):
    smoke = _bench_module(monkeypatch)
    path = tmp_path / "r.json"
    smoke.write_record(path, {"part": "x", "steps": [{"kl": float("nan")}, {"kl": 0.5}], "peak": float("inf")})
    got = json.loads(path.read_text(), parse_constant=_refuse_constant)
    assert got["steps"] == [{"kl": None}, {"kl": 0.5}] and got["peak"] is None
    assert got["non_finite"] == ["steps[0].kl", "peak"]
