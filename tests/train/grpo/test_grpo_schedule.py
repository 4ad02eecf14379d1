"""GRPO end to end with several optimizer steps per rollout batch (epochs x mini-batches): the
learning rate logged at each step follows the schedule counted in optimizer steps, and a resumed
run equals an uninterrupted one (docs/design.md §7)."""

from __future__ import annotations

import json

import pytest
import torch

from memsearch.config import load_config
from memsearch.train.config import GRPOConfig
from memsearch.train.grpo.trainer import train_grpo
from memsearch.train.policy import lr_factor

CONFIG = """
role = "memory"
schema_mode = true  # with room for a whole op, rollouts differ in validity: groups have a reward spread
steps = 3
tasks_per_step = 2
group_size = 4
epochs = 2
mini_batches_per_step = 2
checkpoint_every = 1
keep_checkpoints = 4
kl_coef = 0.1
kl_reference = "base"
[lora]
r = 4
alpha = 8.0
target_modules = ["q_proj", "v_proj"]
[optim]
lr = 0.01
warmup_steps = 3
schedule = "linear"
[episode]
tokenizer = "embedded"
[episode.budgets]
evidence_tokens = 64
passages_per_search = 1
max_searches = 2
memory_tokens = 64
policy_tokens = 40
answer_tokens = 8
[episode.backends.reader]
kind = "rules"
"""


class Crash(Exception):
    pass


@pytest.mark.slow
def test_lr_per_optimizer_step_and_exact_resume(tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, tmp_path):
    path = tmp_path / "grpo.toml"
    path.write_text(CONFIG)
    sets = [f"model={json.dumps(str(tiny_model_dir))}", f"adapter={json.dumps(str(tiny_adapter_dir))}",
            f"data={json.dumps(str(hotpot_train_dir))}"]
    cfg = load_config(path, sets, model=GRPOConfig)
    train_grpo(cfg, tmp_path / "straight", echo=lambda m: None)

    def crash(message: str) -> None:
        if message.startswith("step 1/"):
            raise Crash(message)

    with pytest.raises(Crash):
        train_grpo(cfg, tmp_path / "crashed", echo=crash)
    train_grpo(cfg, tmp_path / "crashed", resume=True, echo=lambda m: None)

    per_step = cfg.update.epochs * cfg.update.mini_batches_per_step
    total = cfg.steps * per_step
    logs = [[json.loads(line) for line in (tmp_path / run / "train_log.jsonl").read_text().splitlines()]
            for run in ("straight", "crashed")]
    # the lr in effect when step s starts: (s - 1) * 4 optimizer steps done (a schedule stepped
    # once per rollout step would give 1/3, 2/3, 1 of the peak here)
    assert [r["lr"] for r in logs[0]] == pytest.approx([0.01 * lr_factor((s - 1) * per_step, total, cfg.optim)
                                                        for s in (1, 2, 3)])
    assert [r["lr"] for r in logs[0]] == pytest.approx([0.01 / 3, 0.01 * 8 / 9, 0.01 * 4 / 9])
    # logprob_mismatch is float round-off (~1e-6) of a decode whose batches depend on timing: bounded, not equal
    timing = {"rollout_s", "step_s", "logprob_mismatch", "logprob_mismatch_mean"}
    assert all(r["logprob_mismatch"] < 1e-4 for log in logs for r in log)
    assert [{k: v for k, v in r.items() if k not in timing} for r in logs[0]] == \
           [{k: v for k, v in r.items() if k not in timing} for r in logs[1]]
    for step in (1, 2, 3):
        a = torch.load(tmp_path / "straight" / "checkpoints" / f"step-{step:06d}" / "trainer.pt", weights_only=False)
        assert a["scheduler"]["last_epoch"] == step * per_step
    from safetensors.torch import load_file

    w1 = load_file(str(tmp_path / "straight" / "checkpoints" / "step-000003" / "adapter" / "adapter_model.safetensors"))
    w2 = load_file(str(tmp_path / "crashed" / "checkpoints" / "step-000003" / "adapter" / "adapter_model.safetensors"))
    init = load_file(str(tiny_adapter_dir / "adapter_model.safetensors"))
    assert all(torch.equal(w1[k], w2[k]) for k in w1) and any(not torch.equal(init[k], w1[k]) for k in w1)
