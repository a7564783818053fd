"""The critic in the real trainer: a value head on the tiny Qwen2-VL's hidden state, GAE, warm-up, resume, and VLA
episodes over several turns."""

from __future__ import annotations

import contextlib
import copy
import io

import pytest
import torch
from safetensors.torch import load_file

from mmrl.methods.critic import ValueHead, turns_left
from mmrl.runtime.checkpoint import latest_checkpoint, load_training_state
from mmrl.runtime.config import ConfigError
from mmrl.runtime.metrics import read_metrics
from mmrl.trainer import train

GAE = ("algo.advantage=gae", "algo.critic.lr=0.01", "algo.group_size=4", "trainer.prompts_per_step=2")


def _rows(cfg, **kw) -> list[dict]:
    with contextlib.redirect_stdout(io.StringIO()):
        train(cfg, **kw)
    return [m for m in read_metrics(cfg.output_dir + "/metrics.jsonl") if "reward/total" in m]


def _cfg(tiny_run_config, path, env, *overrides):
    return tiny_run_config(str(path), f"env.name={env}", "trainer.eval_episodes=1", *GAE, *overrides)


def test_gae_trains_the_value_head_toward_the_returns(tmp_path, tiny_run_config, letters_env):
    rows = _rows(_cfg(tiny_run_config, tmp_path, letters_env, "trainer.total_steps=4"))
    assert rows[0]["critic/value_mean"] == 0  # the head's last layer starts at zero
    assert all(r["value/loss"] >= 0 and r["optimizer_steps"] == 1 and r["critic/warmup"] == 0 for r in rows)
    assert rows[-1]["critic/value_mean"] != 0 and rows[-1]["critic/grad_norm"] > 0
    # The value moves toward the mean return: closer at the last step than at the first.
    gap = [abs(r["critic/value_mean"] - r["critic/return_mean"]) for r in rows]
    assert gap[-1] < gap[0], gap
    state = load_training_state(latest_checkpoint(tmp_path))[1]
    assert set(state["critic"]) == {"head", "optimizer"}


def test_warm_up_trains_the_head_and_leaves_the_policy(tmp_path, tiny_run_config, tiny_policy, letters_env):
    cfg = _cfg(tiny_run_config, tmp_path, letters_env, "trainer.total_steps=2", "algo.critic.warmup_steps=2")
    policy = tiny_policy("qwen2_vl", seed=0, prompt_template=cfg.model.prompt_template)
    start = copy.deepcopy(policy.model.state_dict())
    rows = _rows(cfg, policy=policy)
    assert all(r["critic/warmup"] == 1 and r["optimizer_steps"] == 0 and "loss/policy" not in r for r in rows)
    saved = load_file(latest_checkpoint(tmp_path) / "model.safetensors")
    assert all(torch.equal(saved[k], start[k].to(saved[k].dtype)) for k in saved if k in start)
    assert rows[-1]["critic/value_mean"] != 0  # the head did learn


def test_resume_is_exact_with_a_critic(tmp_path, tiny_run_config, letters_env):
    options = ("trainer.total_steps=3", "algo.critic.warmup_steps=1", "algo.ppo_epochs=2")
    whole = _rows(_cfg(tiny_run_config, tmp_path / "whole", letters_env, *options))
    parts = tmp_path / "parts"
    _rows(_cfg(tiny_run_config, parts, letters_env, *options), stop_after=2)
    resumed = _rows(_cfg(tiny_run_config, parts, letters_env, *options, "resume=true"))
    assert [r["step"] for r in resumed] == [r["step"] for r in whole] == [1, 2, 3]
    for got, want in zip(resumed, whole):
        assert got.keys() == want.keys()
        for key in ("reward/total", "value/loss", "critic/value_mean", "critic/grad_norm"):
            assert got[key] == pytest.approx(want[key], abs=1e-6), (got["step"], key)
    assert resumed[-1]["loss/policy"] == pytest.approx(whole[-1]["loss/policy"], abs=1e-6)


def test_gae_over_vla_episodes_gives_each_turn_its_own_value(tmp_path, tiny_run_config, point_env):
    from tests.mmrl.test_vla import VLA_RUN

    cfg = tiny_run_config(
        str(tmp_path), *VLA_RUN, f"env.name={point_env}", "trainer.total_steps=2", "algo.advantage=gae",
        "algo.gamma=0.9", "algo.critic.lr=0.01", "sft.episodes=0",
    )  # fmt: skip
    rows = _rows(cfg)
    assert all(r["env/episode_steps"] >= 1 and r["value/loss"] >= 0 for r in rows)
    assert all(torch.isfinite(torch.tensor(r["loss/policy"])) for r in rows)


@pytest.mark.parametrize("time", [False, True])
def test_only_a_time_aware_head_can_fit_returns_that_depend_on_the_turn(time):
    # Every turn shows the same prompt state, and the return-to-go is what is left of a 10-turn episode at 0.1 a turn
    # (the highway preset's case): without the turn the best a head can do is the mean.
    turns = 10
    turn = torch.arange(turns).repeat(8)  # [80]
    hidden = torch.randn(1, 32, generator=torch.Generator().manual_seed(0)).expand(len(turn), 32)
    returns = 0.1 * (turns - turn).float()
    head = ValueHead(32, 16, seed=0, extra=int(time))
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-2)
    left = turns_left(turn, turns)
    assert left[0].item() == 1.0 and left[turns - 1].item() == pytest.approx(0.1)
    for _ in range(300):
        loss = (head(hidden, left if time else None) - returns).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        explained = 1 - (returns - head(hidden, left if time else None)).var() / returns.var()
    assert (explained > 0.95) if time else (abs(explained) < 0.01), explained


def test_a_time_aware_critic_explains_the_returns_of_multi_turn_episodes(tmp_path, tiny_run_config, first_axis_env):
    from tests.mmrl.test_vla import VLA_RUN

    # Each of the 4 turns pays about alike, so the return-to-go is mostly what is left of the episode.
    def run(time: bool) -> list[dict]:
        cfg = tiny_run_config(
            str(tmp_path / str(time)), *VLA_RUN, f"env.name={first_axis_env}", "env.eval_metric=reward",
            "trainer.total_steps=8", "algo.advantage=gae", "algo.critic.lr=0.003", "algo.critic.value_clip=0",
            "algo.ppo_epochs=4", f"algo.critic.time={time}",
            "sft.episodes=0", "trainer.eval_every=0",
        )  # fmt: skip
        return _rows(cfg)

    plain, timed = run(False), run(True)
    late = [sum(r["critic/explained_variance"] for r in rows[-3:]) / 3 for rows in (plain, timed)]
    assert late[1] > 0.5 and late[1] > late[0] + 0.3, late


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("algo.advantage=gae", "algo.credit=step"),
            "algo.credit 'step' cannot be combined with algo.advantage 'gae'",
        ),
        (("algo.critic.warmup_steps=2",), "algo.critic.warmup_steps needs a critic: algo.advantage gae, not 'grpo'"),
        (("algo.critic.trunk_grad=true",), "algo.critic.trunk_grad needs a critic"),
        (("algo.critic.time=true",), "algo.critic.time needs a critic"),
        (("algo.advantage=gae", "algo.critic.gae_lambda=1.5"), r"algo.critic.gae_lambda must be in \[0, 1\]"),
        (("algo.advantage=ppo",), "algo.advantage 'ppo' is not one of"),
    ],
)
def test_bad_critic_settings_name_the_field(tmp_path, tiny_run_config, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_run_config(tmp_path, *overrides)
