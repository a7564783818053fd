"""Rollout engines as Ray actors: K copies of the policy, each with its own env, collect a step's episodes.

>>> workers = RolloutWorkers(policy, "grounding", num_envs=16, env_options={}, workers=2)
>>> workers.sync(policy)  # after each update: the learner's weights go to every worker (one object in Ray's store)
>>> parts = workers.collect([(seeds_a, 4, sampling, 101), (seeds_b, 4, sampling, 102)])  # two shards, in parallel
>>> workers.close()

`trainer.rollout_workers: K` uses this: the step's prompt shards (`trainer.generation_shards`) are handed out to the
K workers in turn and collected concurrently; this process (the learner) trains on what they return. Each job is
`(seeds, group_size, sampling, torch_seed)`: the worker seeds torch with `torch_seed` and runs
`mmrl.stages.rollout.collect_episodes` on its own env, exactly what the trainer does in-process for that shard. So **the
episodes equal the in-process ones** for the same weights, on CPUs with the same torch thread count
(tests/mmrl/test_rollout_workers.py checks the episodes, tests/mmrl/test_trainer_options.py a whole training run),
and a job can be rerun anywhere with the same result.

**Where they run.** On the local machine, Ray starts a cluster of this machine's CPUs; with `RAY_ADDRESS` (or
`address=`) set to a cluster's head, the actors are placed on its machines. Each worker holds a whole copy of the
policy on the CPU, and `threads` torch threads (default 1). Weights travel as one state dict through Ray's object
store per `sync`: right for small and mid-size models and for CPU machines; GPU rollout engines of real-size models
are vLLM's job (`model.generation_backend: vllm`).

**Dead and hung workers.** Every wait has a time limit (`timeout_s` per job). A worker whose actor died or did not
return its jobs in time is killed and replaced, once, by a new actor with the last synced weights, which reruns every
job of that worker without a result (same seeds and torch seed, so the same episodes); each restart is a
`RuntimeWarning`. A worker that fails `max_restarts + 1` times in a row raises a `RuntimeError` naming the worker,
its unfinished jobs and the cause. An error raised by the policy or env itself (a bad
config, an env that refuses an action) is not a dead worker: it propagates as Ray's `RayTaskError`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

import sim
from sim.ray_workers import init_ray, kill_actor
from sim.registry import ENVS

from ..policy import Policy
from ..types import Episodes, Sampling
from .rollout import collect_episodes

Job = tuple[list[int], int, Sampling, int]  # (seeds, group_size, sampling, torch_seed)


class _RolloutWorker:
    """The actor: a policy copy and an env of `num_envs` worlds (Ray wraps this class with `ray.remote`).

    The env class travels with the actor, so envs registered outside `sim` (a script, a test) are found. An error
    building the env is kept and raised by every call: an actor whose constructor raises is dead to Ray, and a bad
    option would otherwise look like a dead worker and be restarted in vain.
    """

    def __init__(
        self,
        policy: Policy,
        env_cls: type,
        env_name: str,
        num_envs: int,
        env_options: dict,
        threads: int,
        keep_answered: bool = False,
    ):
        torch.set_num_threads(threads)
        self.policy = policy
        self.env: Any = None
        self._error: BaseException | None = None
        self.set_env(env_cls, env_name, num_envs, env_options)
        self.keep_answered = keep_answered

    def ping(self) -> bool:
        self._check()
        return True

    def load(self, state: dict[str, torch.Tensor]) -> None:
        self.policy.model.load_state_dict(state)

    def set_env(self, env_cls: type, env_name: str, num_envs: int, env_options: dict) -> None:
        if self.env is not None:
            self.env.close()
        self.env, self._error = None, None
        try:
            if env_name not in ENVS:
                ENVS.register(env_name)(env_cls)
            self.env = sim.make(env_name, num_envs=num_envs, **env_options)
        except Exception as error:  # noqa: BLE001  (raised by every later call)
            self._error = error

    def collect(self, seeds: list[int], group_size: int, sampling: Sampling, torch_seed: int) -> Episodes:
        self._check()
        torch.manual_seed(torch_seed)
        return collect_episodes(
            self.policy, self.env, seeds, group_size, sampling, keep_answered=self.keep_answered
        )

    def close(self) -> None:
        if self.env is not None:
            self.env.close()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error


class RolloutWorkers:
    """K Ray actors that collect episodes with copies of `policy` (see the module docstring).

    Args:
        policy: The policy to copy (its weights as of now; `sync` sends later ones).
        env_name: A name registered in `sim.ENVS`; each worker builds `sim.make(env_name, num_envs, **env_options)`.
        num_envs: Worlds of each worker's env: the rows of one job (prompts of a shard times the group size).
        env_options: The env's options.
        workers: K, at least 1.
        threads: Torch threads of each worker.
        timeout_s: Seconds one call may take (starting a worker, syncing, or collecting one job).
        max_restarts: Restarts of one worker within one call before it gives up.
        address: A Ray cluster to join (default: `RAY_ADDRESS`, else a local cluster).
        keep_answered: return each row's observation with the episodes (a judge model scores them in the
            learner's process, `mmrl.stages.shaping`).
    """

    def __init__(
        self,
        policy: Policy,
        env_name: str,
        num_envs: int,
        env_options: dict[str, Any],
        workers: int,
        threads: int = 1,
        timeout_s: float = 600.0,
        max_restarts: int = 2,
        address: str | None = None,
        keep_answered: bool = False,
    ):
        if workers < 1:
            raise ValueError(f"trainer.rollout_workers must be >= 1 to start rollout workers, got {workers}")
        if timeout_s <= 0 or max_restarts < 0 or threads < 1:
            raise ValueError(f"need timeout_s > 0, max_restarts >= 0, threads >= 1; got {timeout_s}, {max_restarts}, "
                             f"{threads}")  # fmt: skip
        env_cls = sim.ENVS.get(env_name)  # fails here, naming the registered envs, rather than in every worker
        self._ray = ray = init_ray(address, max(workers * threads, 1), user="trainer.rollout_workers")
        self.workers, self.threads, self.timeout_s, self.max_restarts = workers, threads, timeout_s, max_restarts
        self._env = (env_cls, env_name, num_envs, dict(env_options))
        self._actor_cls = ray.remote(num_cpus=threads)(_RolloutWorker)
        self._failure_types = (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)
        self._policy_ref = ray.put(_cpu_copy(policy))  # kept: a replacement worker starts from it
        self._state_ref: Any = None  # the last synced weights, loaded into a replacement worker
        self.restarts = 0
        self._keep_answered = keep_answered
        self._actors = [
            self._actor_cls.remote(self._policy_ref, *self._env, threads, keep_answered) for _ in range(workers)
        ]
        try:
            self._wait_all("ping", [()] * workers)
        except BaseException:
            self.close()  # no actor outlives a failed start (each would hold its CPUs in the cluster)
            raise

    def sync(self, policy: Policy) -> None:
        """Send `policy`'s current weights to every worker (one copy in Ray's object store)."""
        state = {name: value.detach().to("cpu", copy=True) for name, value in policy.model.state_dict().items()}
        self._state_ref = self._ray.put(state)
        self._wait_all("load", [(self._state_ref,)] * self.workers)

    def set_env(self, env_options: dict[str, Any]) -> None:
        """Rebuild every worker's env with new options (the curriculum's next level)."""
        env_cls, name, num_envs, _ = self._env
        self._env = (env_cls, name, num_envs, dict(env_options))
        self._wait_all("set_env", [self._env] * self.workers)

    def collect(self, jobs: Sequence[Job]) -> list[Episodes]:
        """Run the jobs, job j on worker `j % K`, the workers concurrently; the episodes in job order."""
        ray, k_all = self._ray, self.workers
        results: list[Episodes | None] = [None] * len(jobs)
        # Each worker runs its jobs one after another (one env each); Ray queues an actor's calls in order.
        pending = {self._actors[j % k_all].collect.remote(*job): j for j, job in enumerate(jobs)}
        deadline_s = self.timeout_s * -(-len(jobs) // k_all)  # a worker's queue: its jobs, each timeout_s
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=deadline_s)
        ready_set = set(ready)
        failed: dict[int, BaseException] = {}  # worker -> the first cause
        for ref, j in pending.items():
            k = j % k_all
            if ref not in ready_set:
                message = f"rollout worker {k} did not return its jobs within {deadline_s:g} s"
                failed.setdefault(k, ray.exceptions.GetTimeoutError(message))
                continue
            try:
                results[j] = ray.get(ref)
            except self._failure_types as error:
                failed.setdefault(k, error)
        for k, cause in failed.items():
            # One new actor per failed worker; it reruns every job of that worker that has no result.
            todo = [j for j in range(k, len(jobs), k_all) if results[j] is None]
            attempt = 1
            while todo:
                try:
                    self._restart(k, cause, attempt)
                except RuntimeError as error:
                    raise RuntimeError(f"{error}; its unfinished jobs: {todo}") from cause
                try:
                    refs = [self._actors[k].collect.remote(*jobs[j]) for j in todo]
                    outs = ray.get(refs, timeout=self.timeout_s * len(todo))
                except self._failure_types as error:
                    cause, attempt = error, attempt + 1
                    continue
                for j, out in zip(todo, outs):
                    results[j] = out
                todo = []
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """End the workers' actors (Ray itself keeps running: `ray.shutdown()` is the application's)."""
        for actor in self._actors:
            kill_actor(self._ray, actor)
        self._actors = []

    # ------------------------------------------------------------------------------------------------ helpers
    def _wait_all(self, method: str, args: list[tuple]) -> None:
        """Call `method` on every worker and wait; replace a worker that dies or hangs (up to `max_restarts`)."""
        refs = [getattr(actor, method).remote(*a) for actor, a in zip(self._actors, args)]
        for k, ref in enumerate(refs):
            try:
                self._ray.get(ref, timeout=self.timeout_s)
            except self._failure_types as error:
                self._restart(k, error, attempt=1)  # the fresh worker has the current weights and env already

    def _restart(self, k: int, cause: BaseException, attempt: int) -> None:
        """Replace worker k's actor by a fresh one with the last synced weights and the current env."""
        if attempt > self.max_restarts:
            kill_actor(self._ray, self._actors[k])
            raise RuntimeError(
                f"rollout worker {k} failed {attempt} times in a row (max_restarts={self.max_restarts}); "
                f"last cause: {type(cause).__name__}: {cause}"
            ) from cause
        warnings.warn(
            f"rollout worker {k} failed ({type(cause).__name__}: {cause}); starting a new one (restart {attempt})",
            RuntimeWarning,
            stacklevel=3,
        )
        kill_actor(self._ray, self._actors[k])
        self.restarts += 1
        actor = self._actor_cls.remote(self._policy_ref, *self._env, self.threads, self._keep_answered)
        calls = [actor.ping.remote()] if self._state_ref is None else [actor.load.remote(self._state_ref)]
        try:
            self._ray.get(calls, timeout=self.timeout_s)
        except self._failure_types as error:
            self._actors[k] = actor
            self._restart(k, error, attempt + 1)
            return
        self._actors[k] = actor


def _cpu_copy(policy: Policy) -> Policy:
    """The policy to ship: itself when on the CPU, else a CPU copy (the workers run on CPUs)."""
    if next(policy.model.parameters()).device.type == "cpu":
        return policy
    import copy

    clone = copy.deepcopy(policy)
    clone.model.to("cpu")
    return clone
