"""The env registry and `make`, in their own tiny module so that task modules can register without importing `sim`.

`sim/__init__.py` imports `sim.tasks`, whose modules import `ENVS` from here; keeping `ENVS` out of
`sim/__init__.py` is what avoids the import cycle. `make` builds what is registered (`sim.make` is this one); the
built-in envs are registered once `sim` is imported, which any `sim.*` import does first.
"""

from __future__ import annotations

import inspect
from typing import Any

from rewards.registry import Registry

from .mix import MixedRewards

ENVS: Registry[type] = Registry("env")


def make(name: str, num_envs: int, rewards: list[dict[str, Any]] | None = None, **options) -> Any:
    """Build the registered env `name` with `num_envs` worlds.

    Options are checked against the env's constructor before anything is built, so a typo fails at once and
    names the valid options instead of surfacing later as a confusing `TypeError`.

    Args:
        name: A name registered in `ENVS`, e.g. `"grounding"`.
        num_envs: N, the number of independent worlds.
        rewards: A reward mix (`{name, weight, kwargs}` entries; `sim.mix`): the env comes wrapped in
            `MixedRewards`, its reward the weighted mix. None (or empty) leaves the env's own reward.
        **options: Keyword arguments of the env's constructor (`image_size=64`, `device="cuda"`, ...).

    Returns:
        The env, holding N worlds; call `reset(seed=...)` before stepping it.

    Raises:
        KeyError: `name` is not registered.
        ValueError: An option is not a parameter of the env's constructor.
    """
    cls = ENVS.get(name)
    valid, takes_any = constructor_options(cls)
    if not takes_any:
        for key in options:
            if key not in valid:
                raise ValueError(f"unknown option {key!r} for env {name!r}; valid: {', '.join(valid)}")
    env = cls(num_envs=num_envs, **options)
    if rewards:
        try:
            return MixedRewards(env, rewards)
        except Exception:
            env.close()
            raise
    return env


def constructor_options(cls: type) -> tuple[list[str], bool]:
    """The option names an env class takes, and whether it takes any name at all.

    A constructor that passes `**options` on to its parent's (the render envs) takes the parent's options too: the
    classes are walked up the MRO until a constructor without `**` ends the chain. Names starting with `_` are for
    subclasses, not users.
    """
    valid: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters
        for p_name, p in params.items():
            named = p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            if named and p_name not in ("self", "num_envs") and not p_name.startswith("_") and p_name not in valid:
                valid.append(p_name)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return valid, False
    return valid, True
