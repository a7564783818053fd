"""The env registry and `make`, in their own tiny module so that task modules can register without importing `sim`.

`sim/__init__.py` imports `sim.tasks`, whose modules import `ENVS` from here; keeping `ENVS` out of
`sim/__init__.py` is what avoids the import cycle. `make` builds what is registered (`sim.make` is this one); the
built-in envs are registered once `sim` is imported, which any `sim.*` import does first.
"""

from __future__ import annotations

import collections.abc
import inspect
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rewards.registry import Registry

from .errors import InputError
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
        InputError: `name` is not registered, an option is not a parameter of the env's constructor, its value
            does not fit the parameter's annotation (`option_problem`), or the constructor refuses a value with a
            `ValueError` (every env checks its options so: the error is re-raised as an `InputError` naming the env).
    """
    try:
        cls = ENVS.get(name)
    except KeyError as error:
        raise InputError(error.args[0]) from None
    valid, takes_any = constructor_options(cls)
    for key, value in options.items():
        if not takes_any and key not in valid:
            raise InputError(f"unknown option {key!r} for env {name!r}; valid: {', '.join(valid)}")
        problem = option_problem(cls, key, value)
        if problem is not None:
            raise InputError(f"option {key!r} of env {name!r}: {problem}")
    try:
        env = cls(num_envs=num_envs, **options)
    except InputError:
        raise
    except ValueError as error:  # an env's own check of its option values, by the project's convention
        raise InputError(f"env {name!r}: {error}") from error
    if rewards:
        try:
            return MixedRewards(env, rewards)
        except Exception:
            env.close()
            raise
    return env


@dataclass(frozen=True)
class EnvDefaults:
    """What an env class does when no option says otherwise, read from the class without building an env.

    Each value is a number (or an action kind), or the name of the constructor option it depends on (LIBERO's
    episode length is its `"suite"`'s); None where the class declares nothing (a class registered from outside that
    does not follow the convention of `env_defaults`).
    """

    action_kind: str | None  # "text" or "continuous"
    image_size: int | str | None  # H = W, pixels
    max_episode_steps: int | str | None


def env_defaults(cls: type) -> EnvDefaults:
    """The action kind, image size and episode length an env class has by default (what `mmrl envs` lists).

    Read from the class, because building an env may start a simulator, a browser or worker processes. Where each
    value comes from, the first found winning:

    * action kind: the class attribute `action_kind` (the `VecEnv` contract's; an env whose kind is an option
      declares its default's);
    * image size: the default of the constructor option `image_size`, looked up the constructor chain as
      `constructor_options` walks it (a task that passes `**options` on takes its parent's default); where that is
      None, the class attribute `image_size` (the render envs' size per kind);
    * episode length: the default of `max_episode_steps` likewise, or the class attribute `max_episode_steps` where
      no constructor takes one (the single-step envs' 1); where the default is None, the class attribute
      `default_max_episode_steps`: the task's number, or the name of the option the simulator's limit comes from.
    """
    defaults = constructor_defaults(cls)

    def value(option: str, fallback: str) -> Any:
        found = defaults.get(option, getattr(cls, option, None))
        return getattr(cls, fallback, None) if found is None else found

    kind = getattr(cls, "action_kind", None)
    return EnvDefaults(
        action_kind=kind if isinstance(kind, str) else None,
        image_size=value("image_size", "image_size"),
        max_episode_steps=value("max_episode_steps", "default_max_episode_steps"),
    )


def constructor_defaults(cls: type) -> dict[str, Any]:
    """`{option: default}` of the options an env class takes that have a default, the subclass's first.

    The same constructor chain as `constructor_options`: up the MRO while each constructor passes `**options` on.
    """
    found: dict[str, Any] = {}
    for params in _constructor_chain(cls):
        for p_name, p in params.items():
            if p.default is not inspect.Parameter.empty:
                found.setdefault(p_name, p.default)
    return found


def _constructor_chain(cls: type) -> list[Mapping[str, inspect.Parameter]]:
    """The parameters of each constructor an env's options reach: the class's own, then its parents' while each
    passes `**options` on; the last in the list has no `**`, or the chain ran out of classes."""
    chain = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters
        chain.append(params)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            break
    return chain


def constructor_options(cls: type) -> tuple[list[str], bool]:
    """The option names an env class takes, and whether it takes any name at all.

    A constructor that passes `**options` on to its parent's (the render envs) takes the parent's options too: the
    classes are walked up the MRO until a constructor without `**` ends the chain. Names starting with `_` are for
    subclasses, not users.
    """
    valid: list[str] = []
    chain = _constructor_chain(cls)
    for params in chain:
        for p_name, p in params.items():
            named = p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            if named and p_name not in ("self", "num_envs") and not p_name.startswith("_") and p_name not in valid:
                valid.append(p_name)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in chain[-1].values())  # `object`'s ends a chain
    return valid, takes_any


def option_types(cls: type) -> dict[str, Any]:
    """`{option: annotation}` of the options an env class takes, resolved, along the chain `constructor_options`
    walks (the subclass's first). A constructor whose annotations do not resolve contributes none: its options are
    then not type-checked."""
    found: dict[str, Any] = {}
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        init = vars(klass)["__init__"]
        try:
            hints = typing.get_type_hints(init)
        except Exception:  # a name only imported for type checkers: leave those options unchecked
            hints = {}
        for key, tp in hints.items():
            if key != "return":
                found.setdefault(key, tp)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            break
    return found


def option_problem(cls: type, key: str, value: Any) -> str | None:
    """What is wrong with passing `key=value` to env class `cls` (None if nothing): an unknown option, naming the
    valid ones, or a value that does not fit the constructor's annotation, naming the expected type.

    Values are checked as a config gives them (YAML scalars, lists, mappings): `bool`, `int` (not a bool), `float`
    (an int too), `str`, `Literal` choices, unions and optionals, lists/sequences (and their items), mappings;
    annotations of other types (a class, a callable) are not checked. A default of None is accepted whatever the
    annotation says (an option left at its default).
    """
    valid, takes_any = constructor_options(cls)
    if key not in valid:
        return None if takes_any else f"unknown option; valid: {', '.join(valid)}"
    tp = option_types(cls).get(key)
    if tp is None or _fits(value, tp) or (value is None and constructor_defaults(cls).get(key, 0) is None):
        return None
    return f"expected {_describe(tp)}, got {value!r}"


def _fits(value: Any, tp: Any) -> bool:
    """Whether `value` fits the annotation `tp`; True where the annotation is of a kind not checked."""
    if tp is Any:
        return True
    if tp is type(None) or tp is None:
        return value is None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return any(value == choice and type(value) is type(choice) for choice in args)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if origin is os.PathLike or tp is os.PathLike:
        return isinstance(value, os.PathLike)
    if origin in (list, tuple, collections.abc.Sequence) or tp in (list, tuple):
        if not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args))
        return not args or all(_fits(v, args[0]) for v in value)
    if origin in (dict, collections.abc.Mapping) or tp in (dict, collections.abc.Mapping):
        if not isinstance(value, Mapping):
            return False
        return not args or all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
    return True


def _describe(tp: Any) -> str:
    """An annotation in words: "an integer", "one of 'a', 'b'", "a number or null"."""
    if tp is type(None) or tp is None:
        return "null"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(choice) for choice in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(_describe(arg) for arg in args))
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if tp in words:
        return words[tp]
    if origin is os.PathLike or tp is os.PathLike:
        return "a path"
    if origin in (list, tuple, collections.abc.Sequence) or tp in (list, tuple):
        return f"a list (items: {_describe(args[0])})" if args else "a list"
    if origin in (dict, collections.abc.Mapping) or tp in (dict, collections.abc.Mapping):
        return "a mapping"
    return getattr(tp, "__name__", repr(tp))
