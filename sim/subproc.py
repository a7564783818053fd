"""One `VecEnv` whose worlds live in worker processes started from another Python environment, over pipes.

Some simulators pin libraries that the project cannot share: LIBERO runs on robosuite 1.4, which breaks on mujoco 4,
while the project's MuJoCo code and MuJoCo Warp need mujoco 4. Such a simulator gets its own virtual environment,
and its worlds are served from there: the parent (this module, in the project's environment) starts K processes
with that environment's interpreter, each running `sim/serve.py` (standard library and NumPy only) around a worlds
class loaded from a file that imports only what that environment has.

>>> env = SubprocVecEnv("sim/robotics/libero_worlds.py:LiberoWorlds", num_envs=4, workers=4,
...                     python=".venv-libero/bin/python", suite="libero_spatial")  # doctest: +SKIP
>>> obs = env.reset(seed=0)  # the 4 processes reset in parallel; obs holds all 4 worlds in world order

**Layout and results** follow `sim.workers.RayVecEnv`: worker k holds a contiguous block of worlds, a reset goes to
the workers that hold a reset world (with each world's own seed), a step splits the actions by worker, all workers
work concurrently, and their answers are merged by the same rule (`sim.ray_workers.merge_parts`): per-world arrays
and lists concatenated in world order, equal constants kept. Arrays cross the pipe as raw bytes (`sim.serve.encode`),
so the two environments need not share a NumPy; they come back as fresh CPU tensors moved to `device`.

**The worlds class** (the worker side's contract) is written in `sim/serve.py`'s docstring. Its `describe()`
constants (`action_kind`, `max_episode_steps`, `action_dim`, `action_low`, ...) are attributes of this env, and
its other public methods are reached with `call(name, ...)`.

**Failures.** Each worker's output (prints, warnings, a crash's traceback) goes to its own log file under a scratch
folder. Every wait has a time limit (`timeout_s`, `start_timeout_s` for building the worlds), and a worker that dies,
hangs or cannot start raises a `RuntimeError` naming the worker, its worlds, the target and the last lines of its
log. A dead or hung worker is killed and a fresh one started in its place, so the env stays usable: its worlds must be
reset before they are stepped again (stepping them raises until then). An exception raised by the worlds themselves (a
bad action, an unreset world) comes back as a `RuntimeError` carrying the worker's traceback, and the worker lives on.

**No orphans.** A worker blocks on its pipe between calls; when the parent goes away, for any reason including
SIGKILL, the pipe closes and the worker exits.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sim.base import Observation, StepResult, resolve_env_ids, resolve_seeds
from sim.ray_workers import Unmergeable, map_tensors, merge_parts
from sim.registry import make
from sim.serve import decode, encode

__all__ = ["EnvWorlds", "SubprocVecEnv", "SERVE"]

SERVE = Path(__file__).resolve().with_name("serve.py")
_POLL_S = 0.25  # how often a waiting parent checks that the worker it waits for is still alive
_EXIT_WAIT_S = 5.0  # how long a worker whose pipe closed gets to finish exiting, so its exit code can be named
_LOG_TAIL = 30  # lines of a failed worker's log quoted in the error


def to_torch(value: Any) -> Any:
    """NumPy arrays (recursively through dicts, lists and tuples) as CPU tensors; everything else as it is."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, dict):
        return {key: to_torch(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_torch(item) for item in value]
    if isinstance(value, tuple):
        return tuple(to_torch(item) for item in value)
    return value


def to_numpy(value: Any) -> Any:
    """Tensors (recursively) as NumPy arrays on the CPU, for the pipe."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").numpy()
    if isinstance(value, dict):
        return {key: to_numpy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_numpy(item) for item in value)
    return value


class _Worker:
    """One process: its pipe, its log file and its worlds."""

    def __init__(self, k: int, worlds: range, argv: list[str], target: str, env: dict[str, str], log: Path):
        self.k = k
        self.worlds = worlds
        self.log = log
        parent, child = socket.socketpair()
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [*argv, str(child.fileno()), target],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        child.close()  # the worker's end lives in the worker only, so its death is EOF here
        self.conn = Connection(parent.detach())

    def tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-_LOG_TAIL:]) or "(empty log)"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            pass
        self.conn.close()


class SubprocVecEnv:
    """N worlds of a worlds class served by K worker processes of any Python interpreter (see the module docstring).

    Args:
        target: The worlds class, `path/to/file.py:Class` (loaded from the file alone) or `package.module:Class`
            (importable by `python`).
        num_envs: N, the number of worlds.
        workers: K processes, 1 <= K <= N; None: one per world.
        python: The interpreter the workers run; None: this one (`sys.executable`).
        env_vars: Variables added to the workers' environment (on top of this process's).
        timeout_s: Seconds a worker may take to answer one call (reset, step, `call`).
        start_timeout_s: Seconds a worker may take to start and build its worlds.
        device: Where returned tensors live.
        name: The env's name in messages.
        **options: Keyword arguments of the worlds class (each worker builds `Class(n_k, **options)`).

    Raises:
        FileNotFoundError: `python` does not exist.
        ValueError: A bad N or K.
        RuntimeError: A worker could not start or build its worlds (with its log's tail).
    """

    def __init__(
        self,
        target: str,
        num_envs: int,
        workers: int | None = None,
        *,
        python: str | os.PathLike | None = None,
        env_vars: dict[str, str] | None = None,
        timeout_s: float = 120.0,
        start_timeout_s: float = 300.0,
        device: str | torch.device = "cpu",
        name: str | None = None,
        **options: Any,
    ):
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        workers = num_envs if workers is None else workers
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= num_envs:
            raise ValueError(f"workers must be an int in [1, num_envs={num_envs}], got {workers!r}")
        python = str(python or sys.executable)
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise FileNotFoundError(f"no Python interpreter at {python}")
        self.target = target
        self.name = name or target.rpartition(":")[2]
        self.num_envs = num_envs
        self.python = python
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.device = torch.device(device)
        self.restarts = 0
        self._options = options
        self._env = {**os.environ, **(env_vars or {})}
        self._argv = [python, "-I", str(SERVE)]
        self._scratch = Path(tempfile.mkdtemp(prefix="mmrl_subproc_"))
        base, extra = divmod(num_envs, workers)
        starts = np.cumsum([0] + [base + (k < extra) for k in range(workers)]).tolist()
        self.worker_worlds: tuple[range, ...] = tuple(range(starts[k], starts[k + 1]) for k in range(workers))
        self._owner = [k for k, worlds in enumerate(self.worker_worlds) for _ in worlds]
        self._local = [j for worlds in self.worker_worlds for j in range(len(worlds))]
        self._obs: list[Observation | None] = [None] * workers
        self._workers: list[_Worker] = []
        self._closed = False
        try:
            self._workers = [self._spawn(k) for k in range(workers)]
            described = self._gather({k: ("__init__", (len(self.worker_worlds[k]),), options) for k in range(workers)},
                                     self.start_timeout_s, "start")  # fmt: skip
        except BaseException:
            self.close()
            raise
        spec = to_torch(described[0])
        for required in ("action_kind", "max_episode_steps"):
            if required not in spec:
                self.close()
                raise ValueError(f"{target}.describe() gives no {required}; it does not implement the contract")
        self.spec: dict[str, Any] = spec
        self.action_kind = spec["action_kind"]
        self.max_episode_steps = int(spec["max_episode_steps"])

    def __repr__(self) -> str:
        return f"SubprocVecEnv({self.target!r}, num_envs={self.num_envs}, workers={len(self.worker_worlds)})"

    def __getattr__(self, name: str) -> Any:
        spec = self.__dict__.get("spec")
        if spec is None or name.startswith("_") or name not in spec:
            raise AttributeError(f"{type(self).__name__} of {self.__dict__.get('name')!r} has no attribute {name!r}")
        value = spec[name]
        return value.clone() if isinstance(value, torch.Tensor) else value

    # ------------------------------------------------------------------------------------------------ contract
    def reset(self, seed: int | Sequence[int], env_ids: Sequence[int] | None = None) -> Observation:
        """Reset the worlds `env_ids` (all when None), each in its worker; only those workers are called."""
        self._check_open()
        ids = resolve_env_ids(env_ids, self.num_envs)
        seeds = resolve_seeds(seed, len(ids))
        calls: dict[int, tuple[list[int], list[int]]] = {}
        for i, world_seed in zip(ids, seeds):
            k = self._owner[i]
            calls.setdefault(k, ([], []))
            calls[k][0].append(world_seed)
            calls[k][1].append(self._local[i])
        answers = self._gather({k: ("reset", (s, local), {}) for k, (s, local) in calls.items()}, self.timeout_s)
        for k, answer in answers.items():
            self._obs[k] = _observation(answer)
        return self._to_device(self._merged_obs())

    def step(self, actions: list[str] | torch.Tensor) -> StepResult:
        """Advance every world by one action: N strings, or a `[N, D]` tensor split by worker."""
        self._check_open()
        if isinstance(actions, (torch.Tensor, np.ndarray)):
            array = to_numpy(torch.as_tensor(actions))
            if array.ndim < 1 or array.shape[0] != self.num_envs:
                raise ValueError(f"actions must have leading dim N={self.num_envs}, got shape {list(array.shape)}")
            parts: list[Any] = [array[w.start : w.stop] for w in self.worker_worlds]
        else:
            if isinstance(actions, str) or len(actions) != self.num_envs:
                raise ValueError(f"{self.name} takes {self.num_envs} actions, got {actions!r:.80}")
            parts = [list(actions[w.start : w.stop]) for w in self.worker_worlds]
        if any(obs is None for obs in self._obs):
            raise RuntimeError(f"{self.name}: reset the worlds before stepping them")
        answers = self._gather({k: ("step", (part,), {}) for k, part in enumerate(parts)}, self.timeout_s)
        results = []
        for k in range(len(self._workers)):
            answer = answers[k]
            self._obs[k] = _observation(answer["obs"])
            results.append(
                StepResult(
                    obs=self._obs[k],
                    reward=torch.as_tensor(answer["reward"], dtype=torch.float32),
                    terminated=torch.as_tensor(answer["terminated"], dtype=torch.bool),
                    truncated=torch.as_tensor(answer["truncated"], dtype=torch.bool),
                    info=to_torch(answer.get("info", {})),
                )
            )
        return self._to_device(self._merge(results, "step"))

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`method(*args, **kwargs)` of every worker's worlds, merged (per-world values concatenated)."""
        self._check_open()
        if method.startswith("_"):
            raise AttributeError(f"{method!r} is private")
        call = (method, to_numpy(args), to_numpy(kwargs))
        answers = self._gather({k: call for k in range(len(self._workers))}, self.timeout_s)
        return self._to_device(self._merge([to_torch(answers[k]) for k in range(len(self._workers))], method))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            try:
                worker.conn.send(("close", (), {}))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 10.0
        for worker in self._workers:
            try:
                worker.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            worker.kill()
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass

    # ------------------------------------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    def _spawn(self, k: int) -> _Worker:
        return _Worker(k, self.worker_worlds[k], self._argv, self.target, self._env, self._scratch / f"worker{k}.log")

    def _gather(self, calls: dict[int, tuple], timeout: float, what: str | None = None) -> dict[int, Any]:
        """Send each worker its message, then collect every answer; failures raise after all answers are in."""
        sent = {}
        for k, (method, args, kwargs) in calls.items():
            try:
                self._workers[k].conn.send((method, encode(to_numpy(args)), encode(to_numpy(kwargs))))
                sent[k] = method
            except (OSError, ValueError):
                sent[k] = None  # a dead pipe: reported below
        answers: dict[int, Any] = {}
        errors: list[str] = []
        worker_failed: list[int] = []
        for k, method in sent.items():
            label = what or method or calls[k][0]
            worker = self._workers[k]
            where = f"{self.name} worker {k} (worlds {list(worker.worlds)}, pid {worker.proc.pid}) during {label}"
            reply = None if method is None else self._receive(worker, timeout)
            if isinstance(reply, str):  # died or hung
                errors.append(f"{where} {reply}; the end of its log ({worker.log}):\n{worker.tail()}")
                worker_failed.append(k)
                continue
            if reply is None:
                errors.append(f"{where}: its pipe is closed; the end of its log:\n{worker.tail()}")
                worker_failed.append(k)
                continue
            status, *payload = reply
            if status == "ok":
                answers[k] = decode(payload[0])
            else:
                kind, message, trace = payload
                errors.append(f"{where} raised {kind}: {message}\n--- worker traceback ---\n{trace}")
        for k in worker_failed:
            self._replace(k, starting=what == "start")
        if errors:
            raise RuntimeError("\n".join(errors))
        return answers

    def _receive(self, worker: _Worker, timeout: float) -> Any:
        """The worker's reply, or a string saying why there is none (it died, or said nothing in time)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if worker.conn.poll(_POLL_S):
                    return worker.conn.recv()
            except (EOFError, OSError):
                # The pipe closes as the process exits, a moment before it can be reaped (on a loaded machine the
                # exit code was still None here).
                try:
                    worker.proc.wait(timeout=_EXIT_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass  # its pipe closed but it runs on: reported without an exit code, then killed
                return f"died (exit code {worker.proc.returncode})"
            if worker.proc.poll() is not None:
                return f"died (exit code {worker.proc.returncode})"
            if time.monotonic() > deadline:
                return f"gave no answer within {timeout:g} s and was killed"

    def _replace(self, k: int, starting: bool) -> None:
        """Kill worker k and, unless the env is still starting, start a fresh one whose worlds await a reset."""
        self._workers[k].kill()
        self._obs[k] = None
        if starting:
            return
        self.restarts += 1
        self._workers[k] = self._spawn(k)
        self._gather({k: ("__init__", (len(self.worker_worlds[k]),), self._options)}, self.start_timeout_s, "restart")

    def _merged_obs(self) -> Observation:
        parts = [obs for obs in self._obs if obs is not None]
        if len(parts) < len(self._workers):
            # Worlds never reset (or whose worker was replaced) have no observation yet: show them black.
            template = parts[0]
            parts = [
                obs if obs is not None else _blank(template, len(self.worker_worlds[k]))
                for k, obs in enumerate(self._obs)
            ]
        return self._merge(parts, "obs")

    def _merge(self, parts: list[Any], where: str) -> Any:
        try:
            return merge_parts(parts, [len(w) for w in self.worker_worlds], where)
        except Unmergeable as error:
            raise ValueError(f"{self.name}: the workers' {error.where} are neither per-world nor equal") from None

    def _to_device(self, value: Any) -> Any:
        if self.device.type == "cpu":
            return value
        return map_tensors(value, lambda t: t.to(self.device))


def _observation(answer: dict[str, Any]) -> Observation:
    state, proprio = answer.get("state"), answer.get("proprio")
    return Observation(
        image=torch.from_numpy(np.asarray(answer["image"], dtype=np.uint8)),
        instruction=list(answer["instruction"]),
        state=None if state is None else torch.as_tensor(state, dtype=torch.float32),
        proprio=None if proprio is None else torch.as_tensor(proprio, dtype=torch.float32),
    )


def _blank(template: Observation, n: int) -> Observation:
    return Observation(
        image=torch.zeros((n, *template.image.shape[1:]), dtype=torch.uint8),
        instruction=[""] * n,
        state=None if template.state is None else torch.zeros((n, *template.state.shape[1:])),
        proprio=None if template.proprio is None else torch.zeros((n, *template.proprio.shape[1:])),
    )


class EnvWorlds:
    """The worlds contract around an env registered in this project: `SubprocVecEnv("sim.subproc:EnvWorlds", N,
    env="reach", ...)` serves it from processes of this project's environment (process isolation for an env that
    may crash or leak, and the mechanism's own test against the in-process env).

    Args:
        num_envs: The worlds this worker holds.
        env: A name registered in `sim.ENVS`.
        **options: The env's constructor options.
    """

    def __init__(self, num_envs: int, env: str, **options: Any):
        self.env = make(env, num_envs=num_envs, **options)

    def describe(self) -> dict[str, Any]:
        out = {}
        for key in ("action_kind", "max_episode_steps", "action_dim", "action_low", "action_high", "image_size"):
            if hasattr(self.env, key):
                out[key] = to_numpy(getattr(self.env, key))
        return out

    def reset(self, seeds: list[int], env_ids: list[int]) -> dict[str, Any]:
        return _numpy_obs(self.env.reset(seeds, env_ids))

    def step(self, actions: Any) -> dict[str, Any]:
        result = self.env.step(torch.from_numpy(actions) if isinstance(actions, np.ndarray) else actions)
        return {
            "obs": _numpy_obs(result.obs),
            "reward": to_numpy(result.reward),
            "terminated": to_numpy(result.terminated),
            "truncated": to_numpy(result.truncated),
            "info": to_numpy(result.info),
        }

    def expert_action(self) -> Any:
        return to_numpy(self.env.expert_action())

    def close(self) -> None:
        self.env.close()


def _numpy_obs(obs: Observation) -> dict[str, Any]:
    return {"image": to_numpy(obs.image), "instruction": list(obs.instruction), "state": to_numpy(obs.state),
            "proprio": to_numpy(obs.proprio)}  # fmt: skip
