"""The MuJoCo envs: contract, learnability (expert against random), what the camera sees, determinism, frozen ends."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

# MuJoCo picks its GL backend when first imported, and importorskip imports it: choose EGL first, as the envs do.
os.environ.setdefault("MUJOCO_GL", "egl")
pytest.importorskip("mujoco")
pytest.importorskip("gymnasium")

import sim  # noqa: E402
import sim.robotics  # noqa: E402, F401  (registers the envs even before sim/__init__ imports the package)
from sim import check_vec_env  # noqa: E402
from sim.robotics.planar import COLOURS  # noqa: E402
from sim.robotics.push import PushEnv  # noqa: E402
from sim.robotics.reach import ReachEnv  # noqa: E402


def _success_rate(env, policy, seed: int) -> float:
    """Share of N worlds, reset from `seed + k`, that succeed within `max_episode_steps` under `policy(env)`."""
    env.reset(seed=seed)
    succeeded = torch.zeros(env.num_envs, dtype=torch.bool)
    for _ in range(env.max_episode_steps):
        result = env.step(policy(env))
        succeeded |= result.info["success"]
        if (result.terminated | result.truncated).all():
            break
    return succeeded.float().mean().item()


def _uniform_policy(seed: int):
    generator = torch.Generator().manual_seed(seed)
    return lambda env: torch.rand(env.num_envs, env.action_dim, generator=generator) * 2 - 1  # [N, D] in [-1, 1)


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("reach", {}),
        ("reach", {"camera": ["ego", "top"]}),
        ("push", {"num_squares": 3}),
        ("gym_mujoco", {"env_id": "Reacher-v5"}),
        ("gym_mujoco", {"env_id": "Pusher-v5"}),
    ],
)
def test_contract(name, options):
    env = sim.make(name, num_envs=4, **options)
    try:
        check_vec_env(env, seed=0)
        assert env.action_kind == "continuous"
        assert env.action_low.dtype == env.action_high.dtype == torch.float32
        assert env.action_low.shape == env.action_high.shape == (env.action_dim,)
        result = env.step(torch.zeros(4, env.action_dim))
        assert result.info["success"].dtype == torch.bool
        assert all(v.dtype == torch.float32 and v.shape == (4,) for v in result.info["reward_components"].values())
        assert result.obs.state.dtype == torch.float32
    finally:
        env.close()


def test_import_does_not_load_mujoco():
    code = "import sys, sim, sim.robotics; assert 'mujoco' not in sys.modules and 'gymnasium' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_gl_backend_mujoco_cannot_load_is_an_import_error_that_names_it_and_the_fix():
    code = "from sim.robotics.planar import import_mujoco; import_mujoco()"
    env = {**os.environ, "MUJOCO_GL": "no_such_backend"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: mujoco could not load its GL backend MUJOCO_GL='no_such_backend'")
    assert "apt-get install libegl1" in last


def test_reach_expert_succeeds_and_random_rarely_does():
    env = ReachEnv(num_envs=100)
    expert = _success_rate(env, lambda e: e.expert_action(), seed=0)
    random = _success_rate(env, _uniform_policy(0), seed=0)
    print(f"reach over 100 seeds: expert {expert:.2f}, uniform random {random:.2f}")
    assert expert >= 0.95
    assert random <= 0.25 and expert - random >= 0.7
    env.close()


def test_reach_expert_is_fast_enough_for_a_short_horizon():
    env = ReachEnv(num_envs=50, max_episode_steps=6)  # the default is 8: two steps of slack
    assert _success_rate(env, lambda e: e.expert_action(), seed=100) == 1.0
    env.close()


def test_push_expert_succeeds_and_random_rarely_does():
    env = PushEnv(num_envs=50)
    expert = _success_rate(env, lambda e: e.expert_action(), seed=0)
    random = _success_rate(env, _uniform_policy(0), seed=0)
    print(f"push over 50 seeds: expert {expert:.2f}, uniform random {random:.2f}")
    assert expert >= 0.8
    assert random <= 0.2 and expert - random >= 0.6
    env.close()


def test_noisy_expert_needs_a_generator():
    env = ReachEnv(num_envs=2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="Generator"):
        env.expert_action(noise=0.1)
    a = env.expert_action(noise=0.1, generator=torch.Generator().manual_seed(3))
    b = env.expert_action(noise=0.1, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.abs().max() <= 1
    env.close()


# Dominant channels of each colour as rendered (RGB): a pixel is "that colour" when these comparisons hold.
def _looks(colour: str, pixel: np.ndarray) -> bool:
    r, g, b = (int(v) for v in pixel)
    return {
        "red": r > 150 and g < 100 and b < 100,
        "green": g > 100 and r < 100 and b < 100,
        "blue": b > 150 and r < 100 and g < 120,
        "yellow": r > 150 and g > 130 and b < 80,
    }[colour]


def test_camera_sees_targets_and_gripper_where_they_are():
    env = ReachEnv(num_envs=8, num_targets=4)
    obs = env.reset(seed=11)
    images = obs.image.numpy()  # [N, H, W, 3]
    for k in range(env.num_envs):
        discs = env._disc_xy[k]  # [K, 2]
        for (column, row), colour in zip(env.world_to_pixel(discs), env._disc_colour[k]):
            pixel = images[k, int(row), int(column)]
            assert _looks(COLOURS[colour], pixel), f"world {k}: {COLOURS[colour]} disc drawn as {pixel}"
        column, row = env.world_to_pixel(env.gripper_xy[k])
        assert images[k, int(row), int(column)].max() < 80  # the dark gripper
    # The instruction names the colour of the disc the state calls the target.
    for k, text in enumerate(obs.instruction):
        assert text == f"Move the gripper to the {env.target_colour[k]} target."
        assert torch.allclose(obs.state[k, 2:4], torch.from_numpy(env.target_xy[k]).float())
    env.close()


def test_egocentric_camera_keeps_the_gripper_centred_and_shows_the_targets_where_they_are():
    env = ReachEnv(num_envs=4, num_targets=4, image_size=64, camera="ego")
    obs = env.reset(seed=11)
    for _ in range(2):  # the view follows the gripper as it moves
        images = obs.image.numpy()  # [N, H, W, 3]
        for k in range(env.num_envs):
            assert images[k, 32, 32].max() < 80  # the dark gripper, always at the centre
            column, row = env.world_to_pixel(env.gripper_xy[k], world=k)
            assert abs(column - 32) < 1e-6 and abs(row - 32) < 1e-6
            for (column, row), colour in zip(env.world_to_pixel(env._disc_xy[k], world=k), env._disc_colour[k]):
                if 0 <= column < 64 and 0 <= row < 64:
                    assert _looks(COLOURS[colour], images[k, int(row), int(column)])
        obs = env.step(env.expert_action()).obs
    with pytest.raises(ValueError, match="world"):
        env.world_to_pixel(env.target_xy)
    with pytest.raises(ValueError, match="camera"):
        ReachEnv(num_envs=1, camera="side")
    env.close()


def test_push_shows_the_goal_square_in_its_colour():
    env = PushEnv(num_envs=4)
    obs = env.reset(seed=5)
    for k in range(env.num_envs):
        colour = obs.instruction[k].split()[-2]
        column, row = env.world_to_pixel(env.goal_xy[k])
        pixel = obs.image[k, int(row), int(column)].numpy()
        # The block may start on the goal's edge but never on its centre (they start 0.1 m or more apart).
        assert _looks(colour, pixel), f"world {k}: {colour} goal drawn as {pixel}"
    env.close()


def test_action_moves_the_gripper_by_action_scale_and_is_clipped():
    env = ReachEnv(num_envs=2)
    env.reset(seed=3)
    start = env.gripper_xy
    env.step(torch.tensor([[1.0, -0.5], [7.0, -100.0]]))  # the second row clips to [1, -1]
    moved = env.gripper_xy - start
    np.testing.assert_allclose(moved, [[0.05, -0.025], [0.05, -0.05]], atol=5e-4)
    # NaN reads as 0 (no motion), and the caller's tensor is left as it was.
    actions = torch.tensor([[float("nan"), 1.0], [0.0, 0.0]], dtype=torch.float64)
    start = env.gripper_xy
    env.step(actions)
    assert torch.isnan(actions[0, 0])
    np.testing.assert_allclose(env.gripper_xy - start, [[0.0, 0.05], [0.0, 0.0]], atol=5e-4)
    env.close()


def test_two_instances_give_identical_episodes():
    first, second = ReachEnv(num_envs=3), ReachEnv(num_envs=3)
    a, b = first.reset(seed=[4, 9, 4]), second.reset(seed=[4, 9, 4])
    assert torch.equal(a.image, b.image) and torch.equal(a.state, b.state) and a.instruction == b.instruction
    assert torch.equal(a.image[0], a.image[2])  # a GRPO group: the same seed, the same start
    for _ in range(3):
        actions = first.expert_action(noise=0.5, generator=torch.Generator().manual_seed(1))
        ra, rb = first.step(actions), second.step(actions.clone())
        assert torch.equal(ra.obs.image, rb.obs.image) and torch.equal(ra.reward, rb.reward)
    first.close()
    second.close()


def test_finished_worlds_are_frozen():
    env = ReachEnv(num_envs=2)
    env.reset(seed=0)
    for _ in range(env.max_episode_steps):
        result = env.step(torch.stack([env.expert_action()[0], torch.zeros(2)]))  # world 1 stands still
        if result.truncated[1]:
            break
    assert result.terminated[0] and result.info["success"][0]
    assert result.truncated[1] and not result.terminated[1] and not result.info["success"][1]
    again = env.step(torch.ones(2, 2))
    assert torch.equal(again.obs.image, result.obs.image) and torch.equal(again.obs.state, result.obs.state)
    assert torch.equal(again.reward, torch.zeros(2))
    assert all(torch.equal(v, torch.zeros(2)) for v in again.info["reward_components"].values())
    assert torch.equal(again.terminated, result.terminated) and torch.equal(again.truncated, result.truncated)
    assert torch.equal(again.info["success"], result.info["success"])
    env.close()


def test_dense_progress_sums_to_the_distance_covered_and_sparse_pays_success_only():
    dense, sparse = ReachEnv(num_envs=4, reward="dense"), ReachEnv(num_envs=4, reward="sparse")
    dense.reset(seed=20)
    sparse.reset(seed=20)
    start = np.linalg.norm(dense.target_xy - dense.gripper_xy, axis=1)  # [N]
    total = torch.zeros(4, dtype=torch.float64)
    for _ in range(3):
        actions = dense.expert_action()
        d, s = dense.step(actions), sparse.step(actions)
        torch.testing.assert_close(
            d.reward, d.info["reward_components"]["progress"] + d.info["reward_components"]["success"]
        )
        torch.testing.assert_close(s.reward, s.info["reward_components"]["success"])
        total += d.info["reward_components"]["progress"].double()
    end = np.linalg.norm(dense.target_xy - dense.gripper_xy, axis=1)
    np.testing.assert_allclose(total.numpy(), (start - end) / 0.4, atol=1e-5)
    dense.close()
    sparse.close()


def test_two_cameras_are_the_two_single_camera_views_in_order():
    both = sim.make("push", num_envs=2, camera=["top", "ego"], num_squares=3)
    top, ego = (sim.make("push", num_envs=2, camera=c, num_squares=3) for c in ("top", "ego"))
    try:
        for env in (both, top, ego):
            env.reset(seed=[3, 4])
        action = torch.tensor([[0.8, -0.3], [-1.0, 0.5]])
        results = [env.step(action) for env in (both, top, ego)]
        image = results[0].obs.image
        assert image.shape == (2, 2, 64, 64, 3) and torch.equal(results[0].obs.first_view, image[:, 0])
        assert torch.equal(image[:, 0], results[1].obs.image) and torch.equal(image[:, 1], results[2].obs.image)
        torch.testing.assert_close(results[0].reward, results[1].reward)  # the cameras change what is seen only
    finally:
        for env in (both, top, ego):
            env.close()


def test_bad_options_fail_early():
    with pytest.raises(ValueError, match="multiple of 32"):
        ReachEnv(num_envs=1, image_size=48)
    with pytest.raises(ValueError, match="num_targets"):
        ReachEnv(num_envs=1, num_targets=5)
    with pytest.raises(ValueError, match="reward"):
        PushEnv(num_envs=1, reward="shaped")
    with pytest.raises(ValueError, match="camera must be 'top', 'ego' or a list of distinct ones"):
        ReachEnv(num_envs=1, camera=["top", "top"])
    with pytest.raises(ValueError, match=r"several cameras \(\['top', 'ego'\]\) need backend='mujoco'"):
        ReachEnv(num_envs=1, camera=["top", "ego"], backend="warp")


def test_gym_reacher_success_rule_and_components():
    env = sim.make("gym_mujoco", num_envs=2, env_id="Reacher-v5", success_distance=10.0, terminate_on_success=True)
    obs = env.reset(seed=0)
    assert obs.instruction == ["Move the fingertip to the red target."] * 2 and obs.state.shape == (2, 10)
    result = env.step(torch.zeros(2, 2))
    assert result.info["success"].all() and result.terminated.all()  # everything is within 10 m
    assert {"dist", "ctrl", "success"} <= set(result.info["reward_components"])
    torch.testing.assert_close(
        result.reward, result.info["reward_components"]["dist"] + result.info["reward_components"]["ctrl"]
    )
    env.close()
    strict = sim.make("gym_mujoco", num_envs=8, env_id="Reacher-v5")
    strict.reset(seed=0)
    result = strict.step(torch.zeros(8, 2))
    # Reacher's success: fingertip within 0.02 m of the target, in the plane; the state's last two entries are
    # Gymnasium's fingertip - target (x, y).
    expected = result.obs.state[:, 8:10].norm(dim=1) < 0.02
    assert torch.equal(result.info["success"], expected)
    strict.close()
