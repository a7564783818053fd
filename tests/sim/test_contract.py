"""Every registered env keeps the VecEnv contract (MuJoCo Playground's all-envs test, Gymnasium's check_env)."""

import pytest

import sim
from sim import check_vec_env
from sim.registry import constructor_options, env_defaults

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


@pytest.mark.parametrize("name", sim.ENVS.names())
def test_env_class_declares_what_mmrl_envs_lists(name):
    # `mmrl envs` lists these without building anything; each is a real value or the option it depends on.
    cls = sim.ENVS.get(name)
    listed = env_defaults(cls)
    options, _ = constructor_options(cls)
    assert listed.action_kind in ("text", "continuous")
    for value in (listed.image_size, listed.max_episode_steps):
        assert (isinstance(value, int) and value >= 1) or value in options, (value, options)


# The envs that build in well under a second here (no sandbox, browser or simulator processes).
CHEAP = ("dataset", "grounding", "gui_click", "gui_task", "highway", "jigsaw", "maze", "push", "reach",
         "shape_questions")  # fmt: skip


@pytest.mark.parametrize("name", CHEAP)
def test_listed_defaults_are_what_a_built_env_has(name):
    listed = env_defaults(sim.ENVS.get(name))
    env = sim.make(name, num_envs=1)
    try:
        obs = env.reset(seed=0)
        assert env.action_kind == listed.action_kind
        assert tuple(obs.image.shape[-3:-1]) == (listed.image_size, listed.image_size)
        assert env.max_episode_steps == listed.max_episode_steps
    finally:
        env.close()
