"""One process per device (``torchrun``), gradients averaged explicitly.

``Dist.from_env()`` joins the process group torchrun describes (``WORLD_SIZE`` > 1): NCCL on
GPUs, gloo on CPUs (how the tests run it). A single process is a world of one and every
collective is a no-op.

Each rank rolls out its own tasks and builds its own rows, so ranks hold different numbers of
rows and tokens. The loss is written as ``sum(w_t * loss_t) / D`` (``train.loss``): each rank
backpropagates its local sum, then ``reduce_gradients`` all-reduces the gradient sums and the
denominators and divides. The update equals one process training on the union of the rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Dist:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        import torch.distributed as td

        if not td.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            td.init_process_group(backend=backend)
        return cls(rank=td.get_rank(), world=td.get_world_size(), local_rank=int(os.environ.get("LOCAL_RANK", "0")))

    @property
    def main(self) -> bool:
        return self.rank == 0

    def device(self, preference: str) -> str:
        """``auto`` -> this rank's GPU if there is one, else the CPU."""
        if preference == "auto":
            return f"cuda:{self.local_rank}" if torch.cuda.is_available() else "cpu"
        if preference == "cuda" and self.world > 1:
            return f"cuda:{self.local_rank}"
        return preference

    def all_sum(self, values: list[float], device: str | torch.device = "cpu") -> list[float]:
        """Element-wise sum over ranks (float64)."""
        if self.world == 1:
            return [float(v) for v in values]
        import torch.distributed as td

        t = torch.tensor(values, dtype=torch.float64, device=device)
        td.all_reduce(t)
        return t.tolist()

    def all_max(self, values: list[float], device: str | torch.device = "cpu") -> list[float]:
        if self.world == 1:
            return [float(v) for v in values]
        import torch.distributed as td

        t = torch.tensor(values, dtype=torch.float64, device=device)
        td.all_reduce(t, op=td.ReduceOp.MAX)
        return t.tolist()

    def reduce_gradients(self, params: list[torch.nn.Parameter], local_denominator: float) -> float:
        """Sum gradients and denominators over ranks, divide; return the global denominator.

        Every rank must call this the same number of times (once per optimizer step), whatever
        its number of rows. With a zero global denominator the gradients are zeroed.
        """
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        denom = torch.tensor([local_denominator], dtype=flat.dtype, device=flat.device)
        if self.world > 1:
            import torch.distributed as td

            td.all_reduce(flat)
            td.all_reduce(denom)
        total = float(denom)
        flat = flat / total if total > 0 else torch.zeros_like(flat)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n
        return total

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as td

            td.barrier()

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as td

            if td.is_initialized():
                td.destroy_process_group()
