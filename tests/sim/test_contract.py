"""Every registered env keeps the VecEnv contract (MuJoCo Playground's all-envs test, Gymnasium's check_env)."""

import pytest

import sim
from sim import check_vec_env


@pytest.mark.parametrize("name", sim.ENVS.names())
def test_env_contract(name):
    env = sim.make(name, num_envs=4)
    try:
        check_vec_env(env, seed=0)
    finally:
        env.close()


@pytest.mark.parametrize("name", sim.ENVS.names())
def test_env_contract_with_one_world(name):
    env = sim.make(name, num_envs=1)
    try:
        check_vec_env(env, seed=7)
    finally:
        env.close()
