"""Every registered env keeps the VecEnv contract (MuJoCo Playground's all-envs test, Gymnasium's check_env)."""

import pytest

import sim
from sim import check_vec_env

# ManiSkill and LIBERO start one process per world (5-15 s each on this CPU, 2 GB for LIBERO);
# tests/sim/test_maniskill.py and tests/sim/test_libero.py run the same checks with fewer worlds, so the all-envs test
# leaves them out to keep the suite fast.
NAMES = [name for name in sim.ENVS.names() if name not in ("maniskill", "libero")]


def _skip_if_unavailable(name: str) -> None:
    """Skip an env that says it cannot run here (its class's `unavailable()` gives the reason: a browser env without
    the browser, see sim/gui/browser.py)."""
    unavailable = getattr(sim.ENVS.get(name), "unavailable", None)
    reason = unavailable() if unavailable is not None else None
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("name", NAMES)
def test_env_contract(name):
    _skip_if_unavailable(name)
    env = sim.make(name, num_envs=4)
    try:
        check_vec_env(env, seed=0)
    finally:
        env.close()


@pytest.mark.parametrize("name", NAMES)
def test_env_contract_with_one_world(name):
    _skip_if_unavailable(name)
    env = sim.make(name, num_envs=1)
    try:
        check_vec_env(env, seed=7)
    finally:
        env.close()
