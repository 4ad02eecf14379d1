"""The clipped policy loss and its gradient against a hand-computed tiny case."""

from __future__ import annotations

import math

import pytest
import torch

from memsearch.train.loss import assign_weights, policy_loss
from memsearch.train.rows import Row


def row(traj, n):
    return Row([1], list(range(n)), [0.0] * n, [1] * n, traj, 0, "memory", 0)


def test_aggregation_weights_and_denominators():
    rows = [row(0, 2), row(0, 4), row(1, 3)]
    assert assign_weights(rows, "token") == 9 and [r.weight for r in rows] == [1, 1, 1]
    assert assign_weights(rows, "sequence") == 3 and [r.weight for r in rows] == pytest.approx([1 / 2, 1 / 4, 1 / 3])
    assert assign_weights(rows, "trajectory") == 2 and [r.weight for r in rows] == pytest.approx([1 / 6, 1 / 6, 1 / 3])
    with pytest.raises(ValueError, match="aggregation"):
        assign_weights(rows, "batch")


def test_loss_and_gradient_hand_computed():
    # two rows, two tokens each; old log-probs fixed, new ones are leaves we differentiate
    new = torch.tensor([[math.log(0.5), math.log(0.9)], [math.log(0.3), 0.0]], requires_grad=True)
    old = torch.tensor([[math.log(0.5), math.log(0.6)], [math.log(0.2), 0.0]])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1], [1, 0]])
    weights = torch.tensor([0.5, 1.0])
    loss, stats = policy_loss(new, old, adv, mask, weights, clip_low=0.2, clip_high=0.2)
    # row 0: ratios 1.0 and 1.5 (clipped to 1.2, A>0 -> min picks 1.2): -(1.0) and -(1.2)
    # row 1: ratio 1.5, A=-2: unclipped -3.0, clipped -2.4, min = -3.0 -> loss +3.0; token 2 masked
    expected = 0.5 * (-1.0 - 1.2) + 1.0 * 3.0
    assert float(loss) == pytest.approx(expected, abs=1e-6)
    assert stats["tokens"] == 3 and stats["clipped"] == 1
    loss.backward()
    # d/dnew of -ratio*A*w = -A*w*ratio where unclipped; 0 where the clip is active; 0 where masked
    expected_grad = torch.tensor([[-0.5 * 1.0 * 1.0, 0.0], [-1.0 * -2.0 * 1.5, 0.0]])
    assert torch.allclose(new.grad, expected_grad, atol=1e-6)


def test_kl_term_k3_estimator_and_gradient():
    new = torch.tensor([[math.log(0.4)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.5)]])
    loss, stats = policy_loss(new, new.detach(), torch.tensor([0.0]), torch.tensor([[1]]), torch.tensor([1.0]),
                              0.2, 0.2, ref_logprobs=ref, kl_coef=0.1)
    d = math.log(0.5) - math.log(0.4)
    assert float(loss) == pytest.approx(0.1 * (math.exp(d) - d - 1), abs=1e-7)
    assert stats["kl"] == pytest.approx(math.exp(d) - d - 1, abs=1e-7)
    loss.backward()
    # d/dnew [exp(ref-new) - (ref-new) - 1] = -exp(ref-new) + 1
    assert float(new.grad) == pytest.approx(0.1 * (1 - math.exp(d)), abs=1e-6)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(new, new.detach(), torch.tensor([0.0]), torch.tensor([[1]]), torch.tensor([1.0]), 0.2, 0.2, kl_coef=0.1)


def test_asymmetric_clip():
    new = torch.log(torch.tensor([[1.25, 0.7]]))
    old = torch.zeros((1, 2))
    loss, stats = policy_loss(new, old, torch.tensor([1.0]), torch.ones((1, 2)), torch.tensor([1.0]), clip_low=0.2, clip_high=0.28)
    # ratio 1.25 < 1.28: unclipped; ratio 0.7 with A>0: min(0.7, 0.8) = 0.7 (pessimistic, not clipped)
    assert float(loss) == pytest.approx(-(1.25 + 0.7), abs=1e-6)
    assert stats["clipped"] == 0
