"""The GRPO update (``grpo.update``) on the tiny real Llama with fixed rows: the first pass is
on-policy (ratio 1) with LoRA dropout, the learning rate follows the schedule per optimizer step,
the KL reference of a run started from an adapter is that adapter, and mini-batches take one
optimizer step each (docs/design.md §7)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from memsearch.train.config import GRPOConfig, LoraSettings, OptimSettings
from memsearch.train.distributed import Dist
from memsearch.train.grpo.batch import Batch
from memsearch.train.grpo.loss import split_mini_batches
from memsearch.train.grpo.trainer import update
from memsearch.train.policy import REFERENCE_ADAPTER, load_policy, lr_factor, make_optimizer, trainable_parameters
from memsearch.train.rows import Row

TARGETS = ["q_proj", "v_proj"]
# (trajectory, prompt length, completion length, advantage): 4 trajectories, 6 rows
SHAPES = [(0, 7, 5, 0.8), (0, 9, 3, 0.8), (1, 4, 6, -0.3), (2, 11, 2, 0.5), (2, 6, 7, 0.5), (3, 5, 4, -1.0)]


def make_rows(vocab: int) -> list[Row]:
    gen = torch.Generator().manual_seed(7)
    rows = []
    for traj, p, c, adv in SHAPES:
        ids = torch.randint(0, vocab, (p + c,), generator=gen).tolist()
        rows.append(Row(ids[:p], ids[p:], [0.0] * c, [1] * c, traj, traj, "memory", 0, advantage=adv))
    return rows


def config(**extra) -> GRPOConfig:
    fields = {"data": "unused", "micro_batch_tokens": 64, "lora": LoraSettings(r=4, alpha=8, target_modules=TARGETS),
              "optim": OptimSettings(lr=1e-2, max_grad_norm=None)}
    return GRPOConfig(**{**fields, **extra})


def test_first_pass_is_on_policy_with_lora_dropout(tiny_model_dir, nonzero_lora):
    """Old and reference log-probs are taken without dropout and the update trains without it
    (``disable_dropout``): before any optimizer step the ratio is exactly 1, nothing is clipped."""
    cfg = config(epochs=2, kl_coef=0.1, lora=LoraSettings(r=4, alpha=8, dropout=0.5, target_modules=TARGETS))
    policy, tokenizer = nonzero_lora(tiny_model_dir, seed=3, dropout=0.5)
    optimizer, _ = make_optimizer(policy, cfg.optim, 2)
    stats = update(policy, optimizer, Batch(rows=make_rows(len(tokenizer))), cfg, Dist(), tokenizer.eos_token_id)
    assert stats.tokens == 27
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-6)
    assert stats.clip_fraction == 0.0
    assert stats.logprob_mismatch > 0  # the rows' rollout log-probs are placeholders (0.0): the check is live
    assert not policy.training  # rollouts after the update sample without dropout


def test_learning_rate_follows_the_schedule_per_optimizer_step(tiny_model_dir, tiny_adapter_dir):
    """N rollout steps with E epochs and M mini-batches are N*E*M optimizer steps: the scheduler
    (sized for them) is stepped after each one, so warm-up and decay end where they should."""
    steps, epochs, minis = 3, 2, 2
    optim = OptimSettings(lr=1e-2, warmup_steps=3, schedule="linear", max_grad_norm=None)
    cfg = config(epochs=epochs, mini_batches_per_step=minis, optim=optim)
    policy, tokenizer, _ = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), cfg.lora, device="cpu")
    total = steps * epochs * minis
    optimizer, scheduler = make_optimizer(policy, optim, total)
    rows = make_rows(len(tokenizer))
    seen = []
    for n in range(1, steps + 1):
        update(policy, optimizer, Batch(rows=rows), cfg, Dist(), tokenizer.eos_token_id, scheduler=scheduler)
        seen.append(optimizer.param_groups[0]["lr"])
        assert scheduler.last_epoch == n * epochs * minis
    assert seen == pytest.approx([1e-2 * lr_factor(n * epochs * minis, total, optim) for n in (1, 2, 3)])
    assert seen[-1] == 0.0  # linear decay reaches 0 at the last optimizer step
    assert optimizer.state[trainable_parameters(policy)[0]]["step"] == total


def test_kl_reference_is_the_starting_adapter(tiny_model_dir, tiny_adapter_dir, tmp_path):
    """GRPO started from an (SFT) adapter keeps a frozen copy of it as the KL reference: at the
    first pass KL is 0; the copy is never trained, never in the optimizer, never saved."""
    cfg = config(kl_coef=0.5)
    policy, tokenizer, note = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), cfg.lora, device="cpu",
                                          keep_reference=True)
    assert "KL reference" in note
    trainable = trainable_parameters(policy)
    assert trainable and all(REFERENCE_ADAPTER not in n for n, p in policy.named_parameters() if p.requires_grad)
    assert len(trainable) == sum(1 for n, _ in policy.named_parameters() if ".default." in n)
    reference = {n: p.detach().clone() for n, p in policy.named_parameters() if f".{REFERENCE_ADAPTER}." in n}
    assert reference
    optimizer, _ = make_optimizer(policy, cfg.optim, 2)
    rows = make_rows(len(tokenizer))
    first = update(policy, optimizer, Batch(rows=rows), cfg, Dist(), tokenizer.eos_token_id)
    assert first.kl == pytest.approx(0.0, abs=1e-9)  # against the base (adapter disabled) it is > 0.01
    second = update(policy, optimizer, Batch(rows=rows), cfg, Dist(), tokenizer.eos_token_id)
    assert second.kl > 0  # the policy moved away from its frozen reference
    for n, p in policy.named_parameters():
        if n in reference:
            assert torch.equal(p, reference[n]), n
    assert policy.active_adapter == "default"
    # checkpoints, the final adapter and merges hold the trained adapter only, loadable alone
    from safetensors.torch import load_file

    from memsearch.train.policy import save_adapter

    save_adapter(policy, tmp_path / "adapter")
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == ["README.md", "adapter_config.json",
                                                                     "adapter_model.safetensors"]
    saved = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert len(saved) == len(trainable) and not any(REFERENCE_ADAPTER in k for k in saved)


def test_kl_reference_without_adapter_is_the_base(tiny_model_dir, nonzero_lora):
    cfg = config(kl_coef=0.5)
    policy, tokenizer = nonzero_lora(tiny_model_dir, seed=3)  # non-zero B: the policy differs from the base
    optimizer, _ = make_optimizer(policy, cfg.optim, 1)
    stats = update(policy, optimizer, Batch(rows=make_rows(len(tokenizer))), cfg, Dist(), tokenizer.eos_token_id)
    assert stats.kl > 1e-3


def test_kl_to_the_base_when_started_from_an_adapter_is_not_zero(tiny_model_dir, tiny_adapter_dir):
    """The figure the reference fixes: the starting adapter against the base is far from KL 0."""
    cfg = config(kl_coef=0.5)
    policy, tokenizer, _ = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), cfg.lora, device="cpu")
    optimizer, _ = make_optimizer(policy, cfg.optim, 1)
    stats = update(policy, optimizer, Batch(rows=make_rows(len(tokenizer))), cfg, Dist(), tokenizer.eos_token_id)
    assert stats.kl > 1e-3


def test_mini_batches_split_whole_trajectories_in_order():
    rows = [Row([1], [2], [0.0], [1], t, 0, "memory", 0) for t in (0, 0, 1, 2, 2, 3, 4)]
    assert split_mini_batches(rows, 1) == [[0, 1, 2, 3, 4, 5, 6]]
    assert split_mini_batches(rows, 2) == [[0, 1, 2, 3, 4], [5, 6]]  # trajectories 0-2, then 3-4
    assert split_mini_batches(rows, 5) == [[0, 1], [2], [3, 4], [5], [6]]
    assert split_mini_batches(rows, 7) == [[0, 1], [2], [3, 4], [5], [6], [], []]  # every rank joins every step
    assert split_mini_batches([], 3) == [[], [], []]


def test_mini_batches_take_one_optimizer_step_each_and_the_clip_acts(tiny_model_dir, tiny_adapter_dir):
    """Old log-probs are taken once before the first step, so later mini-batches see a ratio
    that departs from 1 and the clip acts; the first mini-batch is still on-policy."""
    cfg = config(mini_batches_per_step=4, optim=OptimSettings(lr=5e-2, max_grad_norm=None))
    policy, tokenizer, _ = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), cfg.lora, device="cpu")
    optimizer, _ = make_optimizer(policy, cfg.optim, 4)
    stats = update(policy, optimizer, Batch(rows=make_rows(len(tokenizer))), cfg, Dist(), tokenizer.eos_token_id)
    assert optimizer.state[trainable_parameters(policy)[0]]["step"] == 4
    assert stats.consumed == 6 and stats.tokens == 27
    assert abs(stats.ratio_mean - 1.0) > 1e-3
    assert stats.clip_fraction > 0
    assert stats.denominator == 4  # trajectory aggregation: one per trajectory, summed over the mini-batches

    one = config()  # mini_batches_per_step = 1: today's single full-batch step, ratio exactly 1
    policy, tokenizer, _ = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), one.lora, device="cpu")
    optimizer, _ = make_optimizer(policy, one.optim, 1)
    stats = update(policy, optimizer, Batch(rows=make_rows(len(tokenizer))), one, Dist(), tokenizer.eos_token_id)
    assert optimizer.state[trainable_parameters(policy)[0]]["step"] == 1
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-7) and stats.clip_fraction == 0.0


def test_a_step_whose_advantages_are_all_zero_changes_no_weight_and_no_optimizer_state(tiny_model_dir,
                                                                                        tiny_adapter_dir):
    """After a step with signal, AdamW has momentum and weight decay: a step on rows whose
    advantages are all 0 would still move every weight. It is skipped (the schedule still
    counts it, so ``--resume`` stays exact) and the log says so."""
    optim = OptimSettings(lr=1e-2, weight_decay=0.1, max_grad_norm=None)
    cfg = config(optim=optim, mini_batches_per_step=2, kl_coef=0.1)
    policy, tokenizer, _ = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), cfg.lora, device="cpu",
                                       keep_reference=True)
    optimizer, scheduler = make_optimizer(policy, optim, 3 * 2)
    rows = make_rows(len(tokenizer))
    first = update(policy, optimizer, Batch(rows=rows), cfg, Dist(), tokenizer.eos_token_id, scheduler=scheduler)
    assert first.skipped_steps == 0 and first.grad_norm > 0
    params = trainable_parameters(policy)
    weights = [p.detach().clone() for p in params]
    state = {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in optimizer.state[p].items()}
             for i, p in enumerate(params)}
    rows = [replace(r, advantage=0.0) for r in rows]
    stats = update(policy, optimizer, Batch(rows=rows), cfg, Dist(), tokenizer.eos_token_id, scheduler=scheduler)
    assert stats.skipped_steps == 2 and stats.grad_norm == 0.0
    assert all(torch.equal(p.detach(), w) for p, w in zip(params, weights, strict=True))
    for i, p in enumerate(params):
        assert all(torch.equal(optimizer.state[p][k], v) if torch.is_tensor(v) else optimizer.state[p][k] == v
                   for k, v in state[i].items())
    assert scheduler.last_epoch == 4  # the schedule counted both skipped steps
    # One mini-batch with signal and one without: only the one without is skipped.
    rows = [replace(r, advantage=0.5 if r.trajectory == 0 else 0.0) for r in rows]
    mixed = update(policy, optimizer, Batch(rows=rows), cfg, Dist(), tokenizer.eos_token_id, scheduler=scheduler)
    assert mixed.skipped_steps == 1 and not all(torch.equal(p.detach(), w) for p, w in zip(params, weights,
                                                                                             strict=True))
