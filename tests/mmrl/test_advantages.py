"""The advantages stage: every estimator's rows, and GAE's whitening scaled like the rest of mmrl."""

from __future__ import annotations

from dataclasses import replace

import torch

from mmrl.runtime.config import AlgoConfig, CriticConfig
from mmrl.runtime.distributed import World
from mmrl.stages.advantages import row_advantages, whitened
from mmrl.types import Episodes


def _episodes(step_rewards: torch.Tensor, active: torch.Tensor) -> Episodes:
    world, turn = active.nonzero(as_tuple=True)  # one row per active turn, world-major
    return Episodes(
        rollout=None, world=world, turn=turn, step_rewards=step_rewards, active=active, success=None,
        components={}, env_steps=active.long().sum(-1), info={},
    )  # fmt: skip


def test_whitening_uses_the_unbiased_standard_deviation():
    x = torch.tensor([1.0, 2.0, 4.0, 7.0])
    torch.testing.assert_close(whitened(x, World()), (x - x.mean()) / (x.std() + 1e-6))
    assert abs(float(whitened(x, World()).std()) - 1.0) < 1e-5  # not sqrt((n-1)/n), as the population std gave


def test_gae_advantages_are_whitened_over_the_rows_like_the_group_estimators():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(4, 3, generator=gen)  # [R, T]
    active = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    episodes = _episodes(rewards * active, active)
    values = torch.randn(len(episodes.world), generator=gen)  # [M]
    ac = AlgoConfig(advantage="gae", group_size=2, gamma=0.9, critic=CriticConfig(gae_lambda=0.8))
    raw, returns = row_advantages(episodes, replace(ac, scale_by_std=False), World(), values)
    scaled, _ = row_advantages(episodes, ac, World(), values)
    torch.testing.assert_close(scaled, (raw - raw.mean()) / (raw.std() + 1e-6))
    assert returns.shape == (len(episodes.world),)


def test_grpo_rows_take_their_episode_advantage():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [2.0, 1.0], [0.0, 1.0]])  # [R=4, T=2], G=2
    active = torch.ones(4, 2, dtype=torch.bool)
    episodes = _episodes(rewards, active)
    got, returns = row_advantages(episodes, AlgoConfig(group_size=2, scale_by_std=False), World())
    per_world = torch.tensor([0.5, -0.5, 1.0, -1.0])  # returns 1, 0 | 3, 1 minus their group's mean
    torch.testing.assert_close(got, per_world[episodes.world])
    assert returns is None
