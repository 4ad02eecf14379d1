"""Worker for test_distributed.py, started by torchrun: one GRPO update on this rank's share of
a fixed set of rows, then the trainable weights are saved as ``rank{r}-{aggregation}.pt``.

Usage: python -m torch.distributed.run --nproc_per_node N gloo_worker.py MODEL ADAPTER OUT AGG[,AGG...]
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

# (trajectory, prompt length, completion length, advantage); trajectories 0-1 go to rank 0,
# 2-4 to rank 1: the ranks hold different numbers of rows and tokens.
ROWS = [(0, 7, 5, 0.8), (0, 9, 3, 0.8), (1, 4, 6, -0.3), (2, 11, 2, 0.5), (2, 6, 7, 0.5), (3, 5, 4, -1.0),
        (4, 8, 9, 0.2), (4, 3, 1, 0.2)]
RANK_OF_TRAJECTORY = {0: 0, 1: 0, 2: 1, 3: 1, 4: 1}


def make_rows(vocab: int) -> list[Row]:
    gen = torch.Generator().manual_seed(7)
    rows = []
    for traj, p, c, adv in ROWS:
        ids = torch.randint(0, vocab, (p + c,), generator=gen).tolist()
        rows.append(Row(ids[:p], ids[p:], [0.0] * c, [1] * c, traj, traj, "memory", 0, advantage=adv))
    return rows


def main(model_dir: str, adapter: str, out: str, aggregations: str) -> None:
    dist = Dist.from_env()
    for aggregation in aggregations.split(","):
        one_update(dist, model_dir, adapter, out, aggregation)
    dist.close()


def one_update(dist: Dist, model_dir: str, adapter: str, out: str, aggregation: str) -> None:
    cfg = GRPOConfig(data="unused", aggregation=aggregation, kl_coef=0.05, micro_batch_tokens=64,
                     optim=OptimSettings(lr=1e-2, max_grad_norm=None))
    policy, tokenizer, _ = load_policy(model_dir, adapter, cfg.lora, device="cpu")
    optimizer, _ = make_optimizer(policy, cfg.optim, 1)
    rows = make_rows(len(tokenizer))
    if dist.world > 1:
        rows = [r for r in rows if RANK_OF_TRAJECTORY[r.trajectory] == dist.rank]
    stats = update(policy, optimizer, Batch(rows=rows), cfg, dist, tokenizer.eos_token_id)
    assert stats.consumed == len(rows)
    torch.save({"params": [p.detach().clone() for p in trainable_parameters(policy)], "loss": stats.loss,
                "denominator": stats.denominator}, f"{out}/rank{dist.rank}-{aggregation}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:5])
