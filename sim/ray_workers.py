"""The pieces of `sim.workers.RayVecEnv` that are not the wrapper itself: the actor that holds a block of worlds,
Ray's start-up and shutdown helpers (also used by `mmrl.stages.rollout_workers`), and the one rule that merges the K
workers' results into one batch (see "Merging per-worker results" in `sim.workers`).

Ray is imported only by `init_ray`, when a wrapper or a rollout worker is built: importing this module does not.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import PurePath
from typing import Any

import numpy as np
import torch

from sim.base import Observation, StepResult
from sim.registry import ENVS, make

__all__ = ["init_ray", "kill_actor"]


@dataclass(frozen=True)
class GeneratorSeed:
    """Stands for a `torch.Generator` argument: the worker builds `torch.Generator().manual_seed(seed)`."""

    seed: int


@dataclass
class _EnvSpec:
    """What the wrapper knows of the wrapped env's public attributes (see the module docstring)."""

    values: dict[str, Any]  # constants, served locally
    properties: set[str]  # read live from every worker
    methods: set[str]  # forwarded through `call`
    remote_only: dict[str, str] = field(default_factory=dict)  # name -> why it is not forwarded


class Unmergeable(ValueError):
    """Per-worker values that are neither per-world nor equal; `where` names the offending entry."""

    def __init__(self, where: str):
        super().__init__(where)
        self.where = where


def _static_attr(env: Any, name: str) -> Any:
    """`inspect.getattr_static(env, name)`, looked up through wrappers that forward to `env.env` (`sim.mix`)."""
    while True:
        try:
            return inspect.getattr_static(env, name)
        except AttributeError:
            inner = inspect.getattr_static(env, "env", None)
            if inner is None or inner is env:
                raise
            env = inner


class EnvWorker:
    """The actor: one env holding a block of the worlds (a plain class; `RayVecEnv` wraps it with `ray.remote`).

    A constructor error is kept and raised by every call: an actor whose constructor raises is dead to Ray, and the
    wrapper would take a bad option for a dead worker and restart it in vain.
    """

    def __init__(self, env_cls: type, name: str, num_envs: int, options: dict[str, Any]):
        self._error: BaseException | None = None
        self.env: Any = None
        try:
            if name not in ENVS:  # registered by the caller outside `sim` (a script, a plugin, a test)
                ENVS.register(name)(env_cls)
            self.env = make(name, num_envs=num_envs, **options)
        except Exception as error:  # noqa: BLE001  (re-raised by the first call)
            self._error = error

    def _live_env(self) -> Any:
        if self._error is not None:
            raise self._error
        return self.env

    def ping(self) -> bool:
        self._live_env()
        return True

    def describe(self) -> dict[str, Any]:
        """The env's public attributes, sorted into constants, properties (not evaluated), methods and the rest."""
        env = self._live_env()
        values: dict[str, Any] = {}
        properties, methods, per_world, opaque = [], [], [], []
        for name in dir(env):
            if name.startswith("_"):
                continue
            static = _static_attr(env, name)
            if isinstance(static, (property, functools.cached_property)):
                properties.append(name)
                continue
            value = getattr(env, name)
            if callable(value):
                methods.append(name)
            elif isinstance(value, list) and len(value) == env.num_envs:
                per_world.append(name)
            elif _is_plain(value):
                values[name] = value
            else:
                opaque.append(name)
        return {
            "values": values,
            "properties": properties,
            "methods": methods,
            "per_world": per_world,
            "opaque": opaque,
        }

    def reset(self, seeds: list[int], env_ids: list[int]) -> Observation:
        return self._live_env().reset(seed=seeds, env_ids=env_ids)

    def step(self, actions: list[str] | torch.Tensor) -> StepResult:
        return self._live_env().step(actions)

    def call(self, name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        """`env.name(*args, **kwargs)`, or the value of attribute `name` when it is not callable (and no args)."""
        env = self._live_env()
        args = tuple(_as_generator(a) for a in args)
        kwargs = {key: _as_generator(value) for key, value in kwargs.items()}
        attr = getattr(env, name)
        if callable(attr):
            return attr(*args, **kwargs)
        if args or kwargs:
            raise TypeError(f"{type(env).__name__}.{name} is not callable; it takes no arguments")
        return attr

    def close(self) -> None:
        if self.env is not None:
            self.env.close()


def init_ray(address: str | None, num_cpus: int, user: str = "RayVecEnv") -> Any:
    """Import Ray and start (or join) a cluster unless this process is connected to one already.

    Also used by `mmrl.stages.rollout_workers`; `user` names the caller in the error when Ray is not installed.
    """
    try:
        import ray
    except ImportError as error:
        raise ImportError(f"{user} needs Ray: pip install 'mmrl[ray]' (or run it in-process)") from error
    if not ray.is_initialized():
        # RAY_ADDRESS (Ray's own convention) joins an existing cluster, as `address=` does: e.g. the head node of a
        # multi-machine cluster started with `ray start`.
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address is None:
            ray.init(ignore_reinit_error=True, include_dashboard=False, num_cpus=num_cpus, log_to_driver=False)
        else:
            ray.init(address=address, ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
    return ray


def kill_actor(ray: Any, actor: Any) -> None:
    """End a Ray actor for good; quiet when it is already dead."""
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001  (already dead, or Ray is shutting down: nothing left to end)
        pass


def _as_generator(value: Any) -> Any:
    return torch.Generator().manual_seed(value.seed) if isinstance(value, GeneratorSeed) else value


_PLAIN_SCALARS = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    torch.device,
    torch.dtype,
    np.generic,
    PurePath,
    Enum,
)


def _is_plain(value: Any) -> bool:
    """Whether `value` is data that travels between processes as it is (no handles, models or renderers)."""
    if isinstance(value, _PLAIN_SCALARS + (torch.Tensor, np.ndarray)):
        return True
    if isinstance(value, (tuple, list, frozenset)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_is_plain(k) and _is_plain(v) for k, v in value.items())
    return False


def env_spec(described: list[dict[str, Any]], device: torch.device | None) -> _EnvSpec:
    """The wrapper's view of the env from every worker's `describe()`.

    A plain value that differs between workers is state, not a constant: it is not served (`remote_only`).
    """
    first = described[0]
    values: dict[str, Any] = {}
    remote_only = {name: "one entry per world" for name in first["per_world"]}
    remote_only.update({name: "not plain data" for name in first["opaque"]})
    for name, value in first["values"].items():
        if name == "num_envs":
            continue  # the wrapper's own N
        if all(name in d["values"] and _equal(d["values"][name], value) for d in described[1:]):
            values[name] = value
        else:
            remote_only[name] = "differs between workers"
    if device is not None and "device" in values:
        values["device"] = device  # the workers build on the CPU; results are moved to `device`
    return _EnvSpec(values, set(first["properties"]), set(first["methods"]), remote_only)


def _equal(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[key], b[key]) for key in a)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001  (ambiguous comparisons count as different)
        return False


def merge_parts(parts: list[Any], sizes: list[int], where: str) -> Any:
    """Merge one value per worker (worker k holds `sizes[k]` worlds) by the rule of the module docstring.

    Raises:
        Unmergeable: The values are neither per-world nor all equal; `where` (extended for nested entries) names it.
    """
    first = parts[0]
    if all(isinstance(p, torch.Tensor) and p.dim() >= 1 and p.shape[0] == n for p, n in zip(parts, sizes)):
        return torch.cat(parts)  # always a fresh tensor, never a view of what the workers sent
    if all(isinstance(p, np.ndarray) and p.ndim >= 1 and p.shape[0] == n for p, n in zip(parts, sizes)):
        return np.concatenate(parts)
    if all(isinstance(p, list) and len(p) == n for p, n in zip(parts, sizes)):
        return [x for p in parts for x in p]
    if all(isinstance(p, dict) for p in parts):
        return merge_dict(parts, sizes, where, None)
    if dataclasses.is_dataclass(first) and not isinstance(first, type) and all(type(p) is type(first) for p in parts):
        fields = {
            f.name: merge_parts([getattr(p, f.name) for p in parts], sizes, f"{where}.{f.name}")
            for f in dataclasses.fields(first)
            if f.init
        }
        return type(first)(**fields)
    if all(type(p) is tuple and len(p) == len(first) for p in parts):
        return tuple(merge_parts([p[j] for p in parts], sizes, f"{where}[{j}]") for j in range(len(first)))
    if all(_equal(p, first) for p in parts[1:]):
        return map_tensors(first, torch.clone)  # a copy: deserialised tensors may sit in Ray's shared memory
    raise Unmergeable(where)


def merge_dict(parts: list[dict[str, Any]], sizes: list[int], where: str, dropped: list[str] | None) -> dict:
    """Merge dicts per key. With `dropped`, entries that do not merge are left out and listed there; else raise."""
    merged = {}
    for key in parts[0]:
        path = f"{where}[{key!r}]"
        try:
            if not all(key in p for p in parts):
                raise Unmergeable(path)
            values = [p[key] for p in parts]
            if dropped is not None and all(isinstance(v, dict) for v in values):
                merged[key] = merge_dict(values, sizes, path, dropped)
            else:
                merged[key] = merge_parts(values, sizes, path)
        except Unmergeable as error:
            if dropped is None:
                raise
            dropped.append(error.where)
    if dropped is None:
        extra = [key for p in parts[1:] for key in p if key not in parts[0]]
        if extra:
            raise Unmergeable(f"{where}[{extra[0]!r}]")
    else:
        dropped.extend(f"{where}[{key!r}]" for p in parts[1:] for key in p if key not in parts[0])
    return merged


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`value` with `fn` applied to every tensor in it (through dicts, lists, tuples and dataclasses)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {key: map_tensors(v, fn) for key, v in value.items()}
    if isinstance(value, list):
        return [map_tensors(v, fn) for v in value]
    if type(value) is tuple:
        return tuple(map_tensors(v, fn) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(
            value, **{f.name: map_tensors(getattr(value, f.name), fn) for f in dataclasses.fields(value) if f.init}
        )
    return value
