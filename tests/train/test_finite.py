"""Trainers stop at the first non-finite loss, gradient norm or weight (``train.finite``), before
the step is saved, and a start that would be refused creates no run folder (issue 26). Real
LoRA SFT and GRPO updates on the tiny Llama. The error is an ``InputError`` (``NonFiniteError``):
the CLI exits 2 with its one line."""

from __future__ import annotations

import json
import re

import pytest
import torch
from typer.testing import CliRunner

from memsearch.errors import InputError
from memsearch.train.sft.trainer import train_sft


def grpo_rows(vocab: int):
    """Two trajectories of seeded random tokens with opposite advantages (something to learn)."""
    from memsearch.train.rows import Row

    gen = torch.Generator().manual_seed(7)
    rows = []
    for traj, adv in ((0, 1.0), (1, -1.0)):
        ids = torch.randint(0, vocab, (10,), generator=gen).tolist()
        rows.append(Row(ids[:6], ids[6:], [0.0] * 4, [1] * 4, traj, 0, "memory", 0, advantage=adv))
    return rows


def finite_checkpoints(out) -> list[str]:
    """Names of the checkpoints whose adapter weights are all finite (every one must be)."""
    from safetensors.torch import load_file

    names = []
    for folder in sorted((out / "checkpoints").glob("step-*")):
        weights = load_file(str(folder / "adapter" / "adapter_model.safetensors"))
        assert all(torch.isfinite(t).all() for t in weights.values()), folder
        names.append(folder.name)
    return names


NON_FINITE = r"the (loss|gradient norm) is (nan|inf), expected a finite number"


def diverged_adapter(tiny_adapter_dir, out):
    """A copy of the tiny adapter with every lora_B weight at 1e20: finite (the start check passes,
    as it would for an adapter a diverged run wrote), but the forward pass overflows to inf / NaN."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_adapter_dir, out)
    weights = load_file(str(out / "adapter_model.safetensors"))
    save_file({k: torch.full_like(v, 1e20) if "lora_B" in k else v for k, v in weights.items()},
              str(out / "adapter_model.safetensors"))
    return out


def test_a_diverged_start_adapter_stops_sft_at_the_first_non_finite_step(
    tiny_model_dir, tiny_adapter_dir, short_sft_rows, short_sft_config, tmp_path
):
    """The overflow shows as a NaN loss or a NaN gradient norm (the loss can stay finite). Before,
    SFT trained on with NaN for every step and wrote an all-NaN adapter (exit 0). (lr = 1e30 drove
    this test before lr got its upper bound at load.)"""
    adapter = diverged_adapter(tiny_adapter_dir, tmp_path / "diverged")
    out = tmp_path / "run"
    with pytest.raises(InputError, match=rf"^step 1: {NON_FINITE}") as exc:
        train_sft(short_sft_config(tiny_model_dir, short_sft_rows, checkpoint_every=1, adapter=str(adapter)), out,
                  echo=lambda m: None)
    assert "\n" not in str(exc.value)
    assert finite_checkpoints(out) == []  # step 1 was neither applied nor saved
    assert not (out / "adapter").exists() and not (out / "summary.json").exists()


def test_the_cli_exits_2_with_one_line_naming_the_step(tiny_model_dir, tiny_adapter_dir, short_sft_rows, tmp_path):
    from memsearch.cli.app import app

    adapter = diverged_adapter(tiny_adapter_dir, tmp_path / "diverged")
    (tmp_path / "sft.toml").write_text("")
    sets = [f"model={json.dumps(str(tiny_model_dir))}", f"data=[{json.dumps(str(short_sft_rows))}]", "epochs=1.0",
            "micro_batch_rows=2", "grad_accumulation=1", "lora.r=4", f"adapter={json.dumps(str(adapter))}"]
    result = CliRunner().invoke(app, ["train", "sft", "--config", str(tmp_path / "sft.toml"), "--out",
                                      str(tmp_path / "run"), *[a for s in sets for a in ("--set", s)]])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(rf"step 1: {NON_FINITE}", errors[0]), result.output


def test_grpo_update_stops_at_a_non_finite_weight(tiny_model_dir, tiny_adapter_dir):
    """Finite loss and gradients, but AdamW state holding a NaN (as an unverified checkpoint of an
    older memsearch could carry): the step writes a NaN weight, and training stops right there."""
    from memsearch.train.config import GRPOConfig, LoraSettings
    from memsearch.train.distributed import Dist
    from memsearch.train.grpo.batch import Batch
    from memsearch.train.grpo.trainer import update
    from memsearch.train.policy import load_policy, make_optimizer, trainable_parameters

    cfg = GRPOConfig(data="unused", micro_batch_tokens=64,
                     lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    policy, tokenizer, _ = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), cfg.lora, device="cpu")
    optimizer, _ = make_optimizer(policy, cfg.optim, 2)
    batch = Batch(rows=grpo_rows(len(tokenizer)))
    update(policy, optimizer, batch, cfg, Dist(), tokenizer.eos_token_id, step=1)
    optimizer.state[trainable_parameters(policy)[0]]["exp_avg"][0, 0] = float("nan")
    with pytest.raises(InputError, match=r"^step 2: weight .*lora_.* is not finite after the optimizer step"):
        update(policy, optimizer, batch, cfg, Dist(), tokenizer.eos_token_id, step=2)


def test_grpo_update_stops_at_a_non_finite_gradient_before_the_optimizer_step(tiny_model_dir, tiny_adapter_dir):
    """NaN weights (as a damaged start would hold) give a NaN gradient norm: no step is taken."""
    from memsearch.train.config import GRPOConfig, LoraSettings
    from memsearch.train.distributed import Dist
    from memsearch.train.grpo.batch import Batch
    from memsearch.train.grpo.trainer import update
    from memsearch.train.policy import load_policy, make_optimizer, trainable_parameters

    cfg = GRPOConfig(data="unused", micro_batch_tokens=64,
                     lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    policy, tokenizer, _ = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), cfg.lora, device="cpu")
    with torch.no_grad():
        trainable_parameters(policy)[0][0, 0] = float("nan")
    optimizer, _ = make_optimizer(policy, cfg.optim, 1)
    with pytest.raises(InputError, match=r"^step 4: the gradient norm \(epoch 1, mini-batch 1\) is nan"):
        update(policy, optimizer, Batch(rows=grpo_rows(len(tokenizer))), cfg, Dist(), tokenizer.eos_token_id, step=4)
    assert not optimizer.state  # AdamW never stepped


@pytest.mark.parametrize("targets, problem", [
    (["q_proj", "qkv_proj"], r"qkv_proj not in model .*"),  # no such module
    (["mlp", "q_proj"], r"mlp \(LlamaMLP\) not a layer LoRA can wrap .*"),  # a whole block, not a layer
])
@pytest.mark.parametrize("trainer", ["sft", "grpo"])
def test_bad_target_modules_are_refused_before_the_run_folder_exists(
    trainer, targets, problem, tiny_model_dir, short_sft_rows, short_sft_config, hotpot_train_dir, tmp_path
):
    """PEFT failed on them after config.json was written, and the corrected command then met
    "output folder already exists"."""
    from memsearch.config import load_config
    from memsearch.train.config import GRPOConfig
    from memsearch.train.grpo.trainer import train_grpo

    out = tmp_path / "run"
    if trainer == "sft":
        cfg = short_sft_config(tiny_model_dir, short_sft_rows, **{"lora.target_modules": targets})
        run = train_sft
    else:
        sets = [f"model={json.dumps(str(tiny_model_dir))}", f"data={json.dumps(str(hotpot_train_dir))}",
                f"lora.target_modules={json.dumps(targets)}", 'episode.tokenizer="embedded"']
        cfg = load_config(None, sets, model=GRPOConfig)
        run = train_grpo
    with pytest.raises(InputError, match=rf"^lora.target_modules: {problem}; expected module names of it, e.g. its "
                                         r"linear layers .*q_proj") as exc:
        run(cfg, out, echo=lambda m: None)
    assert "\n" not in str(exc.value)
    assert not out.exists()


def test_a_starting_adapter_with_non_finite_weights_is_refused_before_the_run_folder_exists(
    tiny_model_dir, tiny_adapter_dir, short_sft_rows, short_sft_config, tmp_path
):
    """A diverged or damaged adapter given as ``adapter`` (an SFT result for GRPO): before, SFT
    trained on with NaN loss and GRPO with every rollout failing, both to a NaN adapter (exit 0)."""
    import shutil

    from safetensors.torch import load_file, save_file

    adapter = tmp_path / "nan-adapter"
    shutil.copytree(tiny_adapter_dir, adapter)
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    name = sorted(k for k in weights if "lora_B" in k)[0]
    weights[name][0, 0] = float("nan")
    save_file(weights, str(adapter / "adapter_model.safetensors"))
    out = tmp_path / "run"
    with pytest.raises(InputError, match=r"adapter_model.safetensors: weight .*lora_B.* is not finite") as exc:
        train_sft(short_sft_config(tiny_model_dir, short_sft_rows, adapter=str(adapter)), out, echo=lambda m: None)
    assert str(adapter) in str(exc.value) and "\n" not in str(exc.value)
    assert not out.exists()
