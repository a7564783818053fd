"""The flow policy (π0, transformers' PI0 built tiny): Flow-SDE log-probabilities by hand, the ODE at noise 0,
recorded = recomputed log-probs, checkpoints, bad input, and GRPO on the reach env through the trainer."""

import contextlib
import io
import json
import math
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from mmrl.policy.flow import (
    FlowPolicy,
    FlowRollout,
    FlowStats,
    build_tiny_flow,
    cat_flow_rollouts,
    gaussian_logprob,
    sde_schedule,
    sde_step,
)
from mmrl.stages.evaluate import evaluate
from mmrl.types import Sampling
from sim.base import Observation

STATS = FlowStats((0.0, 0.0, 0.0, 0.0), (0.1, 0.1, 0.2, 0.2), (0.1, -0.1), (0.5, 0.4))
PI0_RUN = (
    "sft.episodes=8", "sft.steps=3", "sft.batch_size=8", "algo.group_size=2", "trainer.prompts_per_step=2",
    "trainer.eval_episodes=2", "trainer.eval_batch_size=2", "trainer.save_every=1", "trainer.threads=1",
)  # fmt: skip


def _obs(n: int = 4, seed: int = 0, views: int = 1) -> Observation:
    gen = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (n, views, 48, 48, 3), generator=gen, dtype=torch.uint8)
    colours = ["red", "green", "blue", "yellow"]
    return Observation(
        image=image if views > 1 else image[:, 0],
        instruction=[f"move the gripper to the {colours[i % 4]} disc" for i in range(n)],
        proprio=torch.randn(n, 4, generator=gen) * 0.1,
    )


@pytest.fixture(scope="module")
def policy() -> FlowPolicy:
    return build_tiny_flow(seed=0, stats=STATS)


# ---------------------------------------------------------------------------------------------- Flow-SDE by hand
def test_sde_schedule_and_transition_density_by_hand():
    t, sigma, dt = sde_schedule(4, noise_level=0.5)
    torch.testing.assert_close(t, torch.tensor([1.0, 0.75, 0.5, 0.25]))
    # sigma_t = a sqrt(t / (1 - t)); at t = 1 the next step's value (the formula is infinite there).
    torch.testing.assert_close(sigma, torch.tensor([0.5 * 3**0.5, 0.5 * 3**0.5, 0.5, 0.5 / 3**0.5]))
    assert dt == -0.25
    # One dimension: x = 1, v = 2, t = 0.5, sigma = 0.4, dt = -0.25.
    # drift = v + sigma^2 / (2t) (x + (1 - t) v) = 2 + 0.16 * 2 = 2.32; mean = 1 - 0.25 * 2.32 = 0.42;
    # std = sigma sqrt(|dt|) = 0.2.
    x, v = torch.tensor([[[1.0]]]), torch.tensor([[[2.0]]])
    mean, std = sde_step(x, v, torch.tensor([0.5]), torch.tensor([0.4]), -0.25)
    torch.testing.assert_close(mean, torch.tensor([[[0.42]]]))
    torch.testing.assert_close(std, torch.tensor([[[0.2]]]))
    # A Gaussian written here: log N(y; m, s^2) = -(y - m)^2 / (2 s^2) - log s - log(2 pi) / 2, summed over dims.
    y = torch.tensor([[[0.52, -0.1], [0.3, 0.42]]])  # [1, C=2, D=2]
    m = torch.full_like(y, 0.42)
    s = torch.tensor([[[0.2]]])
    expected = sum(
        -((yy - 0.42) ** 2) / (2 * 0.04) - math.log(0.2) - 0.5 * math.log(2 * math.pi) for yy in y.flatten()
    )
    torch.testing.assert_close(gaussian_logprob(y, m, s), torch.tensor([float(expected)]))


def test_sde_at_noise_level_zero_is_the_ode_and_the_ode_is_transformers_sampler(policy):
    x, v = torch.randn(3, 4, 4), torch.randn(3, 4, 4)
    mean, std = sde_step(x, v, torch.full((3,), 0.75), torch.zeros(3), -0.25)
    assert torch.equal(mean, x + v * -0.25) and torch.equal(std, torch.zeros(3, 1, 1))
    obs = _obs(2)
    greedy = policy.generate(obs, 1, Sampling(temperature=0.0), generator=torch.Generator().manual_seed(1))
    quiet = build_tiny_flow(seed=0, stats=STATS, noise_level=0.0)
    silent = quiet.generate(obs, 1, Sampling(temperature=1.0), generator=torch.Generator().manual_seed(1))
    assert torch.equal(greedy.chain, silent.chain)
    assert not greedy.completion_mask.any() and torch.equal(greedy.logprobs, torch.zeros(2, 4))
    reference = policy.model.sample_actions(
        state=greedy.state, input_ids=greedy.prompt_ids, pixel_values=greedy.pixel_values, noise=greedy.chain[:, 0],
        attention_mask=greedy.prompt_mask.long(), pixel_attention_mask=greedy.pixel_attention_mask, num_steps=4,
    )  # fmt: skip
    torch.testing.assert_close(greedy.chain[:, -1], reference, rtol=0, atol=1e-6)
    # The executed actions are the first D dimensions, un-normalised with the policy's statistics.
    expected = reference[..., :2] * torch.tensor([0.5, 0.4]) + torch.tensor([0.1, -0.1])
    torch.testing.assert_close(greedy.actions, expected)


# ---------------------------------------------------------------------------------------------- log-probs
def test_recorded_logprobs_equal_the_recomputed_ones_and_carry_gradients(policy):
    obs = _obs(4, views=2)  # two views: the backbone reads both
    obs = Observation(
        obs.image[[0, 0, 1, 1]], [obs.instruction[i] for i in (0, 0, 1, 1)], proprio=obs.proprio[[0, 0, 1, 1]]
    )
    rollout = policy.generate(obs, group_size=2, sampling=Sampling(), generator=torch.Generator().manual_seed(0))
    assert rollout.logprobs.shape == (4, 4) and rollout.completion_mask.all()
    assert rollout.pixel_values.shape[:2] == (4, 2)
    assert not torch.equal(rollout.chain[0], rollout.chain[1])  # a group's chains differ
    scored = policy.logprobs(rollout)
    torch.testing.assert_close(scored, rollout.logprobs, rtol=0, atol=1e-4)
    # Micro-batches (row slices) score alike, and a concatenation of slices is the rollout again.
    parts = [rollout.rows(0, 1), rollout.rows(1, 4)]
    torch.testing.assert_close(torch.cat([policy.logprobs(p) for p in parts]), scored, rtol=0, atol=1e-4)
    assert torch.equal(cat_flow_rollouts(parts).chain, rollout.chain)
    assert torch.equal(rollout.select(torch.tensor([2, 0])).chain, rollout.chain[[2, 0]])
    scored.sum().backward()
    assert policy.model.action_out_proj.weight.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.model.model.vlm.parameters())
    policy.model.zero_grad(set_to_none=True)
    # Entropy is the Flow-SDE Gaussian's, fixed by the noise schedule: C*D * (log(2 pi e)/2 + log std) per step.
    _, entropy = policy.logprobs(rollout, with_entropy=True)
    _, sigma, dt = sde_schedule(4, 0.5)
    torch.testing.assert_close(entropy[0], 8 * (0.5 * math.log(2 * math.pi * math.e) + torch.log(sigma * 0.5)))


# ---------------------------------------------------------------------------------------------- checkpoints
def test_checkpoint_round_trips_bit_identically_and_loads_through_model_path(policy, tmp_path):
    from mmrl.policy import check_run, load_policy
    from mmrl.runtime.config import ConfigError, ModelConfig, load_config

    policy.save_pretrained(tmp_path / "pi0")
    saved = json.loads((tmp_path / "pi0" / "processor_config.json").read_text())
    assert saved["state_std"] == [0.1, 0.1, 0.2, 0.2] and saved["processor_class"] == "PI0Processor"
    loaded = load_policy(ModelConfig(path=str(tmp_path / "pi0")))
    assert isinstance(loaded, FlowPolicy) and loaded.stats == policy.stats
    for (name, a), (_, b) in zip(policy.model.state_dict().items(), loaded.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    obs = _obs(2)
    a = policy.generate(obs, 1, Sampling(), generator=torch.Generator().manual_seed(3))
    b = loaded.generate(obs, 1, Sampling(), generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.actions, b.actions) and torch.equal(a.logprobs, b.logprobs)
    assert isinstance(load_policy(ModelConfig(path="tiny:pi0")), FlowPolicy)
    # `mmrl eval` applies the model options to whatever it loads: the defaults pass, another backend is refused
    # before it loads, naming the field.
    assert loaded.apply_options(ModelConfig()) is loaded
    cfg = load_config(None, [f"model.path={tmp_path / 'pi0'}", "model.generation_backend=hf"])
    with pytest.raises(ConfigError, match="model.generation_backend: not built for flow policies"):
        check_run(cfg)


# ---------------------------------------------------------------------------------------------- config options
def test_the_config_sets_what_the_policy_samples_with(tmp_path):
    from mmrl.policy import check_run, load_policy
    from mmrl.runtime.config import ConfigError, load_config
    from mmrl.runtime.paths import REPO

    obs, seed = _obs(2), torch.Generator().manual_seed
    # An override from the command line: noise level 0 turns sampling into the ODE (what greedy runs) ...
    cfg = load_config(REPO / "configs" / "pi0_reach_tiny.yaml", ["model.flow.noise_level=0"])
    quiet = load_policy(cfg.model).apply_options(cfg.model)
    quiet.set_stats(STATS)
    assert quiet.noise_level == 0.0
    greedy = quiet.generate(obs, 1, Sampling(temperature=0.0), generator=seed(1))
    sampled = quiet.generate(obs, 1, Sampling(temperature=1.0), generator=seed(1))
    assert torch.equal(sampled.chain, greedy.chain) and not sampled.completion_mask.any()
    # ... which the preset's own level (null: the policy's 0.5) does not.
    preset = load_config(REPO / "configs" / "pi0_reach_tiny.yaml").model
    plain = load_policy(preset).apply_options(preset)
    plain.set_stats(STATS)
    assert plain.noise_level == 0.5
    assert not torch.equal(plain.generate(obs, 1, Sampling(), generator=seed(1)).chain, greedy.chain)
    # Steps and level together: 3 denoising steps a chunk, each scored as sampled; a checkpoint keeps them and a
    # config leaving them null keeps the folder's.
    cfg = load_config(REPO / "configs" / "pi0_reach_tiny.yaml", ["model.flow.steps=3", "model.flow.noise_level=0.3"])
    three = plain.apply_options(cfg.model)
    rollout = three.generate(obs, 1, Sampling(), generator=seed(2))
    assert rollout.chain.shape[1] == 4 and rollout.logprobs.shape == (2, 3) and rollout.noise_level == 0.3
    torch.testing.assert_close(three.logprobs(rollout).detach(), rollout.logprobs, rtol=0, atol=1e-4)
    three.save_pretrained(tmp_path / "three")
    folder = load_config(None, [f"model.path={tmp_path / 'three'}"]).model
    again = load_policy(folder).apply_options(folder)
    assert (again.num_steps, again.noise_level, again.noise_method) == (3, 0.3, "flow_sde")
    # Left null, the level is the folder's (0.3), under which one step is refused when it loads, naming the field.
    with pytest.raises(ConfigError, match="model.flow.steps is 1, but Flow-SDE at noise level 0.3"):
        load_policy(folder).apply_options(replace(folder, flow=replace(folder.flow, steps=1)))
    # A VLM folder with the flow fields set is refused before it loads: its kind is read off its config.json.
    vlm = load_config(
        None, [f"model.path={REPO / 'assets' / 'tiny_models' / 'qwen3_vl_warm_start'}", "model.flow.steps=3"]
    )
    with pytest.raises(ConfigError, match="model.flow.steps: not built for VLM policies"):
        check_run(vlm)


def test_bad_flow_options_are_config_errors_naming_the_field():
    from mmrl.policy import check_run
    from mmrl.runtime.config import ConfigError, load_config

    pi0 = "model.path=tiny:pi0"
    cases = {
        "model.flow.noise_level must be >= 0": [pi0, "model.flow.noise_level=-0.1"],
        "model.flow.noise_level: expected a finite number, got nan": [pi0, "model.flow.noise_level=.nan"],  # at load
        "model.flow.noise_method must be one of flow_sde, flow_noise": [pi0, "model.flow.noise_method=flow_cps"],
        "model.flow.steps must be >= 1": [pi0, "model.flow.steps=0"],
        "model.flow.steps is 1, but Flow-SDE at noise level 0.5": [
            pi0, "model.flow.steps=1", "model.flow.noise_level=0.5"
        ],
        "model.flow.steps: not built for VLM policies": ["model.path=tiny:qwen2_vl", "model.flow.steps=3"],
        "model.flow.noise_level, model.flow.noise_method: not built for VLM policies": [
            "model.flow.noise_level=0", "model.flow.noise_method=flow_sde", "model.path=tiny:qwen3_vl"
        ],
    }  # fmt: skip
    for message, overrides in cases.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            check_run(load_config(None, overrides))  # before anything loads
    assert (
        check_run(load_config(None, [pi0, "model.flow.steps=1", "model.flow.noise_level=0"])).__name__ == "FlowPolicy"
    )


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_input_is_an_error_naming_the_field(policy, tmp_path):
    from mmrl.policy.vlm.tiny import ASSETS

    with pytest.raises(ValueError, match="not a PI0 checkpoint: its config.json has model_type 'qwen2_vl'"):
        FlowPolicy.from_pretrained(ASSETS / "tiny_models" / "qwen2_vl")
    with pytest.raises(ValueError, match="not a PI0 checkpoint: it has no config.json"):
        FlowPolicy.from_pretrained(tmp_path)
    obs = _obs(2)
    with pytest.raises(ValueError, match=r"obs.proprio has 3 dimensions; the policy's state_mean has 4"):
        policy.generate(Observation(obs.image, obs.instruction, proprio=obs.proprio[:, :3]))
    with pytest.raises(ValueError, match="obs.proprio is None"):
        policy.generate(Observation(obs.image, obs.instruction))
    short = SimpleNamespace(action_kind="continuous", action_dim=2, max_episode_steps=2)
    with pytest.raises(ValueError, match=r"chunk_size 4 is longer than the episode \(env.max_episode_steps 2\)"):
        policy.check_env(short)
    with pytest.raises(ValueError, match="env.action_dim is 3; the policy's actions_mean has 2"):
        policy.check_env(SimpleNamespace(action_kind="continuous", action_dim=3, max_episode_steps=8))
    with pytest.raises(ValueError, match="noise_method"):
        build_tiny_flow(noise_method="flow_cps")
    with pytest.raises(ValueError, match="actions_mean and actions_std"):
        FlowStats((0.0,), (1.0,), (0.0, 0.0), (1.0,))


def test_an_env_without_proprio_is_refused_before_anything_trains(tiny_run_config, point_env, tmp_path):
    from mmrl.trainer import train

    cfg = tiny_run_config(tmp_path, "model.path=tiny:pi0", f"env.name={point_env}", "env.options={}", *PI0_RUN)
    with pytest.raises(ValueError, match="obs.proprio is None"):
        train(cfg)
    assert not (tmp_path / "cold_start").exists()
    papo = tiny_run_config(tmp_path, "model.path=tiny:pi0", f"env.name={point_env}", "algo.papo.monitor=true")
    with pytest.raises(ValueError, match="algo.papo.monitor: not built for flow policies"):
        train(papo)


# ---------------------------------------------------------------------------------------------- the trainer
def _train(tiny_run_config, out, *overrides, stop_after=None):
    from mmrl.trainer import train

    pytest.importorskip("mujoco")
    cfg = tiny_run_config(out, "model.path=tiny:pi0", "env.name=reach", "env.options={image_size: 64, camera: ego}",
                          "env.eval_metric=success", *PI0_RUN, *overrides)  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return train(cfg, stop_after=stop_after)


def test_two_grpo_steps_move_the_tiny_pi0_on_reach_and_a_resumed_run_matches(tiny_run_config, tmp_path):
    metrics = _train(tiny_run_config, tmp_path / "full", "trainer.total_steps=2", "trainer.lr=1e-3")
    steps = [m for m in metrics if "loss/policy" in m]
    assert len(steps) == 2 and all(math.isfinite(m["loss/policy"]) for m in steps)
    # One optimiser step per rollout: the sampler's log-probs are the old ones, so every ratio starts at 1.
    assert all(abs(m["ratio/max"] - 1) < 1e-4 and abs(m["ratio/min"] - 1) < 1e-4 for m in steps)
    start = FlowPolicy.from_pretrained(tmp_path / "full" / "cold_start")
    last = FlowPolicy.from_pretrained(sorted((tmp_path / "full" / "checkpoints").iterdir())[-1])
    assert any(not torch.equal(a, b) for a, b in zip(start.model.parameters(), last.model.parameters()))
    assert last.stats == start.stats  # the statistics travel with every checkpoint
    # Stopped after step 1 and resumed: the same weights as the run that went through.
    _train(tiny_run_config, tmp_path / "parts", "trainer.total_steps=2", "trainer.lr=1e-3", stop_after=1)
    _train(tiny_run_config, tmp_path / "parts", "trainer.total_steps=2", "trainer.lr=1e-3", "resume=true")
    resumed = FlowPolicy.from_pretrained(sorted((tmp_path / "parts" / "checkpoints").iterdir())[-1])
    for a, b in zip(last.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_ppo_epochs_ratios_are_one_at_lr_zero_and_the_clip_binds_at_a_high_lr(tiny_run_config, tmp_path):
    epochs = ("trainer.total_steps=1", "algo.ppo_epochs=2", "algo.mini_batch_groups=1")
    still = _train(tiny_run_config, tmp_path / "still", *epochs, "trainer.lr=0")
    step = next(m for m in still if "loss/policy" in m)
    assert step["optimizer_steps"] == 4 and step["clip_fraction"] == 0.0
    assert abs(step["ratio/max"] - 1) < 1e-4 and abs(step["ratio/min"] - 1) < 1e-4
    moved = _train(tiny_run_config, tmp_path / "moved", *epochs, "trainer.lr=3e-2")
    assert next(m for m in moved if "loss/policy" in m)["clip_fraction"] > 0


def test_mmrl_export_writes_a_pi0_folder_transformers_and_model_path_load(tiny_run_config, tmp_path, capsys):
    from transformers import PI0ForConditionalGeneration

    from mmrl.cli import main
    from mmrl.export import export
    from mmrl.policy import load_policy
    from mmrl.runtime.config import ModelConfig

    _train(tiny_run_config, tmp_path / "run", "trainer.total_steps=1", "trainer.lr=1e-3", "model.flow.steps=3")
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    assert "exported to" in capsys.readouterr().out
    out, trained = tmp_path / "out", FlowPolicy.from_pretrained(tmp_path / "run" / "checkpoints" / "step_00000001")
    assert not (out / "training_state.pt").exists() and not (out / "trainer_state.json").exists()
    assert json.loads((out / "mmrl_export.json").read_text())["lora_merged"] is False
    # Plain transformers loads the model; model.path loads the policy back: same weights, statistics and sampling.
    model = PI0ForConditionalGeneration.from_pretrained(out)
    loaded = load_policy(ModelConfig(path=str(out)))
    assert isinstance(loaded, FlowPolicy) and loaded.stats == trained.stats and trained.stats is not None
    assert (loaded.num_steps, loaded.noise_level) == (3, 0.5)  # the run's model.flow.steps travels with it
    reference = trained.model.state_dict()
    for states in (model.state_dict(), loaded.model.state_dict()):
        assert states.keys() == reference.keys()
        for name, weight in states.items():
            assert torch.equal(weight, reference[name]), name
    # A cold start moved the weights off the random initialisation: the comparison above could fail.
    assert any(not torch.equal(a, b) for a, b in zip(build_tiny_flow(seed=0).model.parameters(), model.parameters()))
    half = export(tmp_path / "run" / "checkpoints" / "step_00000001", tmp_path / "bf16", dtype="bfloat16")
    assert PI0ForConditionalGeneration.from_pretrained(half, dtype="auto").dtype == torch.bfloat16


def test_flow_rollout_quacks_like_a_rollout_for_the_micro_batches(policy):
    from mmrl.runtime.distributed import World
    from mmrl.stages.batching import micro_batches

    rollout = policy.generate(_obs(4), 1, Sampling(), generator=torch.Generator().manual_seed(0))
    assert isinstance(rollout, FlowRollout) and len(rollout) == 4
    parts = micro_batches(rollout, torch.ones(4), None, micro_batch_size=3, token_budget=0, aggregation="token_mean",
                          world=World())  # fmt: skip
    assert [len(p.rollout) for p in parts] == [3, 1]
    torch.testing.assert_close(sum(p.weight for p in parts), torch.tensor(1.0))


def test_held_out_play_of_a_flow_policy_is_a_function_of_its_weights_and_seeds(policy):
    """Greedy play runs the ODE from noise: evaluation seeds that noise per batch, so the same weights score the same
    whatever the global random state, and the training's random stream comes out of evaluation as it went in."""
    opts = {"image_size": 64, "camera": "ego"}
    scores = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        before = torch.random.get_rng_state()
        result = evaluate(policy, "reach", opts, episodes=4, batch_size=2, keep=0)
        assert torch.equal(torch.random.get_rng_state(), before)
        scores.append(result.metrics)
    assert scores[0] == scores[1]
    assert scores[0]["reward"] != 0.0  # a random π0 moves: its return depends on the noise it starts from
