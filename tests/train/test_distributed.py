"""Two gloo processes (torchrun) that hold different numbers of rows make exactly the update one
process makes on the union of the rows: gradients are summed over ranks and divided by the
global denominator (``train.distributed``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("gloo_worker.py")


def run_workers(torchrun, n: int, model: Path, adapter: Path, out: Path, aggregations: str) -> None:
    out.mkdir(parents=True)
    proc = torchrun(WORKER, model, adapter, out, aggregations, n=n)
    assert proc.returncode == 0, proc.stderr[-3000:]


AGGREGATIONS = ("trajectory", "token", "sequence")


@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process_on_the_union(tiny_model_dir, tiny_adapter_dir, tmp_path, torchrun):
    import importlib.util

    from safetensors.torch import load_file

    spec = importlib.util.spec_from_file_location("gloo_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    (tmp_path / "one").mkdir()
    worker.main(
        str(tiny_model_dir), str(tiny_adapter_dir), str(tmp_path / "one"), ",".join(AGGREGATIONS)
    )  # world of one
    run_workers(torchrun, 2, tiny_model_dir, tiny_adapter_dir, tmp_path / "two", ",".join(AGGREGATIONS))
    init = load_file(str(tiny_adapter_dir / "adapter_model.safetensors"))
    for agg in AGGREGATIONS:
        one = torch.load(tmp_path / "one" / f"rank0-{agg}.pt")
        r0, r1 = torch.load(tmp_path / "two" / f"rank0-{agg}.pt"), torch.load(tmp_path / "two" / f"rank1-{agg}.pt")
        assert r0["denominator"] == r1["denominator"] == one["denominator"], agg
        assert r0["loss"] == pytest.approx(one["loss"], rel=1e-5), agg
        for a, b, c in zip(one["params"], r0["params"], r1["params"], strict=True):
            assert torch.equal(b, c), agg  # the ranks stay in sync bit for bit
            # = one process up to float32 summation order; AdamW's first step (g / (|g| + eps))
            # amplifies that round-off for near-zero gradient entries: observed max 3e-6 with lr 1e-2
            assert torch.allclose(a, b, atol=2e-5, rtol=0), agg
        # the update is not trivially zero: the weights moved away from the adapter they started from
        lora_a = [p for p in one["params"] if p.dim() == 2]
        assert len(lora_a) == len(init)
        moved = sum(float((p - init[k]).abs().sum()) for p, k in zip(one["params"], sorted(init), strict=True))
        assert moved > 1e-3, agg


COLLECTIVES = Path(__file__).with_name("collectives_worker.py")


def run_collectives(torchrun, out: Path, *args: str) -> subprocess.CompletedProcess:
    out.mkdir(parents=True)
    return torchrun(COLLECTIVES, out, *args)


def test_collectives_on_cpu_tensors_work_in_a_cuda_only_process_group(tmp_path, torchrun):
    """A NCCL group serves CUDA tensors only; ``cuda:gloo`` has the same device map on a CPU
    machine. Statistics, barriers (and gradients held on the CPU) must still reduce: they go to a
    gloo group that serves the CPU (before: "No backend type associated with device type cpu")."""
    import json

    proc = run_collectives(torchrun, tmp_path / "run", "collectives", "cuda:gloo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        got = json.loads((tmp_path / "run" / f"rank{rank}.json").read_text())
        assert got["sum"] == [3.0, 1.0]  # (1 + 0) + (1 + 1), 0.5 + 0.5
        assert got["max"] == [1.0]
        expected = [["a", 30.0], ["b", 2.0]]  # in each rank's own key order
        assert got["named"] == (expected if rank == 0 else expected[::-1])
        assert got["denominator"] == 5.0  # 2 + 3
        assert got["grad"] == pytest.approx([0.6] * 3, rel=1e-6)  # (1 + 2) / 5 in float32


@pytest.mark.slow
def test_rank_zero_work_is_waited_for_explicitly_and_with_a_bound(tmp_path, torchrun):
    """While rank 0 evaluates alone, the other ranks wait in ``Dist.wait_for_main`` (bounded by
    ``wait_s``), not inside a collective bounded by the process-group timeout: 5 s of rank-0 work
    pass with a 2 s timeout; 20 s exceed the 8 s bound and the waiting rank fails saying so."""
    import json

    proc = run_collectives(torchrun, tmp_path / "ok", "wait:5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        got = json.loads((tmp_path / "ok" / f"rank{rank}.json").read_text())
        assert got["sum"] == [2.0]
        # rank 0 slept 5 s; rank 1's clock may start a few ms after rank 0's (the barrier's
        # skew), so it is held to 4 s: still twice the 2 s collective timeout it outlived
        assert got["waited_s"] >= (5.0 if rank == 0 else 4.0)
    proc = run_collectives(torchrun, tmp_path / "late", "wait:20")
    assert proc.returncode != 0
    assert "waited more than 8 s for rank 0 (the test's work on rank 0)" in proc.stderr
    assert not (tmp_path / "late" / "rank1.json").exists()


def test_named_sums_in_one_process_keep_their_names_and_order():
    from memsearch.train.distributed import Dist

    named = Dist().all_sum_named({"tokens": 3, "loss/0": 0.5})
    assert list(named.items()) == [("tokens", 3.0), ("loss/0", 0.5)]
