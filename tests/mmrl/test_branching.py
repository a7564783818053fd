"""Branching rollouts (`algo.credit: branch`): greedy play with one sampled turn per group, only that turn trained."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

import sim
from mmrl.policy import Sampling, add_action_tokens
from mmrl.runtime.config import ConfigError
from mmrl.runtime.metrics import read_metrics
from mmrl.stages.rollout import collect_episodes
from mmrl.trainer import train
from tests.mmrl.test_vla import VLA_RUN

SEEDS = [3, 3, 3, 4, 4, 4, 7, 7, 7, 9, 9, 9]  # 4 groups of 3


def _vla(tiny_policy, point_env):
    policy = tiny_policy("qwen3_vl", prompt_template="{image} {instruction}")
    env = sim.make(point_env, num_envs=len(SEEDS))
    add_action_tokens(policy, env.action_low, env.action_high, bins=16)
    return policy, env


def _ids(episodes, world: int, turn: int) -> list[int]:
    rollout = episodes.rollout
    row = ((episodes.world == world) & (episodes.turn == turn)).nonzero().item()
    return rollout.completion_ids[row].tolist()  # a VLA's answer: exactly its codec's tokens, no padding


def test_branching_plays_greedily_and_trains_the_one_sampled_turn(tiny_policy, point_env):
    policy, env = _vla(tiny_policy, point_env)
    torch.manual_seed(0)
    greedy = collect_episodes(policy, env, SEEDS, 3, Sampling(temperature=0.0))
    torch.manual_seed(0)
    branch_turn = torch.randint(env.max_episode_steps, (4,))  # the draw collect_episodes makes first
    torch.manual_seed(0)
    episodes = collect_episodes(policy, env, SEEDS, 3, Sampling(temperature=1.0), branch=True)

    # Every row is played (the episodes' shape is the usual one), and only the branch turn's rows keep tokens.
    assert len(episodes.rollout) == int(episodes.active.sum())
    trained = episodes.rollout.completion_mask.any(-1)  # [M]
    assert trained.tolist() == (episodes.turn == branch_turn[episodes.world // 3]).tolist()
    assert (episodes.rollout.logprobs[~episodes.rollout.completion_mask] == 0).all()
    assert torch.isin(branch_turn, torch.arange(env.max_episode_steps)).all()

    # Before its branch turn a group plays exactly the greedy episode (same seed, greedy answers): one state, one
    # answer across its worlds, the fully greedy run's.
    checked = 0
    for group, turn in enumerate(branch_turn.tolist()):
        for world in range(3 * group, 3 * group + 3):
            for t in range(turn):
                if episodes.active[world, t]:
                    assert _ids(episodes, world, t) == _ids(greedy, world, t)
                    assert episodes.state_keys[world, t] == greedy.state_keys[world, t]
                    checked += 1
            if episodes.active[world, turn]:  # the state the branch starts from is the greedy episode's too
                assert episodes.state_keys[world, turn] == greedy.state_keys[world, turn]
    assert checked > 0, f"every branch was at turn 0 ({branch_turn.tolist()}): pick other seeds"


def test_branching_needs_groups(tiny_policy, point_env):
    policy, env = _vla(tiny_policy, point_env)
    with pytest.raises(ValueError, match="branching needs groups of G >= 2"):
        collect_episodes(policy, env, SEEDS, 1, Sampling(), branch=True)


def test_branch_credit_trains_in_the_trainer(tmp_path, tiny_run_config, point_env):
    cfg = tiny_run_config(
        str(tmp_path), *VLA_RUN, f"env.name={point_env}", "trainer.total_steps=2", "algo.credit=branch",
        "sft.episodes=0",
    )  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        train(cfg)
    rows = [m for m in read_metrics(f"{tmp_path}/metrics.jsonl") if "loss/policy" in m]
    assert len(rows) == 2
    for row in rows:
        assert row["optimizer_steps"] == 1 and torch.isfinite(torch.tensor(row["loss/policy"]))
        # Only the branch turn's rows train: fewer tokens a row than the 2 every turn of the VLA generates.
        assert 0 < row["completion_len"] < 2


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.credit=branch", "algo.advantage=gae"], "algo.credit 'branch' compares the group's episode returns"),
        (["algo.credit=branch", "algo.group_size=1"], r"algo.credit 'branch' .* needs algo.group_size >= 2"),
        (["algo.credit=branch", "trainer.rollout_workers=1"], "trainer.rollout_workers cannot play algo.credit"),
    ],
)
def test_branch_credit_config_errors_name_the_field(tmp_path, tiny_run_config, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_run_config(str(tmp_path), *overrides)
