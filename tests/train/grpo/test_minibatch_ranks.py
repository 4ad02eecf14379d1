"""Mini-batches under torchrun: every rank takes part in every optimizer step (one gradient
reduction per mini-batch, empty or not), and two gloo ranks make the update one process makes
when its mini-batches are the unions of the ranks' parts (``grpo.update``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("minibatch_worker.py")


@pytest.mark.slow
def test_two_ranks_with_an_empty_mini_batch_equal_one_process(tiny_model_dir, tiny_adapter_dir, tmp_path, torchrun):
    spec = importlib.util.spec_from_file_location("minibatch_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    worker.main(str(tiny_model_dir), str(tiny_adapter_dir), str(tmp_path / "one"))  # world of one
    proc = torchrun(WORKER, tiny_model_dir, tiny_adapter_dir, tmp_path / "two")
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = torch.load(tmp_path / "one" / "rank0.pt")
    r0, r1 = torch.load(tmp_path / "two" / "rank0.pt"), torch.load(tmp_path / "two" / "rank1.pt")
    steps = worker.EPOCHS * worker.MINI_BATCHES
    for result in (one, r0, r1):
        assert result["adam_steps"] == steps and result["scheduler_steps"] == steps
        assert result["denominator"] == 5  # trajectories, summed over the first epoch's mini-batches
    assert abs(one["ratio_mean"] - 1.0) > 1e-4  # the second mini-batch saw the first one's update
    for a, b, c in zip(one["params"], r0["params"], r1["params"], strict=True):
        assert torch.equal(b, c)  # the ranks stay in sync bit for bit
        assert torch.allclose(a, b, atol=2e-5, rtol=0)  # = one process up to float32 summation order
