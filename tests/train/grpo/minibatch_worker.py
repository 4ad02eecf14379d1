"""Worker for test_minibatch_ranks.py, started by torchrun: one GRPO update with mini-batches and
two epochs on this rank's share of fixed rows, KL to a frozen copy of the starting adapter; saves
the trainable weights and what the optimizer and scheduler counted as ``rank{r}.pt``.

Usage: python -m torch.distributed.run --nproc_per_node N minibatch_worker.py MODEL ADAPTER OUT
(N = 1 trains on every row in one process: the reference the N = 2 run must equal.)
"""

from __future__ import annotations

import sys

import torch

from memsearch.train.config import GRPOConfig, OptimSettings
from memsearch.train.distributed import Dist
from memsearch.train.grpo.batch import Batch
from memsearch.train.grpo.trainer import update
from memsearch.train.policy import load_policy, make_optimizer, trainable_parameters
from memsearch.train.rows import Row

# (trajectory, prompt length, completion length, advantage). Rank 0 holds trajectory 0 only, so
# its second mini-batch is empty; rank 1 holds 1-4. Split in order into 2 mini-batches, the
# ranks' parts are {0} + {1, 2} and {} + {3, 4}: the same unions as one process dealing the five
# trajectories into {0, 1, 2} and {3, 4}.
ROWS = [(0, 7, 5, 0.8), (0, 9, 3, 0.8), (1, 4, 6, -0.3), (2, 11, 2, 0.5), (2, 6, 7, 0.5), (3, 5, 4, -1.0),
        (4, 8, 9, 0.2), (4, 3, 1, 0.2)]
RANK_OF_TRAJECTORY = {0: 0, 1: 1, 2: 1, 3: 1, 4: 1}
MINI_BATCHES, EPOCHS = 2, 2


def main(model_dir: str, adapter: str, out: str) -> None:
    dist = Dist.from_env()
    cfg = GRPOConfig(data="unused", aggregation="trajectory", kl_coef=0.05, micro_batch_tokens=64, epochs=EPOCHS,
                     mini_batches_per_step=MINI_BATCHES, optim=OptimSettings(lr=1e-2, max_grad_norm=None))
    policy, tokenizer, _ = load_policy(model_dir, adapter, cfg.lora, device="cpu", keep_reference=True)
    optimizer, scheduler = make_optimizer(policy, cfg.optim, EPOCHS * MINI_BATCHES)
    gen = torch.Generator().manual_seed(7)
    rows = []
    for traj, p, c, adv in ROWS:
        ids = torch.randint(0, len(tokenizer), (p + c,), generator=gen).tolist()
        rows.append(Row(ids[:p], ids[p:], [0.0] * c, [1] * c, traj, traj, "memory", 0, advantage=adv))
    if dist.world > 1:
        rows = [r for r in rows if RANK_OF_TRAJECTORY[r.trajectory] == dist.rank]
    stats = update(policy, optimizer, Batch(rows=rows), cfg, dist, tokenizer.eos_token_id, scheduler=scheduler)
    params = trainable_parameters(policy)
    torch.save({"params": [p.detach().clone() for p in params], "denominator": stats.denominator,
                "adam_steps": int(optimizer.state[params[0]]["step"]), "scheduler_steps": scheduler.last_epoch,
                "ratio_mean": stats.ratio_mean}, f"{out}/rank{dist.rank}.pt")
    dist.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
