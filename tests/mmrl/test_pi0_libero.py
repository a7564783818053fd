"""π0 on LIBERO: tiny:pi0 at LIBERO's widths (7-D actions, 8-D proprio), chunks executed open-loop `replan_steps` at a
time, the two presets (the real-size one against a tiny π0 folder laid out as the hub's, no real weights), and, where
LIBERO's environment is built, held-out play that writes the protocol next to its result."""

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import sim
from mmrl.policy import load_policy
from mmrl.policy.flow import FlowPolicy, FlowStats, apply_flow_options, build_tiny_flow
from mmrl.runtime.config import load_config
from mmrl.runtime.folders import check_model_folders
from mmrl.runtime.schema import ConfigError
from mmrl.stages.rollout import collect_episodes
from mmrl.types import Sampling
from sim.base import Observation
from sim.robotics.libero import LiberoEnv

REPO = Path(__file__).resolve().parents[2]
# LIBERO-shaped statistics: 8-D proprio (eef position, axis-angle, fingers), 7-D actions (eef deltas, gripper).
LIBERO_STATS = FlowStats(
    (-0.2, 0.0, 1.1, 3.1, 0.0, -0.1, 0.03, -0.03), (0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.01, 0.01),
    (0.0,) * 6 + (-0.5,), (0.3,) * 6 + (0.9,),
)  # fmt: skip


def _libero_obs(n: int = 2, size: int = 32) -> Observation:
    gen = torch.Generator().manual_seed(0)
    return Observation(
        image=torch.randint(0, 256, (n, 2, size, size, 3), generator=gen, dtype=torch.uint8),  # agent view, wrist
        instruction=["pick up the black bowl and place it on the plate"] * n,
        proprio=torch.tensor(LIBERO_STATS.state_mean).expand(n, 8) + 0.05 * torch.randn(n, 8, generator=gen),
    )


def test_tiny_pi0_takes_the_envs_action_width_only_where_the_asset_is_narrower():
    narrow, asset = (
        build_tiny_flow(seed=0, action_dim=2),
        build_tiny_flow(seed=0),
    )  # reach's 2-D actions: exactly the asset's model
    for (name, a), (_, b) in zip(narrow.model.state_dict().items(), asset.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    wide = build_tiny_flow(seed=0, action_dim=7)
    assert asset.config.max_action_dim == 4 and wide.config.max_action_dim == 7 and wide.config.max_state_dim == 8
    wide.set_stats(LIBERO_STATS)
    rollout = wide.generate(_libero_obs(), 1, Sampling(temperature=0.0))
    assert rollout.actions.shape == (2, wide.chunk, 7)
    assert isinstance(load_policy(load_config(REPO / "configs" / "pi0_libero_tiny.yaml").model, action_dim=7),
                      FlowPolicy)  # fmt: skip


class _Recorder:
    """A reach env whose `step` calls are recorded, with the replanning horizon an env may set."""

    def __init__(self, env, replan_steps):
        self.env, self.replan_steps, self.actions = env, replan_steps, []

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self, *args, **kwargs):
        return self.env.reset(*args, **kwargs)

    def step(self, actions):
        self.actions.append(actions.clone())
        return self.env.step(actions)


@pytest.mark.parametrize("replan", [None, 3])
def test_replan_steps_runs_the_first_r_actions_of_each_chunk_then_asks_again(replan):
    env = _Recorder(sim.make("reach", num_envs=2, image_size=32, max_episode_steps=8), replan)
    policy = build_tiny_flow(seed=0, stats=FlowStats((0.0,) * 4, (0.1,) * 4, (0.0, 0.0), (0.5, 0.5)))
    eps = collect_episodes(policy, env, [5, 6], 1, Sampling(temperature=0.0))
    executed = replan or policy.chunk  # the chunk is 4
    turns = eps.turn.view(-1, 2)[:, 0]  # rows come turn by turn, both worlds while both run
    assert eps.env_steps.tolist() == [8, 8]  # the untrained policy reaches no disc in 8 steps
    assert turns.tolist() == list(range(-(-8 // executed)))  # 2 generations of 4, or 3 of which 3, 3 and 2 run
    for step, actions in enumerate(env.actions):
        turn, k = divmod(step, executed)
        assert torch.equal(actions, eps.rollout.actions[2 * turn : 2 * turn + 2, k]), (step, turn, k)


def test_presets_load_and_the_real_size_one_takes_a_pi0_folder_laid_out_as_the_hubs(tmp_path):
    tiny = load_config(REPO / "configs" / "pi0_libero_tiny.yaml")
    assert tiny.model.path == "tiny:pi0" and tiny.env.name == "libero" and tiny.env.options["replan_steps"] == 2
    real = load_config(REPO / "configs" / "pi0_libero.yaml")
    assert (real.model.dtype, real.model.device, real.model.flow.noise_level) == ("bfloat16", "cuda", 0.5)
    options = real.env.options  # checked against LiberoEnv's constructor by the config (names and types)
    assert options["suite"] == "libero_spatial" and options.get("holdout", 0) == 0
    assert (options["replan_steps"], options["image_transform"], options["image_size"]) == (5, "rot180", 224)
    assert real.trainer.eval_episodes == 500  # the 10 tasks x their 50 fixed initial states
    with pytest.raises(ValueError, match="env.options.replan_steps"):
        load_config(REPO / "configs" / "pi0_libero.yaml", ["env.options.replan_steps=five"])
    with pytest.raises(ConfigError, match="model.path: no folder at checkpoints/pi0_libero"):
        check_model_folders(real)  # the user's π0 folder is named before anything loads
    # The real-size model section on a folder laid out as a π0 checkpoint (a tiny one here: no weights downloaded).
    folder = tmp_path / "pi0_libero"
    wide = build_tiny_flow(seed=0, action_dim=7)
    wide.set_stats(LIBERO_STATS)
    wide.save_pretrained(folder)
    policy = apply_flow_options(load_policy(replace(real.model, path=str(folder), device="cpu")), real.model)
    assert isinstance(policy, FlowPolicy) and policy.model.dtype == torch.bfloat16 and policy.stats == LIBERO_STATS
    assert policy.noise_level == 0.5
    policy.check_env(SimpleNamespace(action_kind="continuous", action_dim=7, max_episode_steps=220))
    with pytest.raises(ValueError, match="env.action_dim is 4"):
        policy.check_env(SimpleNamespace(action_kind="continuous", action_dim=4, max_episode_steps=220))
    rollout = policy.generate(_libero_obs(size=224), 1, Sampling(temperature=0.0))
    assert rollout.actions.shape == (2, policy.chunk, 7) and torch.isfinite(rollout.actions).all()


@pytest.mark.slow
@pytest.mark.skipif(LiberoEnv.unavailable() is not None, reason=str(LiberoEnv.unavailable()))
def test_held_out_play_on_libero_writes_the_protocol_next_to_the_result(tmp_path):
    from mmrl.report import write_eval_report
    from mmrl.stages.evaluate import evaluate

    cfg = load_config(REPO / "configs" / "pi0_libero_tiny.yaml", ["trainer.eval_episodes=1"])
    policy = build_tiny_flow(seed=0, action_dim=7)
    policy.set_stats(LIBERO_STATS)
    options = {**cfg.env.options, "image_size": 32, "max_episode_steps": 4}
    result = evaluate(policy, "libero", options, episodes=1, batch_size=1)
    assert result.metrics["episode_steps"] == 4.0
    assert "open-loop 2 action(s) at a time before replanning" in result.protocol
    assert "10 settling steps with a no-op action" in result.protocol
    text = write_eval_report(cfg, result, tmp_path).read_text()
    assert f"Protocol: {result.protocol}" in text
