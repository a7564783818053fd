"""GAE against a loop written here, the clipped value loss and explained variance by hand."""

from __future__ import annotations

import pytest
import torch

from mmrl.algos import CRITIC_ADVANTAGES, explained_variance, gae_advantages, value_loss


def gae_by_loop(
    rewards: list[float], values: list[float], gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """One episode, the textbook way: delta_t with V(s_T) = 0, then A_t = sum_k (gamma lam)^k delta_{t+k}."""
    T = len(rewards)
    deltas = [rewards[t] + gamma * (values[t + 1] if t + 1 < T else 0.0) - values[t] for t in range(T)]
    advantages = [sum((gamma * lam) ** k * deltas[t + k] for k in range(T - t)) for t in range(T)]
    return advantages, [a + v for a, v in zip(advantages, values)]


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 0.7)])
def test_gae_matches_the_loop_on_episodes_of_different_lengths(gamma, lam):
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    lengths = [5, 2, 1]
    active = torch.arange(5) < torch.tensor(lengths).unsqueeze(-1)
    junk = torch.where(active, rewards, torch.full_like(rewards, float("nan")))  # past the end: anything
    advantages, returns = gae_advantages(junk, values, active, gamma=gamma, lam=lam)
    for row, length in enumerate(lengths):
        want_a, want_r = gae_by_loop(rewards[row, :length].tolist(), values[row, :length].tolist(), gamma, lam)
        torch.testing.assert_close(advantages[row, :length], torch.tensor(want_a))
        torch.testing.assert_close(returns[row, :length], torch.tensor(want_r))
        assert advantages[row, length:].abs().sum() == 0 and returns[row, length:].abs().sum() == 0


def test_gae_of_a_single_turn_is_the_reward_minus_the_value():
    rewards, values = torch.tensor([[1.0], [0.0]]), torch.tensor([[0.25], [0.5]])
    advantages, returns = CRITIC_ADVANTAGES.get("gae")(rewards, values, torch.ones(2, 1, dtype=torch.bool))
    torch.testing.assert_close(advantages, torch.tensor([[0.75], [-0.5]]))
    torch.testing.assert_close(returns, rewards)


def test_gae_with_lambda_one_and_zero_values_is_the_discounted_return():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    advantages, _ = gae_advantages(rewards, torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool), gamma=0.9, lam=1)
    torch.testing.assert_close(advantages, torch.tensor([[0.81, 0.9, 1.0]]))


def test_value_loss_clips_the_move_away_from_the_old_value():
    old, returns = torch.tensor([0.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, -1.0])
    values = torch.tensor([0.5, 2.0, 0.1], requires_grad=True)
    out = value_loss(values, old, returns, clip=0.2)
    # Row 0: unclipped (0.5-1)^2 = 0.25, clipped (0.2-1)^2 = 0.64 -> 0.64, no gradient (clipped is larger).
    # Row 1: unclipped (2-1)^2 = 1, clipped (0.2-1)^2 = 0.64 -> 1. Row 2: (0.1+1)^2 = 1.21 vs (0.1+1)^2 -> 1.21.
    assert out.loss.item() == pytest.approx(0.5 * (0.64 + 1.0 + 1.21) / 3)
    assert out.metrics["value/clip_fraction"].item() == pytest.approx(1 / 3)
    out.loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([0.0, 1.0 / 3, 1.1 / 3]))
    plain = value_loss(torch.tensor([0.5, 2.0, 0.1]), old, returns, clip=0)
    assert plain.loss.item() == pytest.approx(0.5 * (0.25 + 1.0 + 1.21) / 3)


def test_explained_variance():
    target = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(target, target).item() == pytest.approx(1.0)
    assert explained_variance(torch.full((4,), 2.5), target).item() == pytest.approx(0.0)
    assert torch.isnan(explained_variance(target, torch.ones(4)))
