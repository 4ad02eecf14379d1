"""The clipped policy loss and its gradient against a hand-computed tiny case."""

from __future__ import annotations

import math

import pytest
import torch

from memsearch.train.grpo.loss import aggregation_weights, policy_loss
from memsearch.train.rows import Row


def row(traj, n):
    return Row([1], list(range(n)), [0.0] * n, [1] * n, traj, 0, "memory", 0)


def test_aggregation_weights_and_denominators():
    rows = [row(0, 2), row(0, 4), row(1, 3)]
    assert aggregation_weights(rows, "token") == ([1, 1, 1], 9)
    weights, d = aggregation_weights(rows, "sequence")
    assert d == 3 and weights == pytest.approx([1 / 2, 1 / 4, 1 / 3])
    weights, d = aggregation_weights(rows, "trajectory")
    assert d == 2 and weights == pytest.approx([1 / 6, 1 / 6, 1 / 3])
    assert aggregation_weights(rows, "constant", constant_tokens=8) == ([1 / 8] * 3, 2)
    # a trajectory whose rows generated nothing does not count in D
    assert aggregation_weights([*rows, row(2, 0)], "constant", constant_tokens=8)[1] == 2
    with pytest.raises(ValueError, match="aggregation"):
        aggregation_weights(rows, "batch")


@pytest.mark.parametrize("aggregation, ratio", [("trajectory", 3.0), ("constant", 1.0)])
def test_constant_aggregation_pushes_the_same_token_equally_in_short_and_long_trajectories(aggregation, ratio):
    """Dr. GRPO's length bias, hand-computed: the op token of a 2-token trajectory and of a
    6-token one, same advantage. ``trajectory`` weights it by 1 / tokens (6 / 2 = 3x harder in
    the short one); ``constant`` weights every token 1 / L."""
    rows = [row(0, 2), row(1, 6)]
    weights, d = aggregation_weights(rows, aggregation, constant_tokens=8)
    new = torch.zeros((2, 6), requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    loss, _ = policy_loss(new, new.detach(), torch.tensor([1.0, 1.0]), mask,
                          torch.tensor(weights), clip_low=0.2, clip_high=0.2)
    (loss / d).backward()
    short, long = float(new.grad[0, 0]), float(new.grad[1, 0])
    assert short / long == pytest.approx(ratio)
    if aggregation == "constant":  # d loss / d logp_t = -A * w_t / D = -1 / (8 * 2)
        assert short == pytest.approx(-1 / 16)


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
        policy_loss(
            new, new.detach(), torch.tensor([0.0]), torch.tensor([[1]]), torch.tensor([1.0]), 0.2, 0.2, kl_coef=0.1
        )


def test_asymmetric_clip():
    new = torch.log(torch.tensor([[1.25, 0.7]]))
    old = torch.zeros((1, 2))
    loss, stats = policy_loss(
        new, old, torch.tensor([1.0]), torch.ones((1, 2)), torch.tensor([1.0]), clip_low=0.2, clip_high=0.28
    )
    # ratio 1.25 < 1.28: unclipped; ratio 0.7 with A>0: min(0.7, 0.8) = 0.7 (pessimistic, not clipped)
    assert float(loss) == pytest.approx(-(1.25 + 0.7), abs=1e-6)
    assert stats["clipped"] == 0


def test_k3_is_clamped_as_verl_does():
    """log(ref/new) is clamped to [-20, 20] before exp and k3 to [-10, 10]: extreme log-probs
    give finite values and gradients (0 where a clamp is active)."""
    deltas = [100.0, 50.0, 3.0, 1.0, -1.0, -50.0, -100.0]  # ref - new
    new = torch.tensor([[-120.0 + 0 * d for d in deltas]], requires_grad=True)
    ref = new.detach() + torch.tensor([deltas])
    loss, stats = policy_loss(
        new,
        new.detach(),
        torch.tensor([0.0]),
        torch.ones((1, len(deltas))),
        torch.tensor([1.0]),
        0.2,
        0.2,
        ref_logprobs=ref,
        kl_coef=1.0,
    )

    def k3(d):
        d = max(-20.0, min(20.0, d))
        return max(-10.0, min(10.0, math.exp(d) - d - 1))

    expected = [k3(d) for d in deltas]
    assert expected == pytest.approx([10, 10, 10, math.e - 2, math.exp(-1), 10, 10])
    assert float(loss) == pytest.approx(sum(expected), rel=1e-6)
    assert stats["kl"] == pytest.approx(sum(expected), rel=1e-6)
    loss.backward()
    assert torch.isfinite(new.grad).all()
    # d/dnew k3 = 1 - exp(ref - new) where no clamp is active, 0 where one is
    want = [0.0, 0.0, 0.0, 1 - math.e, 1 - math.exp(-1), 0.0, 0.0]
    assert new.grad[0].tolist() == pytest.approx(want, abs=1e-5)


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    """verl's dual clip (clip_ratio_c): with A < 0 the per-token loss is at most -A * c."""
    new = torch.log(torch.tensor([[4.0, 2.5, 4.0]])).requires_grad_(True)
    old = torch.zeros((1, 3))
    mask, w = torch.ones((1, 3)), torch.tensor([1.0])
    # A = -2: ratio 4 -> max(8, 2.4) = 8 -> min(3 * 2, 8) = 6 (dual clip active, no gradient);
    # ratio 2.5 -> 5 < 6, unchanged, gradient -A * ratio = 5
    loss, stats = policy_loss(new[:, :2], old[:, :2], torch.tensor([-2.0]), mask[:, :2], w, 0.2, 0.2, dual_clip=3.0)
    assert float(loss) == pytest.approx(6.0 + 5.0, abs=1e-5)
    assert stats["dual_clipped"] == 1
    loss.backward()
    assert new.grad[0, :2].tolist() == pytest.approx([0.0, 5.0], abs=1e-5)
    # A > 0: the dual clip never applies (ratio 4 is clipped to 1.2 by the ordinary clip)
    loss, stats = policy_loss(
        new.detach()[:, 2:], old[:, 2:], torch.tensor([1.0]), mask[:, 2:], w, 0.2, 0.2, dual_clip=3.0
    )
    assert float(loss) == pytest.approx(-1.2, abs=1e-6) and stats["dual_clipped"] == 0
    # disabled (None, or 0 from a TOML config): the unbounded PPO loss
    for off in (None, 0.0):
        loss, _ = policy_loss(
            new.detach()[:, :1], old[:, :1], torch.tensor([-2.0]), mask[:, :1], w, 0.2, 0.2, dual_clip=off
        )
        assert float(loss) == pytest.approx(8.0, abs=1e-5)


def test_extreme_ratios_stay_finite():
    """A log-ratio of +-100 would overflow exp(): it is clamped to +-20 first (as verl does), so
    loss and gradients stay finite with either sign of the advantage."""
    new = torch.tensor([[100.0, -100.0]], requires_grad=True)
    old = torch.zeros((1, 2))
    for adv in (-1.5, 1.5):
        new.grad = None
        loss, stats = policy_loss(
            new, old, torch.tensor([adv]), torch.ones((1, 2)), torch.tensor([1.0]), 0.2, 0.2, dual_clip=3.0
        )
        loss.backward()
        assert math.isfinite(float(loss)) and torch.isfinite(new.grad).all() and math.isfinite(stats["ratio"])
        if adv < 0:  # ratio e^20 -> dual clip 3 * 1.5; ratio e^-20 -> max(1.5 e^-20, 1.5 * 0.8) = 1.2
            assert float(loss) == pytest.approx(4.5 + 1.2, abs=1e-5)
        else:  # ratio e^20 -> clipped 1.2 * 1.5; ratio e^-20 -> -1.5 e^-20 (pessimistic min keeps it)
            assert float(loss) == pytest.approx(-1.8 - 1.5 * math.exp(-20), abs=1e-5)
