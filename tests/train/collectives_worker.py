"""Worker for test_distributed.py, started by torchrun: every collective of ``Dist`` on CPU
tensors, in a process group whose device map the test chooses.

Usage: python -m torch.distributed.run --nproc_per_node 2 collectives_worker.py OUT MODE [BACKEND]

MODE ``collectives``: the process group is initialised with BACKEND before ``Dist`` joins it
(``cuda:gloo`` has NCCL's device map, CUDA only, so it reproduces a NCCL run on a CPU machine);
then statistics, barriers and a gradient all-reduce on CPU tensors, results in ``rank{r}.json``.

MODE ``wait:SECONDS``: rank 0 works alone for SECONDS (as it does while it evaluates) while the
other rank waits in ``Dist.wait_for_main``; collective timeout 2 s, ``wait_s`` 8 s. (The default
group is joined first with torch's default timeout, so that a rank that starts late on a busy
machine does not count against the 2 s.)
"""

from __future__ import annotations

import json
import sys
import time

import torch


def main(out: str, mode: str, backend: str = "") -> None:
    import torch.distributed as td

    from memsearch.train.distributed import Dist

    if mode == "collectives":
        td.init_process_group(backend=backend)
        dist = Dist.from_env()
        total = dist.all_sum([1.0 + dist.rank, 0.5])
        most = dist.all_max([float(dist.rank)])
        # The same names in another order on each rank: summed by name, not by position.
        mine = {"a": 10.0 * (dist.rank + 1), "b": 1.0}
        named = dist.all_sum_named(mine if dist.rank == 0 else dict(reversed(list(mine.items()))))
        dist.barrier()
        param = torch.nn.Parameter(torch.zeros(3))
        param.grad = torch.full((3,), float(dist.rank + 1))
        denominator = dist.reduce_gradients([param], local_denominator=2.0 + dist.rank)
        result = {"sum": total, "max": most, "named": list(named.items()), "denominator": denominator,
                  "grad": param.grad.tolist()}
    else:
        seconds = float(mode.split(":")[1])
        td.init_process_group(backend="gloo")
        dist = Dist.from_env(timeout_s=2.0, wait_s=8.0)
        dist.barrier()  # both clocks start together (up to the barrier's own skew)
        t0 = time.perf_counter()
        if dist.main:
            time.sleep(seconds)  # rank 0 alone, e.g. evaluating
        dist.wait_for_main("the test's work on rank 0")
        total = dist.all_sum([1.0])  # right after the wait: no rank is late, the 2 s timeout holds
        result = {"sum": total, "waited_s": time.perf_counter() - t0}
    with open(f"{out}/rank{dist.rank}.json", "w") as f:
        json.dump(result, f)
    dist.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
