"""`backend="warp"`: reach and push stepped and rendered as one MuJoCo Warp batch agree with plain MuJoCo.

Warp runs on the CPU here (no GPU on the test machines); the first env of a model compiles its kernels (about 25 s,
then cached under ~/.cache/warp).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("mujoco_warp")

import sim  # noqa: E402
from sim import check_vec_env  # noqa: E402

# Warp computes in float32 and ray-traces; MuJoCo computes in float64 and rasterises with anti-aliasing.
STATE_TOL = 1e-4  # metres, over a whole episode (measured: below 1e-6)
# Largest difference of 4x4-pixel block means, grey levels of 255: measured 21-27 between the backends (shape edges),
# 187-207 between two different scenes; a missing or misplaced disc moves a block by over 100.
BLOCK_TOL = 40.0


def _block_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference of the 4x4-pixel block means of two `[N, H, W, 3]` uint8 image batches."""
    pool = lambda x: F.avg_pool2d(x.permute(0, 3, 1, 2).float(), 4)  # noqa: E731
    return (pool(a) - pool(b)).abs().max().item()


def _assert_discs_drawn(env, image: torch.Tensor) -> None:
    """Every reach disc inside the view and not under the gripper shows a saturated colour at its centre pixel."""
    image = image.cpu().numpy()
    for k in range(env.num_envs):
        for slot in range(env.num_targets):
            if np.hypot(*(env._disc_xy[k, slot] - env.gripper_xy[k])) < env.gripper_radius + 0.01:
                continue  # the dark gripper rides above the discs and hides this one's centre
            col, row = np.rint(env.world_to_pixel(env._disc_xy[k, slot], world=k)).astype(int)
            if 0 <= row < image.shape[1] and 0 <= col < image.shape[2]:
                pixel = image[k, row, col].astype(int)
                assert pixel.max() - pixel.min() > 100, (k, slot, pixel)


def _pair(name, **options):
    return {backend: sim.make(name, backend=backend, **options) for backend in ("mujoco", "warp")}


def _episode(envs, seed, steps, noise=0.3):
    """Step both backends with the same noisy expert actions; return the per-step results of each."""
    out = {backend: [env.reset(seed=seed)] for backend, env in envs.items()}
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        action = envs["mujoco"].expert_action(noise=noise, generator=generator)
        for backend, env in envs.items():
            out[backend].append(env.step(action))
    return out


CASES = [("reach", {"camera": "top"}, 8), ("reach", {"camera": "ego"}, 8), ("push", {"max_episode_steps": 14}, 14)]


@pytest.mark.parametrize("name, options, steps", CASES)
def test_warp_matches_mujoco(name, options, steps):
    _check_against_mujoco(name, options, steps)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name, options, steps", CASES)
def test_warp_on_cuda_matches_mujoco(name, options, steps):  # pragma: no cover - GPU only
    _check_against_mujoco(name, {**options, "device": "cuda"}, steps)


def _check_against_mujoco(name, options, steps):
    envs = _pair(name, num_envs=4, **options)
    try:
        out = _episode(envs, seed=11, steps=steps)
        first_m, first_w = out["mujoco"][0], out["warp"][0]
        assert first_m.instruction == first_w.instruction
        assert torch.equal(first_m.state, first_w.state)  # reset is the same host code on both
        for m, w in zip(out["mujoco"][1:], out["warp"][1:]):
            assert (m.obs.state - w.obs.state).abs().max() < STATE_TOL
            assert torch.allclose(m.reward, w.reward, atol=1e-3)
            assert torch.equal(m.terminated, w.terminated) and torch.equal(m.truncated, w.truncated)
            assert torch.equal(m.info["success"], w.info["success"])
            assert _block_diff(m.obs.image, w.obs.image) < BLOCK_TOL
        if name == "reach":  # the env holds the final state: check the final images against it
            _assert_discs_drawn(envs["warp"], out["warp"][-1].obs.image)
        # The episodes did something: some world succeeded, and the gripper moved.
        assert out["mujoco"][-1].info["success"].any()
        assert (out["warp"][-1].obs.state[:, :2] - first_w.state[:, :2]).abs().max() > 0.02
    finally:
        for env in envs.values():
            env.close()


def test_warp_images_show_the_targets_where_the_camera_says():
    env = sim.make("reach", num_envs=3, backend="warp", camera="ego")
    try:
        obs = env.reset(seed=4)
        _assert_discs_drawn(env, obs.image)
        image = obs.image.numpy()
        for k in range(3):
            centre = image[k, 32, 32].astype(int)
            assert centre.max() < 60  # the dark gripper sits at the centre of the egocentric view
    finally:
        env.close()


def test_warp_finished_worlds_freeze_and_partial_reset():
    envs = _pair("reach", num_envs=4, num_targets=1)
    try:
        for env in envs.values():
            env.reset(seed=[1, 2, 3, 4])
        # Only world 0 moves towards its target; the others are told to stand still.
        results = {}
        for _ in range(8):
            action = envs["mujoco"].expert_action()
            action[1:] = 0.0
            results = {backend: env.step(action) for backend, env in envs.items()}
            if results["warp"].terminated[0]:
                break
        warp = results["warp"]
        assert warp.terminated.tolist() == [True, False, False, False]
        frozen_state, frozen_image = warp.obs.state[0].clone(), warp.obs.image[0].clone()
        step = envs["warp"].step(torch.ones(4, 2))  # world 0 is finished: its action must be ignored
        assert torch.equal(step.obs.state[0], frozen_state) and torch.equal(step.obs.image[0], frozen_image)
        assert step.reward[0] == 0 and (step.obs.state[1:, :2] != warp.obs.state[1:, :2]).any()
        envs["mujoco"].step(torch.ones(4, 2))
        # Reset world 2 alone, mid-episode for the others; both backends again agree.
        obs = {backend: env.reset(seed=9, env_ids=[2]) for backend, env in envs.items()}
        assert (obs["mujoco"].state - obs["warp"].state).abs().max() < STATE_TOL
        assert _block_diff(obs["mujoco"].image, obs["warp"].image) < BLOCK_TOL
        after = {backend: env.step(torch.full((4, 2), -0.5)) for backend, env in envs.items()}
        assert (after["mujoco"].obs.state - after["warp"].obs.state).abs().max() < STATE_TOL
    finally:
        for env in envs.values():
            env.close()


@pytest.mark.parametrize("name", ["reach", "push"])
def test_warp_env_contract(name):
    env = sim.make(name, num_envs=3, backend="warp")
    try:
        check_vec_env(env, seed=0)
    finally:
        env.close()


def test_warp_bad_options_are_named():
    # sim.make checks the option against the constructor's Literal before the env is built
    with pytest.raises(ValueError, match="option 'backend' of env 'reach': expected one of 'mujoco', 'warp', got 'mjx'"):
        sim.make("reach", num_envs=1, backend="mjx")
    with pytest.raises(ValueError, match="device='meta'"):
        sim.make("reach", num_envs=1, backend="warp", device="meta")


def test_vla_preset_trains_on_the_warp_backend(tmp_path):
    """The VLA preset, shrunk, with `env.options.backend: warp`: demos, SFT, a GRPO step and held-out episodes."""
    import contextlib
    import io
    import math
    from pathlib import Path

    from mmrl.runtime.config import load_config
    from mmrl.trainer import train

    preset = Path(__file__).resolve().parents[2] / "configs" / "vla_reach_tiny.yaml"
    cfg = load_config(
        preset,
        [f"output_dir={tmp_path}", "env.options={image_size: 64, camera: ego, backend: warp}", "sft.episodes=4",
         "sft.steps=2", "sft.batch_size=8", "algo.group_size=2", "trainer.prompts_per_step=2",
         "trainer.total_steps=1", "trainer.eval_episodes=4", "trainer.eval_batch_size=4", "trainer.eval_every=0",
         "trainer.threads=1"],
    )  # fmt: skip
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        metrics = train(cfg)
    assert out.getvalue().splitlines()[-1].startswith("held-out success: ")
    row = next(m for m in metrics if "loss/policy" in m)
    assert math.isfinite(row["loss/policy"]) and row["env/episode_steps"] >= 1
