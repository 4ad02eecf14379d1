"""The update-direction diagnostic (``studies.memory_policy.batch_fit``, module and command) on a real
3-step GRPO run of the tiny model: it rebuilds exactly the rows the trainer trained on, and a
working update raises the surrogate on them."""

from __future__ import annotations

import json

import pytest
from tests.train.grpo.test_grpo import grpo_config

from memsearch.errors import InputError
from memsearch.train.grpo.trainer import train_grpo


@pytest.fixture(scope="module")
def one_step_run(tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fit")
    cfg = grpo_config(tmp, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, steps=3, schema_mode=True,
                      credit="state", state_group_size=4, share_prompts=True, kl_reference="start",
                      invalid_decision_credit="over_budget", global_weight=0.5,
                      **{"episode.budgets.policy_tokens": 40})
    train_grpo(cfg, tmp / "run", echo=lambda m: None)
    return cfg, tmp / "run"


@pytest.mark.slow
def test_replayed_rows_are_the_trained_rows_and_the_update_follows_their_advantages(one_step_run):
    from studies.memory_policy.batch_fit import fit_batch, replay_step

    from memsearch.data.dataset import load_dataset
    from memsearch.train.grpo.trainer import schema_mask_fn
    from memsearch.train.policy import load_policy, make_optimizer

    cfg, run = one_step_run
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    # a step with an advantage to follow (the random model's rewards are often all equal)
    logged = next(r for r in log if r["zero_variance_groups"] < r["groups"])
    step = logged["step"]
    # the policy that sampled that step: the start adapter for step 1, else the previous checkpoint
    adapter = cfg.adapter if step == 1 else str(run / "checkpoints" / f"step-{step - 1:06d}" / "adapter")
    policy, tokenizer, _ = load_policy(cfg.model, adapter, cfg.lora, "cpu", cfg.dtype, cfg.seed, keep_reference=True)
    batch = replay_step(run, step, cfg, tokenizer, load_dataset(cfg.data).labels_by_id())
    assert len(batch.rows) == logged["rows_consumed"] > 0
    assert batch.masked_decision_tokens == logged["masked_decision_tokens"]
    assert sum(sum(r.loss_mask) for r in batch.rows) == logged["completion_tokens"]  # tokens in the loss
    assert any(r.advantage > 0 for r in batch.rows) and any(r.advantage < 0 for r in batch.rows)

    optimizer, _ = make_optimizer(policy, cfg.optim, cfg.steps)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    points = fit_batch(policy, optimizer, batch, cfg, pad, schema_mask_fn(tokenizer), updates=2)
    assert [p.update for p in points] == [1, 2]
    first = points[0]
    assert first.surrogate > 0 and first.corr > 0  # rows move the way their advantages say
    assert first.row_pos > first.row_neg
    assert points[0].kl == 0.0 < points[1].kl  # the first pass is at the start; then the policy has moved


def test_a_run_without_saved_rollouts_is_named(tmp_path):
    from studies.memory_policy.batch_fit import replay_step

    with pytest.raises(InputError, match=r"step-000003\.rank0\.jsonl: no saved rollouts for step 3"):
        replay_step(tmp_path, 3, None, None, {})
