"""Environments: N batched worlds with image observations and text or continuous actions.

>>> import sim
>>> env = sim.make("grounding", num_envs=4, image_size=64)
>>> obs = env.reset(seed=0)
>>> obs.image.shape
torch.Size([4, 64, 64, 3])

`import sim` needs only torch, pillow and numpy; heavier simulators are imported inside their adapters.
"""

from __future__ import annotations

import inspect

from sim import driving, gui, render, robotics, tasks  # noqa: F401  (registers the built-in envs; simulators are imported lazily)
from sim.base import Observation, StepResult, VecEnv
from sim.check import check_vec_env
from sim.registry import ENVS

__all__ = ["ENVS", "Observation", "StepResult", "VecEnv", "check_vec_env", "make"]


def make(name: str, num_envs: int, **options) -> VecEnv:
    """Build the registered env `name` with `num_envs` worlds.

    Options are checked against the env's constructor before anything is built, so a typo fails at once and
    names the valid options instead of surfacing later as a confusing `TypeError`.

    Args:
        name: A name registered in `ENVS`, e.g. `"grounding"`.
        num_envs: N, the number of independent worlds.
        **options: Keyword arguments of the env's constructor (`image_size=64`, `device="cuda"`, ...).

    Returns:
        The env, holding N worlds; call `reset(seed=...)` before stepping it.

    Raises:
        KeyError: `name` is not registered.
        ValueError: An option is not a parameter of the env's constructor.
    """
    cls = ENVS.get(name)
    params = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    valid = [
        p_name
        for p_name, p in params.items()
        if p_name not in ("self", "num_envs")
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    if not takes_any:
        for key in options:
            if key not in valid:
                raise ValueError(f"unknown option {key!r} for env {name!r}; valid: {', '.join(valid)}")
    return cls(num_envs=num_envs, **options)
