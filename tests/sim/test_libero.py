"""The `libero` env: LIBERO's suites served from LIBERO's own environment (`make setup-libero`), by worker processes.

Every test skips, saying why, where that environment has not been built; `make setup-libero` fails loudly instead.
A world costs about 2 GB and 3-7 s to build, so these tests use two worlds, small images and `action_repeat`.
"""

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
