"""The trainers' periodic evaluation answered by the live policy (``train.live_eval``): no second
model is loaded, the run folder is the one ``memsearch eval`` writes for the saved adapter, and
its numbers are those of ``memsearch eval`` run afterwards on that adapter."""

from __future__ import annotations

import json

import pytest
from tests.train.grpo.test_grpo import grpo_config

from memsearch.config import RunConfig
from memsearch.eval.runner import run_eval
from memsearch.io import iter_jsonl


def memory_completions(folder) -> dict[str, list[list[int]]]:
    """Per task, the completion token ids of every memory call of the run in ``folder``."""
    return {traj["task_id"]: [e["completion_ids"] for e in traj["events"]
                              if e["type"] == "policy_call" and e["role"] == "memory"]
            for _, traj in iter_jsonl(folder / "trajectories.jsonl")}


def without_timing(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k != "latency_s"}


def count_model_loads(monkeypatch) -> list[str]:
    """Every ``load_model`` call from now on (the real loader runs), by model."""
    import memsearch.backends.hf.model as model_module

    calls: list[str] = []
    real = model_module.load_model

    def counted(model="embedded", *args, **kwargs):
        calls.append(str(model))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(model_module, "load_model", counted)
    return calls


def test_grpo_evaluates_the_live_policy_as_memsearch_eval_evaluates_the_checkpoint(
    tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, hotpot_dev_dir, tmp_path, monkeypatch
):
    """Evaluations at steps 0, 1 and 2 load no model (the policy and its merged copy are the only
    two loads of the run); each one's config.json names the checkpoint's adapter, and
    ``memsearch eval`` of that config afterwards (a fresh model, the adapter merged from disk)
    writes the same memory completions and metrics."""
    from memsearch.train.grpo.trainer import train_grpo

    cfg = grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, steps=2, keep_checkpoints=10,
                      **{"eval.data": str(hotpot_dev_dir), "eval.every": 1, "eval.limit": 3, "eval.at_start": True})
    loads = count_model_loads(monkeypatch)
    train_grpo(cfg, tmp_path / "run", echo=lambda _: None)
    assert loads == [str(tiny_model_dir)] * 2  # the policy, the merged sampler: no evaluation copy
    log = {r["step"]: r for _, r in iter_jsonl(tmp_path / "run" / "train_log.jsonl")}
    adapters = {0: tmp_path / "run" / "adapter-step0", 1: tmp_path / "run" / "checkpoints" / "step-000001" / "adapter",
                2: tmp_path / "run" / "checkpoints" / "step-000002" / "adapter"}
    for step, adapter in adapters.items():
        live = tmp_path / "run" / "eval" / f"step-{step:06d}"
        config = json.loads((live / "config.json").read_text())
        assert config["backends"]["memory"]["adapter"] == str(adapter)
        again = run_eval(RunConfig.model_validate(config), hotpot_dev_dir, tmp_path / f"again-{step}",
                         show_progress=False)
        assert memory_completions(live) == memory_completions(tmp_path / f"again-{step}")
        live_summary = json.loads((live / "summary.json").read_text())
        assert without_timing(live_summary["metrics"]) == without_timing(again.metrics)
        assert live_summary["backends"] == again.backends
        assert json.loads((live / "run.json").read_text())["models"] == json.loads(
            (tmp_path / f"again-{step}" / "run.json").read_text())["models"]
        assert log[step]["eval_f1"] == again.metrics["f1"]
    # The step-0 evaluation comes before any rollout has copied the adapter into the merged sampler:
    # it saw the adapter's weights (the base model decodes other completions), not a stale copy.
    base = json.loads((tmp_path / "run" / "eval" / "step-000000" / "config.json").read_text())
    base["backends"]["memory"]["adapter"] = None
    run_eval(RunConfig.model_validate(base), hotpot_dev_dir, tmp_path / "base", show_progress=False)
    assert memory_completions(tmp_path / "base") != memory_completions(tmp_path / "run" / "eval" / "step-000000")


@pytest.mark.slow
def test_sft_evaluation_through_the_live_embedded_policy_equals_memsearch_eval(hotpot_dev_dir, tmp_path, monkeypatch):
    """The embedded model (float32, CPU) with a LoRA adapter: evaluated through the trainer's live
    PEFT policy (unmerged, no load) and by ``memsearch eval`` (a fresh model, the adapter merged),
    the same metrics on 3 tasks of the shipped dev sample."""
    import torch

    from memsearch.train.config import LoraSettings
    from memsearch.train.policy import load_policy, save_adapter
    from memsearch.train.sft.trainer import evaluate_adapter

    policy, tokenizer, _ = load_policy("embedded", None, LoraSettings(r=4, alpha=8), device="cpu", seed=0)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    save_adapter(policy, tmp_path / "adapter")
    eval_config = tmp_path / "eval.toml"
    eval_config.write_text('tokenizer = "embedded"\n[budgets]\nmax_searches = 1\nevidence_tokens = 96\n'
                           'memory_tokens = 64\npolicy_tokens = 24\nanswer_tokens = 16\n'
                           '[backends.reader]\nkind = "rules"\n')
    args = (str(eval_config), "memory", "embedded", tmp_path / "adapter", str(hotpot_dev_dir), 3)
    loads = count_model_loads(monkeypatch)
    live = evaluate_adapter(*args, tmp_path / "live", loaded=(policy, tokenizer))
    assert loads == []
    fresh = evaluate_adapter(*args, tmp_path / "fresh")
    assert loads == ["embedded"]
    assert without_timing(live) == without_timing(fresh)
    assert memory_completions(tmp_path / "live") == memory_completions(tmp_path / "fresh")
    assert json.loads((tmp_path / "live" / "config.json").read_text()) == json.loads(
        (tmp_path / "fresh" / "config.json").read_text())


def test_trained_roles_share_one_backend_on_the_loaded_model(tiny_model_dir):
    """MemAgent's trained roles (memory and reader) get one backend on the loaded model, whatever
    their sampling or schema mode; a role with another backend config keeps its own; a trained
    role that is not ``hf`` is refused."""
    import asyncio

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memsearch.config import load_config
    from memsearch.engine.environment import close_backends
    from memsearch.train.live_eval import live_backends

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    sets = [f"backends.{role}.{k}={json.dumps(v)}" for role in ("memory", "reader")
            for k, v in {"kind": "hf", "model": str(tiny_model_dir), "adapter": "a"}.items()]
    config = load_config(None, [*sets, "backends.memory.schema_mode=true", "backends.reader.sampling.temperature=0.5",
                                "backends.reader.max_concurrency=24"])
    backends = live_backends(config, ["memory", "reader"], model, tokenizer)
    assert set(backends) == {"memory", "reader"} and backends["memory"] is backends["reader"]
    assert backends["memory"].model is model and backends["memory"].max_batch_size == 24
    assert backends["memory"].name == "hf" and backends["memory"].adapter == "a"
    asyncio.run(close_backends(backends))
    base_reader = load_config(None, [s for s in sets if s != 'backends.reader.adapter="a"'])  # the base model
    assert base_reader.backends.reader.kind == "hf" and base_reader.backends.reader.adapter is None
    assert set(live_backends(base_reader, ["memory"], model, tokenizer)) == {"memory"}
    with pytest.raises(ValueError, match="backends.controller.kind is 'rules'"):
        live_backends(config, ["controller"], model, tokenizer)
