"""The `libero` env: LIBERO's suites served from LIBERO's own environment (`make setup-libero`), by worker processes.

Every test skips, saying why, where that environment has not been built; `make setup-libero` fails loudly instead.
A world costs about 2 GB and 3-7 s to build, so these tests use two worlds, small images and `action_repeat`.
"""

import math

import pytest
import torch

import sim
from sim import check_vec_env
from sim.robotics.libero import LiberoEnv, libero_unavailable
from sim.seeds import EVAL_SEED_BASE

pytestmark = pytest.mark.skipif(libero_unavailable() is not None, reason=str(libero_unavailable()))


@pytest.fixture(scope="module")
def env():
    # One task: a world reset to another task rebuilds its simulator (3-7 s).
    env = sim.make("libero", num_envs=2, tasks=[0], image_size=32, action_repeat=4)
    yield env
    env.close()


def test_libero_keeps_the_contract(env):
    check_vec_env(env, seed=0)


def test_observation_is_two_cameras_and_the_task_language(env):
    obs = env.reset(seed=EVAL_SEED_BASE)
    assert obs.image.shape == (2, 2, 32, 32, 3) and obs.image.dtype == torch.uint8
    assert obs.instruction == [env.task_languages[0]] * 2
    assert obs.instruction[0].startswith("pick up the black bowl")
    assert obs.state.shape == (2, 11)
    assert env.max_episode_steps == 55  # the papers' 220 steps for libero_spatial, 4 physics steps per action
    # The wrist camera sees something else than the agent view, and neither is blank.
    assert not torch.equal(obs.image[:, 0], obs.image[:, 1])
    assert obs.image.float().std() > 10


def rodrigues(vector: torch.Tensor) -> torch.Tensor:
    """The rotation matrix `[3, 3]` of an axis-angle vector `[3]`: I + sin(a) K + (1 - cos(a)) K^2."""
    angle = float(vector.norm())
    x, y, z = (vector / angle).tolist()
    k = torch.tensor([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]], dtype=torch.float64)
    return torch.eye(3, dtype=torch.float64) + math.sin(angle) * k + (1 - math.cos(angle)) * k @ k


def axis_angle_by_hand(x: float, y: float, z: float, w: float) -> torch.Tensor:
    """Axis times angle of a unit quaternion, the angle 2 acos(w) with w's sign as given (robosuite's convention)."""
    return torch.tensor([x, y, z], dtype=torch.float64) * 2 * math.acos(w) / math.sqrt(1 - w * w)


def test_proprio_is_the_papers_8d_state_by_hand_from_the_sims_raw_state(env):
    # openpi's and RLinf's LIBERO state: eef position, robosuite's quat2axisangle of the eef quaternion, finger joints.
    # robosuite observes the arm one physics substep behind MuJoCo's data (the checkpoints were trained on its
    # observation), so against the raw data the match is as close as the arm is still.
    proprio = env.reset(seed=[EVAL_SEED_BASE, EVAL_SEED_BASE + 1]).proprio.double()
    assert proprio.shape == (2, 8)
    raw = env._worlds.call("raw_robot_state")
    moved = env.step(torch.tensor([[0.5, -0.5, 0.5, 0.2, -0.2, 0.2, 1.0]] * 2)).obs.proprio.double()
    raw_moved = env._worlds.call("raw_robot_state")
    assert (moved[:, :3] - proprio[:, :3]).norm(dim=1).gt(0.01).all()  # the arm moved
    for state, data, slack in ((proprio, raw, 1.0), (moved, raw_moved, 100.0)):
        for i in range(2):
            # Exactly robosuite's axis-angle of the quaternion it observed (x, y, z, w; w's sign as given).
            assert torch.allclose(state[i, 3:6], axis_angle_by_hand(*data["obs_quat_xyzw"][i].tolist()), atol=1e-5)
            w, x, y, z = data["body_quat_wxyz"][i].tolist()  # MuJoCo's own, in its order
            assert w < 0 or slack > 1  # at rest the gripper points down: the angle is just past pi (w's sign kept)
            assert torch.allclose(state[i, 3:6], axis_angle_by_hand(x, y, z, w), atol=2e-4 * slack)
            assert torch.allclose(state[i, :3], data["site_pos"][i], atol=3e-5 * slack)
            assert torch.allclose(state[i, 6:], data["finger_qpos"][i], atol=3e-5 * slack)
            # The axis-angle vector is the end effector's rotation: Rodrigues' formula gives back MuJoCo's matrix.
            assert torch.allclose(rodrigues(state[i, 3:6]), data["body_xmat"][i], atol=2e-4 * slack)
    assert proprio[:, 6].gt(0).all() and proprio[:, 7].lt(0).all()  # the fingers open symmetrically


def test_protocol_says_how_held_out_episodes_are_played(env):
    assert "not the papers' protocol" in env.protocol.lower()  # the fixture holds each action for 4 physics steps
    papers = LiberoEnv.__new__(LiberoEnv)  # the protocol's words only: no worlds needed
    papers.__dict__.update(suite="libero_10", tasks=[0, 1], _eval_states=list(range(50)), settle_steps=10,
                           max_episode_steps=520, action_repeat=1, replan_steps=5, cameras=("agentview", "wrist"),
                           image_size=224, image_transform="rot180")  # fmt: skip
    text = papers.protocol
    for part in ("fixed initial states 0-49", "10 settling steps with a no-op action", "520 physics steps",
                 "open-loop 5 action(s) at a time before replanning", "(rot180)", "The papers' protocol."):  # fmt: skip
        assert part in text, (part, text)


def test_seeds_map_to_the_benchmarks_fixed_initial_states(env):
    assert [env.episode(EVAL_SEED_BASE + i) for i in range(3)] == [(0, 0), (0, 1), (0, 2)]
    assert env.episode(EVAL_SEED_BASE + 50) == (0, 0)  # 50 states, then around again
    two = LiberoEnv.__new__(LiberoEnv)  # the mapping of two tasks (no worlds needed): tasks in turn, then states
    two.tasks, two._train_states, two._eval_states = [0, 1], list(range(50)), list(range(50))
    assert [two.episode(EVAL_SEED_BASE + i) for i in range(5)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]
    # The same initial state gives the same world in any worker; another state another world.
    a = env.reset(seed=[EVAL_SEED_BASE, EVAL_SEED_BASE])
    assert torch.equal(a.image[0], a.image[1]) and torch.equal(a.state[0], a.state[1])
    b = env.reset(seed=[EVAL_SEED_BASE + 1], env_ids=[0])  # initial state 1
    assert not torch.equal(a.state[0], b.state[0])


def test_holdout_keeps_the_last_states_for_evaluation():
    held = LiberoEnv.__new__(LiberoEnv)  # the mapping only: no worlds needed
    held.tasks, held._train_states, held._eval_states = [3], list(range(40)), list(range(40, 50))
    assert {held.episode(s)[1] for s in range(0, 1000)} == set(range(40))
    assert [held.episode(EVAL_SEED_BASE + i)[1] for i in range(12)] == [*range(40, 50), 40, 41]


def test_the_scripted_expert_solves_task_zero(env):
    env.reset(seed=EVAL_SEED_BASE)  # initial states 0 and 1
    success = torch.zeros(2, dtype=torch.bool)
    ended = torch.zeros(2, dtype=torch.bool)
    reward = torch.zeros(2)
    for _ in range(env.max_episode_steps):
        result = env.step(env.expert_action())
        reward += result.reward
        success |= result.info["success"]
        ended |= result.terminated | result.truncated
        if ended.all():
            break
    assert success.all(), success
    assert reward.tolist() == [1.0, 1.0]  # LIBERO's reward: 1 on the step that completes the task
    assert result.info["task"] == ["libero_spatial/0"] * 2
    frozen = env.step(torch.ones(2, 7))  # ended worlds ignore actions until reset
    assert frozen.reward.tolist() == [0.0, 0.0] and torch.equal(frozen.obs.image, result.obs.image)


def test_bad_options_name_the_option():
    with pytest.raises(ValueError, match="unknown LIBERO suite 'libero_nope'"):
        sim.make("libero", num_envs=1, suite="libero_nope")
    with pytest.raises(ValueError, match=r"tasks must be ids in \[0, 10\)"):
        sim.make("libero", num_envs=1, tasks=[12])
    with pytest.raises(ValueError, match="replan_steps must be an int >= 1"):
        sim.make("libero", num_envs=1, replan_steps=0)
    with pytest.raises(ValueError, match="image_transform must be 'upright' or 'rot180', got 'flip'"):
        sim.make("libero", num_envs=1, image_transform="flip")
