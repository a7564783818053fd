"""One `VecEnv` whose N worlds live in K Ray actors: simulators and renderers in parallel processes, or on other machines.

>>> env = RayVecEnv("reach", num_envs=8, workers=2)  # worlds 0-3 in actor 0, worlds 4-7 in actor 1
>>> obs = env.reset(seed=0)  # both actors reset in parallel; obs holds all 8 worlds in world order
>>> result = env.step(env.expert_action())
>>> env.close()

**Layout.** Worker k holds a contiguous block of worlds, `worker_worlds[k]` (sizes differ by at most one), as
`sim.make(name, num_envs=n_k, **options)` built inside the actor, so any registered env works. The env class is
resolved here and shipped to the actors (by reference for classes in importable modules, by value for `__main__`),
so envs registered outside `sim` (a user's script, a test module) are found there too. `reset` sends each reset world
to its worker with its own seed (`seed + k` per reset world, as in-process) and only calls the workers that hold
one; `step` splits the actions by worker. The calls to the K actors run concurrently, so a step costs about the
slowest worker's share plus a round trip. The observation of a worker that a partial reset did not touch is the one
it returned last (the contract says its worlds did not change).

**Results equal the in-process env's** for the same seeds and actions, as long as each world depends on its own seed
and actions only (the contract's promise): the same image, reward, terminated, truncated and info in world order.

**Merging per-worker results** (steps, `call`, properties), one rule everywhere: a tensor or array whose leading dim is
the worker's world count n_k, or a list of length n_k, is per-world and is concatenated in world order; a dict is
merged per key; a tuple element-wise; a dataclass (`Observation`, `StepResult`) field by field. Anything else (a
scalar, a string, a tensor of another shape) is kept when every worker returned the same value. In `step`'s `info`,
an entry that fits neither (values that differ between workers, or a key that only some workers return) is dropped,
with one warning per key; in `call` it raises `ValueError`. Caveat of the rule: a tensor whose leading dim happens to
equal n_k on every worker (say a `[2]` constant with 2 worlds per worker) reads as per-world.

**Attributes of the wrapped env.** `num_envs` is N; `action_kind`, `max_episode_steps` and every other public plain
attribute (numbers, strings, devices, tensors and arrays such as `action_low`, `action_high`, `action_dim`,
`image_size`) are read once from the workers at start-up and served locally (a copy on each access). Properties (such
as `target_boxes`, `target_xy`) are read live from every worker and merged, and methods (such as `expert_action`,
`world_to_pixel`) go through `call`. Lists of one entry per world (such as `scenes`, `datas`) and objects that cannot
travel between processes (MuJoCo models, renderers) stay in the workers: reading them raises `AttributeError` saying
so.

**Randomness in calls.** A `torch.Generator` passed to `call` is replaced by one generator per worker, seeded from
draws of the caller's generator: reproducible for a given caller generator, but not the same numbers as in-process.
`expert_action(noise, generator)` of a continuous env instead asks the workers for the noiseless action and adds
`noise * N(0, 1)` drawn from the caller's generator as one `[N, D]` draw, clipped to `[action_low, action_high]`:
the in-process result of envs that perturb their expert that way (`reach`, `push`), bit for bit.

**Dead and hung workers.** Every wait on a worker has a time limit (`timeout_s`; `start_timeout_s` while an actor is
being created and builds its env), so a rollout never hangs. A worker whose actor died (`RayActorError`: process
killed, out of memory, node lost) or that did not answer in time (its actor is then killed) is replaced by a new
actor for the same worlds, which replays each world's episode so far: reset with the world's last seed, then the
actions stepped since (recorded here, per world; a world whose episode started later is reset again until it starts,
so every world gets exactly its own history). Deterministic envs end up in the same state, and the failed call is
retried. Each restart is a `RuntimeWarning` and is counted in `restarts`. A worker that fails `max_restarts + 1`
times in a row (in one call: the count resets when a call to it succeeds) raises a `RuntimeError` naming the worker,
its worlds, the env and the last cause; its actor is killed, and a later call starts it afresh, with a replay. State changed by `call` (a method that mutates worlds) is not replayed, and an
exception raised by the env itself (a bad action, stepping an ended world) is not a dead worker: it propagates as
Ray's `RayTaskError`, which is also an instance of the original exception class.

**Ray.** `import sim` and `import sim.workers` do not import Ray: it is imported when a `RayVecEnv` is built. If Ray
is not initialised yet, this starts a local cluster with `ray.init(ignore_reinit_error=True, include_dashboard=False,
num_cpus=max(os.cpu_count(), ceil(workers * cpus_per_worker)), log_to_driver=False)`: worker output (prints,
warnings) stays in Ray's log files under /tmp/ray; errors still arrive as exceptions. `address="auto"` (or
`"ray://host:10001"`) joins an existing cluster instead. An application that calls `ray.init` itself keeps its
settings. `close()` ends this env's actors but leaves Ray running (`ray.shutdown()` is the application's).
"""

from __future__ import annotations

import copy
import functools
import math
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from sim.base import ActionKind, Observation, StepResult, resolve_env_ids, resolve_seeds
from sim.ray_workers import (
    EnvWorker,
    GeneratorSeed,
    Unmergeable,
    env_spec,
    init_ray,
    kill_actor,
    map_tensors,
    merge_dict,
    merge_parts,
)
from sim.registry import ENVS, make

__all__ = ["RayVecEnv", "init_ray", "kill_actor", "make_vec_env"]

_SEED_HIGH = 2**62  # per-worker generator seeds are drawn in [0, 2**62) from the caller's generator
_CLOSE_TIMEOUT_S = 10.0  # a worker gets this long to close its env cleanly before its actor is killed


def make_vec_env(name: str, num_envs: int, workers: int = 0, timeout_s: float = 120.0, **options) -> Any:
    """`sim.make(name, num_envs, **options)` when `workers == 0`, else a `RayVecEnv` with that many actors.

    Args:
        name: A name registered in `sim.ENVS`.
        num_envs: N, the number of worlds.
        workers: K Ray actors to spread the worlds over; 0 keeps every world in this process (no Ray).
        timeout_s: Seconds a worker may take to answer one call (`RayVecEnv` only).
        **options: The env's constructor options, plus `RayVecEnv`'s keyword options when `workers > 0`.

    Returns:
        A `VecEnv` holding N worlds.
    """
    if workers < 0:
        raise ValueError(f"workers must be >= 0 (0: in-process), got {workers}")
    if workers == 0:
        return make(name, num_envs=num_envs, **options)
    return RayVecEnv(name, num_envs, workers=workers, timeout_s=timeout_s, **options)


class RayVecEnv:
    """N worlds of the registered env `name`, split over K Ray actors (see the module docstring).

    Args:
        name: A name registered in `sim.ENVS` (in this process; see the module docstring).
        num_envs: N, the number of worlds.
        workers: K, the number of actors, 1 <= K <= N. Worker k holds worlds `worker_worlds[k]`.
        timeout_s: Seconds a worker may take to answer one call (a reset, a step, a `call`); a worker that takes
            longer is taken for hung, killed and restarted.
        max_restarts: Restarts of one worker in a row (within one call) before giving up with a `RuntimeError`.
        start_timeout_s: Seconds an actor may take to start and build its env (importing torch and a simulator
            takes seconds); None: `max(timeout_s, 120)`.
        cpus_per_worker: Ray CPUs each actor reserves (fractional: two 0.5-CPU actors fit on one core).
        address: Ray cluster to join when Ray is not initialised yet (`"auto"`, `"ray://host:10001"`); None
            starts a local one. Ignored when Ray is already initialised.
        device: Where the returned tensors live. Envs are built with `device="cpu"` in the workers, whose actors
            reserve no GPU; the results are moved here. None: the env's own default.
        **options: Constructor options of the env (`image_size=64`, ...), checked by `sim.make` in the workers.

    Raises:
        KeyError: `name` is not registered.
        ValueError: A bad option of the wrapper or of the env (the env's error comes from the first worker), or a
            Ray cluster with fewer CPUs than `workers * cpus_per_worker`.
    """

    def __init__(
        self,
        name: str,
        num_envs: int,
        workers: int,
        timeout_s: float = 120.0,
        max_restarts: int = 3,
        *,
        start_timeout_s: float | None = None,
        cpus_per_worker: float = 0.5,
        address: str | None = None,
        device: str | torch.device | None = None,
        **options,
    ):
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        if not isinstance(workers, int) or not 1 <= workers <= num_envs:
            raise ValueError(
                f"workers must be an int in [1, num_envs={num_envs}], got {workers!r} "
                "(for in-process worlds use sim.make, or make_vec_env with workers=0)"
            )
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
        if cpus_per_worker <= 0:
            raise ValueError(f"cpus_per_worker must be > 0, got {cpus_per_worker}")
        env_cls = ENVS.get(name)  # fails here, naming the registered envs, rather than in every worker

        self.name = name
        self.num_envs = num_envs
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s) if start_timeout_s is not None else max(self.timeout_s, 120.0)
        self.max_restarts = max_restarts
        self.cpus_per_worker = float(cpus_per_worker)
        self.restarts = 0  # actors replaced so far, over all workers
        # Contiguous blocks, the first N % K one world larger: world i lives in worker _owner[i] at _local[i].
        base, extra = divmod(num_envs, workers)
        sizes = [base + (k < extra) for k in range(workers)]
        starts = np.cumsum([0, *sizes]).tolist()
        self.worker_worlds: tuple[range, ...] = tuple(range(starts[k], starts[k + 1]) for k in range(workers))
        self._owner = [k for k, worlds in enumerate(self.worker_worlds) for _ in worlds]
        self._local = [j for worlds in self.worker_worlds for j in range(len(worlds))]
        self._device = None if device is None else torch.device(device)
        if self._device is not None:
            options["device"] = "cpu"
        self._env_cls = env_cls
        self._options = options
        # Episode records for replay: the seed of each world's last reset (None: never reset) and actions since.
        self._seeds: list[int | None] = [None] * num_envs
        self._actions: list[list[Any]] = [[] for _ in range(num_envs)]
        self._obs: list[Observation | None] = [None] * workers  # each worker's last observation
        self._failures = [0] * workers  # failures in a row, per worker
        self._dropped_info: set[str] = set()  # info entries already warned about
        self._closed = False

        ray = self._ray = init_ray(address, max(os.cpu_count() or 1, math.ceil(workers * cpus_per_worker)))
        exc = ray.exceptions
        # A dead actor, a crashed worker process, a lost node or result, a process killed for memory, or a timeout.
        self._failure_types: tuple[type[BaseException], ...] = (
            exc.RayActorError,
            exc.WorkerCrashedError,
            exc.NodeDiedError,
            exc.ObjectLostError,
            exc.OutOfMemoryError,
            exc.GetTimeoutError,
        )
        total_cpus = ray.cluster_resources().get("CPU", 0.0)
        if total_cpus < workers * cpus_per_worker:
            # Actors that cannot be placed would wait forever; say so now rather than time out later.
            raise ValueError(
                f"the Ray cluster has {total_cpus:g} CPUs, fewer than workers * cpus_per_worker = "
                f"{workers} * {cpus_per_worker:g}; lower cpus_per_worker or start Ray with more num_cpus"
            )
        # Ray's own actor restart would rebuild the env without the episode replay, so it stays off.
        self._actor_cls = ray.remote(num_cpus=cpus_per_worker, max_restarts=0, max_task_retries=0)(EnvWorker)
        self._actors: list[Any] = [self._new_actor(k) for k in range(workers)]
        try:
            described = self._run("describe", {k: () for k in range(workers)}, timeout=self.start_timeout_s)
            self._spec = env_spec([described[k] for k in range(workers)], self._device)
            for required in ("action_kind", "max_episode_steps"):
                if required not in self._spec.values:
                    raise ValueError(f"env {name!r} exposes no {required}; it does not implement the VecEnv contract")
        except BaseException:
            self.close()
            raise
        self.action_kind: ActionKind = self._spec.values["action_kind"]
        self.max_episode_steps: int = self._spec.values["max_episode_steps"]

    def __repr__(self) -> str:
        return f"RayVecEnv({self.name!r}, num_envs={self.num_envs}, workers={len(self.worker_worlds)})"

    @property
    def actors(self) -> list[Any]:
        """The Ray actor handles, worker k at index k (to monitor them, or to kill one in a test)."""
        return list(self._actors)

    # ------------------------------------------------------------------------------------------------ contract
    def reset(self, seed: int | Sequence[int], env_ids: Sequence[int] | None = None) -> Observation:
        """Reset the worlds `env_ids` (all when None), each in its worker; only those workers are called.

        Args:
            seed: One seed per reset world, or an int from which world k of `env_ids` gets `seed + k`.
            env_ids: Indices of the worlds to reset; None resets all N.

        Returns:
            The observation of all N worlds in world order (fresh tensors): image `[N, H, W, 3]` uint8, N
            instructions, and state `[N, S]` where the env has one.
        """
        self._check_open()
        ids = resolve_env_ids(env_ids, self.num_envs)
        seeds = resolve_seeds(seed, len(ids))
        calls: dict[int, tuple[list[int], list[int]]] = {}
        for i, world_seed in zip(ids, seeds):
            world_seeds, local_ids = calls.setdefault(self._owner[i], ([], []))
            world_seeds.append(world_seed)
            local_ids.append(self._local[i])
        # Workers never called yet have no observation to reuse: an empty reset returns their current one.
        for k, obs in enumerate(self._obs):
            if obs is None:
                calls.setdefault(k, ([], []))

        def record(k: int, obs: Observation) -> None:
            self._obs[k] = obs
            world_seeds, local_ids = calls[k]
            for world_seed, j in zip(world_seeds, local_ids):
                i = self.worker_worlds[k][j]
                self._seeds[i] = world_seed
                self._actions[i] = []

        self._run("reset", calls, on_result=record)
        return self._to_device(self._merge_observations())

    def step(self, actions: list[str] | torch.Tensor) -> StepResult:
        """Step every world, each worker its block of the actions, concurrently.

        Args:
            actions: N strings for text envs, a `[N, D]` tensor for continuous ones.

        Returns:
            The StepResult of all N worlds in world order: reward, terminated, truncated `[N]`, the observation and
            `info` merged as the module docstring says.

        Raises:
            ValueError: `actions` does not hold N entries.
            RuntimeError: A worker failed more than `max_restarts` times in a row.
        """
        self._check_open()
        chunks = self._split_actions(actions)

        def record(k: int, result: StepResult) -> None:
            self._obs[k] = result.obs
            for j, i in enumerate(self.worker_worlds[k]):
                self._actions[i].append(chunks[k][j])

        results = self._run("step", {k: (chunk,) for k, chunk in enumerate(chunks)}, on_result=record)
        parts = [results[k] for k in range(len(self._actors))]
        sizes = self._sizes()
        merged = StepResult(
            obs=self._merge_observations(),
            reward=merge_parts([p.reward for p in parts], sizes, "reward"),
            terminated=merge_parts([p.terminated for p in parts], sizes, "terminated"),
            truncated=merge_parts([p.truncated for p in parts], sizes, "truncated"),
            info=self._merge_info([p.info for p in parts], sizes),
        )
        return self._to_device(merged)

    def close(self) -> None:
        """Close each worker's env (briefly waited for), then kill the actors. Ray itself keeps running."""
        if self._closed:
            return
        self._closed = True
        ray, actors = self._ray, [a for a in getattr(self, "_actors", []) if a is not None]
        refs = [actor.close.remote() for actor in actors]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=min(self.timeout_s, _CLOSE_TIMEOUT_S))
        for actor in actors:
            kill_actor(ray, actor)
        self._actors = []

    # ------------------------------------------------------------------------------------------------ forwarding
    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call `method` of the wrapped env in every worker (or read attribute `method`), and merge the results.

        Arguments go unchanged to every worker, except `torch.Generator`s, each replaced by one generator per worker
        seeded from the caller's (see the module docstring).

        Args:
            method: The name of a method (or property) of the wrapped env.
            *args: Positional arguments of the method.
            **kwargs: Keyword arguments of the method.

        Returns:
            The per-worker results merged (per-world values concatenated in world order, equal values kept).

        Raises:
            ValueError: The workers' results can be neither concatenated nor agree.
        """
        self._check_open()
        calls = {}
        for k in range(len(self._actors)):
            worker_args = tuple(self._seeded(a) for a in args)
            worker_kwargs = {key: self._seeded(value) for key, value in kwargs.items()}
            calls[k] = (method, worker_args, worker_kwargs)
        results = self._run("call", calls)
        try:
            merged = merge_parts([results[k] for k in range(len(self._actors))], self._sizes(), method)
        except Unmergeable as error:
            raise ValueError(
                f"{self.name}.{method}: the {len(self._actors)} workers returned values at {error.where} that are "
                "neither per-world (leading dim = the worker's world count) nor equal"
            ) from None
        return self._to_device(merged)

    @property
    def expert_action(self) -> Callable[..., Any]:
        """The wrapped env's scripted expert (AttributeError when it has none, so `hasattr` tells).

        Call it as the env's own: `expert_action()`, or `expert_action(noise, generator)`; with a generator and
        `noise > 0`, a continuous env's noise is drawn here (see the module docstring), a text env's per worker.
        """
        if "expert_action" not in self._spec.methods:
            raise AttributeError(f"env {self.name!r} has no expert_action")
        return self._expert_action

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the class and instance lack: the wrapped env's attributes (module docstring).
        spec = self.__dict__.get("_spec")
        if spec is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        if name in spec.values:
            return copy.deepcopy(spec.values[name])  # a copy: callers may modify what they get
        if name in spec.properties:
            return self.call(name)
        if name in spec.methods:
            return functools.partial(self.call, name)
        if name in spec.remote_only:
            raise AttributeError(
                f"{self.name}.{name} stays in the worker processes ({spec.remote_only[name]}); expose what you need "
                f"as a property or method of the env, then read it here or through call()"
            )
        raise AttributeError(f"{type(self).__name__} of env {self.name!r} has no attribute {name!r}")

    # ------------------------------------------------------------------------------------------------ internals
    def _expert_action(self, noise: float | None = None, generator: torch.Generator | None = None, **kwargs) -> Any:
        if noise is not None:
            kwargs["noise"] = noise
        if generator is None or not noise:
            return self.call("expert_action", **kwargs)
        if self.action_kind == "text":
            return self.call("expert_action", generator=generator, **kwargs)
        # One [N, D] draw from the caller's generator, as the in-process env draws it (sim.robotics.planar.add_noise).
        clean = self.call("expert_action", **{**kwargs, "noise": 0.0}).cpu()  # [N, D]
        perturbed = clean + noise * torch.randn(clean.shape, generator=generator)
        low = self._spec.values.get("action_low", torch.tensor(-1.0))
        high = self._spec.values.get("action_high", torch.tensor(1.0))
        return self._to_device(torch.clamp(perturbed, min=torch.as_tensor(low).cpu(), max=torch.as_tensor(high).cpu()))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    def _sizes(self) -> list[int]:
        return [len(worlds) for worlds in self.worker_worlds]

    def _seeded(self, value: Any) -> Any:
        if isinstance(value, torch.Generator):
            return GeneratorSeed(int(torch.randint(0, _SEED_HIGH, (), generator=value)))
        return value

    def _new_actor(self, k: int) -> Any:
        return self._actor_cls.remote(self._env_cls, self.name, len(self.worker_worlds[k]), self._options)

    def _split_actions(self, actions: list[str] | torch.Tensor) -> list[Any]:
        """Each worker's block of the actions, as its own copy (recorded for replay, so the caller may reuse theirs)."""
        if isinstance(actions, (torch.Tensor, np.ndarray)):
            tensor = torch.as_tensor(actions).detach().to("cpu")
            if tensor.dim() < 1 or tensor.shape[0] != self.num_envs:
                raise ValueError(f"actions must have leading dim N={self.num_envs}, got shape {list(tensor.shape)}")
            return [tensor[worlds.start : worlds.stop].clone() for worlds in self.worker_worlds]
        if isinstance(actions, str) or not isinstance(actions, Sequence):
            raise ValueError(f"actions must be a list of {self.num_envs} strings or a tensor, got {type(actions)}")
        if len(actions) != self.num_envs:
            raise ValueError(f"got {len(actions)} actions for {self.num_envs} worlds")
        return [list(actions[worlds.start : worlds.stop]) for worlds in self.worker_worlds]

    def _run(
        self,
        method: str,
        calls: dict[int, tuple],
        on_result: Callable[[int, Any], None] | None = None,
        timeout: float | None = None,
    ) -> dict[int, Any]:
        """Call `method` on the workers in `calls` (worker -> args) concurrently; recover the ones that fail.

        `on_result(k, value)` runs for each worker that answered, before any env error is raised, so the episode
        records match what the workers did even when one of them raised.
        """
        if not calls:
            return {}
        ray = self._ray
        timeout = self.timeout_s if timeout is None else timeout
        refs = {k: getattr(self._actors[k], method).remote(*args) for k, args in calls.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
        ready_refs = set(ready)
        results: dict[int, Any] = {}
        failed: dict[int, BaseException] = {}
        env_error: BaseException | None = None
        for k, ref in refs.items():
            if ref not in ready_refs:
                failed[k] = self._timeout_error(k, method, timeout)
                continue
            try:
                results[k] = ray.get(ref, timeout=timeout)
            except self._failure_types as error:
                failed[k] = error
                continue
            except Exception as error:  # the env raised: a bug or a bad input, not a dead worker
                env_error = env_error or error
                continue
            self._failures[k] = 0
            if on_result is not None:
                on_result(k, results[k])
        if env_error is not None:
            raise env_error
        for k, cause in failed.items():
            results[k] = self._recover(k, method, calls[k], cause, timeout)
            if on_result is not None:
                on_result(k, results[k])
        return results

    def _call_one(self, k: int, method: str, args: tuple, timeout: float) -> Any:
        ray = self._ray
        try:
            return ray.get(getattr(self._actors[k], method).remote(*args), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise self._timeout_error(k, method, timeout) from None

    def _timeout_error(self, k: int, method: str, timeout: float) -> BaseException:
        message = f"worker {k} did not answer {method} within {timeout:g} s"
        if method in ("describe", "ping"):  # a new actor: it may never have been placed
            free = self._ray.available_resources().get("CPU", 0.0)
            message += f" (a new actor waits for {self.cpus_per_worker:g} free Ray CPUs; {free:g} are free now)"
        return self._ray.exceptions.GetTimeoutError(message)

    def _recover(self, k: int, method: str, args: tuple, cause: BaseException, timeout: float) -> Any:
        """Replace worker k's actor, replay its worlds' episodes and retry `method`, up to `max_restarts` times."""
        while True:
            self._failures[k] += 1
            worlds = list(self.worker_worlds[k])
            failures = self._failures[k]
            if failures > self.max_restarts:
                # Give up on this call. The actor goes (a hung one would keep its CPU); a later call starts afresh.
                kill_actor(self._ray, self._actors[k])
                self._failures[k] = 0
                raise RuntimeError(
                    f"worker {k} (worlds {worlds}) of env {self.name!r} failed {failures} times in a row "
                    f"(max_restarts={self.max_restarts}) in {method}; last cause: {type(cause).__name__}: {cause}"
                ) from cause
            self.restarts += 1
            warnings.warn(
                f"restarting worker {k} (worlds {worlds}) of env {self.name!r} after {type(cause).__name__} in "
                f"{method} (restart {failures} of at most {self.max_restarts}): {cause}",
                RuntimeWarning,
                stacklevel=4,
            )
            try:
                kill_actor(self._ray, self._actors[k])  # a hung actor would otherwise keep its CPU and its worlds
                self._actors[k] = self._new_actor(k)
                self._call_one(k, "ping", (), self.start_timeout_s)
                self._replay(k)
                result = self._call_one(k, method, args, timeout)
            except self._failure_types as error:
                cause = error
                continue
            self._failures[k] = 0
            return result

    def _replay(self, k: int) -> None:
        """Bring worker k's fresh env to the recorded state: each world reset with its seed, then its actions.

        Worlds' histories are aligned at the end: a world with L of the T recorded steps is (re)reset at every step
        up to T - L, so the filler actions it gets before that never count, and then takes its L actions.
        """
        worlds = list(self.worker_worlds[k])
        lengths = [len(self._actions[i]) for i in worlds]
        total = max(lengths, default=0)
        for t in range(total + 1):
            reset = [j for j, i in enumerate(worlds) if self._seeds[i] is not None and t <= total - lengths[j]]
            if reset:
                seeds = [self._seeds[worlds[j]] for j in reset]
                self._call_one(k, "reset", (seeds, reset), self.timeout_s)
            if t == total:
                break
            step = [self._actions[i][t - (total - n)] if t >= total - n else None for i, n in zip(worlds, lengths)]
            fill = next(a for a in step if a is not None)  # a world with the full history has one at every t
            if isinstance(fill, torch.Tensor):
                chunk: Any = torch.stack([torch.zeros_like(fill) if a is None else a for a in step])
            else:
                chunk = ["" if a is None else a for a in step]
            self._call_one(k, "step", (chunk,), self.timeout_s)

    def _merge_observations(self) -> Observation:
        parts = [obs for obs in self._obs if obs is not None]
        assert len(parts) == len(self._actors), "every worker has an observation once reset() returned"
        return merge_parts(parts, self._sizes(), "obs")

    def _merge_info(self, parts: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
        dropped: list[str] = []
        merged = merge_dict(parts, sizes, "info", dropped)
        for where in dropped:
            if where not in self._dropped_info:
                self._dropped_info.add(where)
                warnings.warn(
                    f"{self.name}: {where} differs between workers and is not per-world; dropped from the merged "
                    "info (it is neither a tensor with leading dim n_k nor a list of n_k entries)",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return merged

    def _to_device(self, value: Any) -> Any:
        if self._device is None or self._device.type == "cpu":
            return value
        return map_tensors(value, lambda t: t.to(self._device))
