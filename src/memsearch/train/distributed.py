"""One process per device (``torchrun``), gradients averaged explicitly.

``Dist.from_env()`` joins the process group torchrun describes (``WORLD_SIZE`` > 1):
``cpu:gloo,cuda:nccl`` on GPUs (each rank bound to ``cuda:LOCAL_RANK`` before its first
collective), gloo on CPUs (how the tests run it). A single process is a world of one and every
collective is a no-op.

NCCL serves CUDA tensors only ("No backend type associated with device type cpu", docs/design.md
§7), so the statistics (``all_sum`` / ``all_max``, Python floats) and the barriers run on a gloo
group of their own over all ranks, whatever group torchrun's caller initialised; gradients are
reduced on the default group, on the device they live on (a CUDA-only group given CPU gradients,
e.g. ``device = "cpu"`` on a GPU machine, falls back to the gloo group).

Waiting is bounded twice: ``timeout_s`` bounds every collective (a rank that waits longer for
the others, e.g. for the slowest rank's rollouts, fails instead of hanging; NCCL's own default
is 10 min); ``wait_s`` bounds ``wait_for_main``, where the other ranks wait explicitly while
rank 0 works alone (periodic evaluation), instead of waiting inside the next gradient
all-reduce under ``timeout_s``.

Each rank rolls out its own tasks and builds its own rows, so ranks hold different numbers of
rows and tokens. The loss is written as ``sum(w_t * loss_t) / D`` (``train.grpo.loss``): each rank
backpropagates its local sum, then ``reduce_gradients`` all-reduces the gradient sums and the
denominators and divides. The update equals one process training on the union of the rows.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

DEFAULT_TIMEOUT_S = 1800.0
DEFAULT_WAIT_S = 3600.0


@dataclass
class Dist:
    """This process's place in the world and the groups its collectives use."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    wait_s: float = DEFAULT_WAIT_S
    cpu_group: Any = None  # gloo over all ranks, timeout_s: statistics and barriers
    wait_group: Any = None  # gloo over all ranks, timeout wait_s: wait_for_main

    @classmethod
    def from_env(cls, timeout_s: float = DEFAULT_TIMEOUT_S, wait_s: float = DEFAULT_WAIT_S) -> Dist:
        """Join (or initialise) torchrun's process group; ``timeout_s`` bounds each collective,
        ``wait_s`` the explicit wait for rank 0 (``wait_for_main``)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls(wait_s=wait_s)
        import torch.distributed as td

        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            # before the first collective: NCCL otherwise guesses the device (rank 1 on cuda:0)
            torch.cuda.set_device(local_rank)
        if not td.is_initialized():
            backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
            td.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
        return cls(rank=td.get_rank(), world=td.get_world_size(), local_rank=local_rank, wait_s=wait_s,
                   cpu_group=td.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s)),
                   wait_group=td.new_group(backend="gloo", timeout=timedelta(seconds=wait_s)))

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

    def all_sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (float64, on the CPU gloo group)."""
        if self.world == 1:
            return [float(v) for v in values]
        import torch.distributed as td

        t = torch.tensor(values, dtype=torch.float64)
        td.all_reduce(t, group=self.cpu_group)
        return t.tolist()

    def all_sum_named(self, values: Mapping[str, float]) -> dict[str, float]:
        """``all_sum`` of named statistics (every rank passes the same names). The values travel
        in sorted-name order, so ranks that built their mappings in different orders still add
        like to like; the result keeps ``values``' order."""
        names = sorted(values)
        total = dict(zip(names, self.all_sum([values[name] for name in names]), strict=True))
        return {name: total[name] for name in values}

    def all_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over ranks (float64, on the CPU gloo group)."""
        if self.world == 1:
            return [float(v) for v in values]
        import torch.distributed as td

        t = torch.tensor(values, dtype=torch.float64)
        td.all_reduce(t, op=td.ReduceOp.MAX, group=self.cpu_group)
        return t.tolist()

    def _group_for(self, tensor: torch.Tensor):
        """The default group if it serves ``tensor``'s device type, else the CPU gloo group."""
        import torch.distributed as td

        served = getattr(td.distributed_c10d._get_default_group(), "_device_types", None)
        if served is None or any(d.type == tensor.device.type for d in served):
            return None
        if tensor.device.type != "cpu":
            raise RuntimeError(f"the process group serves {served}, not {tensor.device}")
        return self.cpu_group

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

            group = self._group_for(flat)
            td.all_reduce(flat, group=group)
            td.all_reduce(denom, group=group)
        total = float(denom)
        flat = flat / total if total > 0 else torch.zeros_like(flat)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n
        return total

    def barrier(self) -> None:
        """All ranks meet (on the CPU gloo group, within ``timeout_s``)."""
        if self.world > 1:
            import torch.distributed as td

            td.barrier(group=self.cpu_group)

    def wait_for_main(self, what: str) -> None:
        """All ranks call this after work only rank 0 does (``what``, e.g. an evaluation): the
        others wait here at most ``wait_s`` seconds, then fail saying so, instead of waiting
        inside the next collective (bounded by ``timeout_s``; under NCCL its watchdog would
        abort the job with a bare timeout)."""
        if self.world == 1:
            return
        import torch.distributed as td

        try:
            td.barrier(group=self.wait_group)
        except RuntimeError as exc:
            raise RuntimeError(f"rank {self.rank} waited more than {self.wait_s:g} s for rank 0 ({what}); "
                               f"raise eval.wait_s or evaluate fewer tasks (eval.limit): {exc}") from exc

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as td

            if td.is_initialized():
                td.destroy_process_group()
