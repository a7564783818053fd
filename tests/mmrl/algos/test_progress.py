"""SRPO's progress reward: the pure function by hand, the trajectory embeddings on the real tiny VLMs, the shaping."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import sim
from mmrl.algos.progress import progress_rewards
from mmrl.methods.progress import trajectory_embeddings, with_progress_rewards
from mmrl.runtime.config import AlgoConfig
from mmrl.stages.rollout import collect_episodes
from mmrl.types import Sampling


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_progress_rewards_by_hand():
    # Group 0: a success at 0, failures at 1 and 3. Group 1: no success. Group 2: successes at 0 and 10, a failure at 8.
    embeddings = torch.tensor([[0.0], [1.0], [3.0], [5.0], [6.0], [7.0], [0.0], [10.0], [8.0]])
    success = torch.tensor([1, 0, 0, 0, 0, 0, 1, 1, 0]).bool()
    rewards, distances = progress_rewards(embeddings, success, group_size=3, coef=0.5)
    # Distances to the nearest success of the group: 1, 3 and 2 (10 is nearer than 0 for the last one).
    assert distances[[1, 2, 8]].tolist() == [1.0, 3.0, 2.0]
    assert torch.isnan(distances[[0, 3, 4, 5, 6, 7]]).all()
    mean, std = 2.0, math.sqrt(2 / 3)  # of 1, 3, 2 (population std)
    expected = [0.5 * sigmoid(-(d - mean) / std) for d in (1.0, 3.0, 2.0)]
    assert rewards[[1, 2, 8]].tolist() == pytest.approx(expected, rel=1e-5)
    assert rewards[[0, 3, 4, 5, 6, 7]].tolist() == [0.0] * 6  # successes and the group without one
    assert rewards[1] > rewards[8] > rewards[2]  # closer to success, more reward; all below coef
    assert float(rewards.max()) < 0.5


def test_progress_rewards_need_whole_groups():
    with pytest.raises(ValueError, match="groups of 4"):
        progress_rewards(torch.zeros(6, 2), torch.zeros(6, dtype=torch.bool), group_size=4, coef=0.5)


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_trajectory_embeddings_and_shaping_on_a_multi_step_env(arch, tiny_policy):
    policy = tiny_policy(arch, prompt_template="{instruction} {image}")
    env = sim.make("gui_task", num_envs=6, image_size=96)
    try:
        # Greedy: the two worlds of a group replay the same episode; the groups start from different seeds.
        played = collect_episodes(policy, env, [0, 0, 1, 1, 2, 2], 2, Sampling(max_new_tokens=4, temperature=0.0))
    finally:
        env.close()
    embeddings = trajectory_embeddings(policy, played)
    hidden = embeddings.shape[-1] // 2
    assert embeddings.shape == (6, 2 * hidden) and torch.isfinite(embeddings).all()
    assert torch.allclose(embeddings[0], embeddings[1]) and not torch.allclose(embeddings[0], embeddings[2])

    # Shaping: say world 0 succeeded and world 1 failed; only world 1's last turn gains the reward.
    success = torch.tensor([True, False, False, False, True, False])
    episodes = replace(played, success=success)
    shaped, metrics = with_progress_rewards(policy, episodes, AlgoConfig(group_size=2, progress_coef=0.5))
    added = shaped.step_rewards - episodes.step_rewards  # [R, T]
    last = episodes.active.long().sum(-1) - 1
    assert added[1, last[1]] == pytest.approx(shaped.components["srpo"][1].item())
    assert added.abs().sum() == pytest.approx(added[[1, 5], last[[1, 5]]].abs().sum().item())
    assert shaped.components["srpo"][[0, 2, 3, 4]].tolist() == [0.0] * 4  # successes, group 1 has none
    assert metrics["srpo/scored_share"] == pytest.approx(2 / 6)
    assert metrics["srpo/distance"] == pytest.approx(0.5 * float(torch.dist(embeddings[4], embeddings[5])))
    unchanged, none = with_progress_rewards(policy, episodes, AlgoConfig(group_size=2))
    assert unchanged is episodes and none == {}
