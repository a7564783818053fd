"""ManiSkill 3 table-top manipulation (SAPIEN) behind the `VecEnv` contract: camera images, continuous actions.

**Task.** One ManiSkill task (`PickCube-v1` by default) in N worlds. Each world shows the RGB image of one of the
task's cameras and a fixed instruction naming the goal (`TASKS`); the policy sends a continuous action `[D]` in the
chosen controller's space (default `pd_ee_delta_pose`: end-effector translation and rotation deltas plus the
gripper, each in [-1, 1]). Only tasks whose assets ship inside the `mani-skill` wheel are offered: the others
download assets on first use, which asks on the terminal and fails offline.

**Randomizations** are ManiSkill's own (object, goal and robot poses), drawn from each world's seed only: a world
reset with seed s starts in the same state as any other world reset with seed s. The goal marker of PickCube is
hidden from the cameras by ManiSkill; the goal position is in `state`.

**Reward** is ManiSkill's reward in `reward_mode` (default `normalized_dense`, in [0, 1]). `info["reward_components"]`
holds `dense`, `normalized_dense` and `success` (0/1) for every world, `info["success"]` the task's success `[N]`.
An episode terminates on success (ManiSkill's rule) and is truncated after `max_episode_steps` steps.

**No autoreset.** A world whose episode ended (terminated or truncated) is frozen until it is reset: its action is
ignored, it returns its final image and state again, reward 0 (and 0 components), and keeps its `terminated`,
`truncated` and `success` values. The caller resets worlds explicitly with `reset(seed, env_ids)`.

**Backends.** ManiSkill's CPU simulation holds one world per env, so on CPU each world lives in its own worker
process (`spawn` context; one ManiSkill env each; pipes with timeouts, so a worker that dies or hangs raises an
error naming it). With CUDA, one ManiSkill env holds all N worlds on the GPU (`physx_cuda`); partial resets use
ManiSkill's `options={"env_idx": ...}`, one world at a time so each world's state depends on its own seed only
(ManiSkill seeds a batched reset's torch randomness from the first seed alone). The GPU path is kept separate
(`_GpuWorlds`) and has not been run yet on a GPU.

**Rendering without a GPU** needs a software Vulkan driver newer than Debian 12's: run `scripts/setup_vulkan.sh`.
Images are rendered at `image_size` directly (ManiSkill's `sensor_configs` sets every camera's width and height), so
nothing is resized. Returned tensors are fresh copies on `device` (CPU by default) whatever the backend.
"""

from __future__ import annotations

import glob
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any, Literal

import numpy as np
import torch

from sim.base import Observation, StepResult, resolve_env_ids, resolve_seeds
from sim.registry import ENVS

# Tasks whose assets ship inside the mani-skill wheel (no download), with the instruction each world shows.
TASKS = {
    "PickCube-v1": "Pick up the red cube and move it to the goal position.",
    "PushCube-v1": "Push the blue cube onto the red and white target.",
    "PullCube-v1": "Pull the blue cube back onto the red and white target.",
    "StackCube-v1": "Stack the red cube on top of the green cube.",
    "StackPyramid-v1": "Stack the three cubes into a pyramid.",
    "PegInsertionSide-v1": "Pick up the peg and insert it sideways into the hole in the box.",
    "LiftPegUpright-v1": "Lift the peg lying on the table so that it stands upright.",
    "PokeCube-v1": "Use the blue peg to push the red cube onto the target.",
    "PlaceSphere-v1": "Pick up the blue ball and place it in the bin.",
    "RollBall-v1": "Push the blue ball so that it rolls into the goal region.",
    "PullCubeTool-v1": "Use the L-shaped tool to pull the blue cube towards the robot.",
    "PushT-v1": "Push the T-shaped block so that it matches the goal T.",
    "PlugCharger-v1": "Plug the charger into the receptacle.",
}
REWARD_COMPONENTS = ("dense", "normalized_dense", "success")
SETUP_HINT = "run scripts/setup_vulkan.sh (as root) to install a software Vulkan driver (Mesa >= 24 lavapipe)"
_LAVAPIPE_ICDS = ("/usr/share/vulkan/icd.d/lvp_icd.json", "/usr/share/vulkan/icd.d/lvp_icd.*.json")


@ENVS.register("maniskill")
class ManiSkillEnv:
    """N worlds of one ManiSkill 3 task with RGB camera images (see the module docstring for the rules).

    >>> env = ManiSkillEnv(num_envs=2, task="PickCube-v1", image_size=64)  # doctest: +SKIP
    >>> obs = env.reset(seed=0)  # doctest: +SKIP
    >>> obs.image.shape, obs.state.shape  # doctest: +SKIP
    (torch.Size([2, 64, 64, 3]), torch.Size([2, 42]))
    >>> result = env.step(torch.zeros(2, env.action_dim))  # doctest: +SKIP

    Args:
        num_envs: N, the number of worlds.
        task: A ManiSkill task id, one of `TASKS`.
        image_size: Side of the square camera images, in pixels (rendered at this size, not resized).
        control_mode: A ManiSkill controller of the task's robot; the default moves the end effector by deltas.
        backend: `"cpu"` (one worker process per world), `"gpu"` (all worlds in one `physx_cuda` env) or `"auto"`
            (GPU when CUDA is available).
        max_episode_steps: Steps before an episode is truncated; None takes the task's ManiSkill default.
        camera: The sensor camera whose image is returned (e.g. `"base_camera"`, `"hand_camera"`); None takes the
            task's first camera.
        reward_mode: ManiSkill's reward mode for `reward`; all modes are reported in `info["reward_components"]`.
        timeout_s: Seconds to wait for a worker's answer (start-up included) before declaring it hung.
        device: Where the returned tensors live. The simulation's own device follows `backend`.
    """

    action_kind = "continuous"
    default_max_episode_steps = "task"  # what max_episode_steps=None takes: the ManiSkill task's limit

    def __init__(
        self,
        num_envs: int,
        task: str = "PickCube-v1",
        image_size: int = 64,
        control_mode: str = "pd_ee_delta_pose",
        backend: Literal["auto", "cpu", "gpu"] = "auto",
        max_episode_steps: int | None = None,
        camera: str | None = None,
        reward_mode: Literal["normalized_dense", "dense", "sparse"] = "normalized_dense",
        timeout_s: float = 300.0,
        device: str = "cpu",
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if task not in TASKS:
            raise ValueError(
                f"unknown or unsupported ManiSkill task {task!r}; supported (no asset download needed): "
                f"{', '.join(TASKS)}"
            )
        if image_size < 8:
            raise ValueError(f"image_size must be >= 8, got {image_size}")
        if backend not in ("auto", "cpu", "gpu"):
            raise ValueError(f"backend must be 'auto', 'cpu' or 'gpu', got {backend!r}")
        if reward_mode not in ("normalized_dense", "dense", "sparse"):
            raise ValueError(f"reward_mode must be 'normalized_dense', 'dense' or 'sparse', got {reward_mode!r}")
        if max_episode_steps is not None and max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        if backend == "auto":
            backend = "gpu" if torch.cuda.is_available() else "cpu"
        if backend == "gpu" and not torch.cuda.is_available():
            raise ValueError("backend='gpu' needs CUDA, which torch does not see; use backend='cpu'")

        self.num_envs = num_envs
        self.task = task
        self.image_size = image_size
        self.control_mode = control_mode
        self.backend = backend
        self.device = torch.device(device)
        self.instruction = TASKS[task]
        spec = dict(
            task=task,
            image_size=image_size,
            control_mode=control_mode,
            max_episode_steps=max_episode_steps,
            camera=camera,
            reward_mode=reward_mode,
        )
        worlds_cls = _GpuWorlds if backend == "gpu" else _WorkerPool
        self._worlds: _GpuWorlds | _WorkerPool = worlds_cls(num_envs, spec, timeout_s)
        info = self._worlds.info
        self.max_episode_steps: int = info["max_episode_steps"]
        self.camera: str = info["camera"]
        self.action_low = torch.as_tensor(info["action_low"], dtype=torch.float32).clone()  # [D]
        self.action_high = torch.as_tensor(info["action_high"], dtype=torch.float32).clone()  # [D]
        self.action_dim = int(self.action_low.shape[0])
        state_dim = int(info["state_dim"])

        size = image_size
        self._images = torch.zeros(num_envs, size, size, 3, dtype=torch.uint8)  # [N, H, W, 3]
        self._states = torch.zeros(num_envs, state_dim, dtype=torch.float32)  # [N, S]
        self._terminated = torch.zeros(num_envs, dtype=torch.bool)  # [N]
        self._truncated = torch.zeros(num_envs, dtype=torch.bool)  # [N]
        self._success = torch.zeros(num_envs, dtype=torch.bool)  # [N]
        self._was_reset = torch.zeros(num_envs, dtype=torch.bool)  # [N]

    def reset(self, seed: int | Sequence[int], env_ids: Sequence[int] | None = None) -> Observation:
        """Start new episodes in the worlds `env_ids` (all when None).

        Args:
            seed: One seed per reset world, or an int from which world k of `env_ids` gets `seed + k`.
            env_ids: Indices of the worlds to reset; None resets all N. The other worlds are left untouched.

        Returns:
            The observation of all N worlds (copies): image `[N, H, W, 3]` uint8, N instructions, state `[N, S]`.
        """
        ids = resolve_env_ids(env_ids, self.num_envs)
        seeds = resolve_seeds(seed, len(ids))
        if ids:
            out = self._worlds.reset(ids, seeds)
            index = torch.tensor(ids, dtype=torch.long)
            self._images[index] = out["image"]
            self._states[index] = out["state"]
            self._terminated[index] = False
            self._truncated[index] = False
            self._success[index] = False
            self._was_reset[index] = True
        return self._observation()

    def step(self, actions: torch.Tensor) -> StepResult:
        """Apply one action per world; worlds whose episode ended stay frozen (module docstring).

        Args:
            actions: `[N, D]` float actions in the controller's space (`action_low` .. `action_high`; ManiSkill
                clips what lies outside).

        Returns:
            A StepResult: observation of all N worlds, reward `[N]` float32, terminated and truncated `[N]` bool,
            info: `success` `[N]` bool, `reward_components` (`dense`, `normalized_dense`, `success`: `[N]` float32),
            `elapsed_steps` `[N]` int64 (steps since the world's reset).

        Raises:
            ValueError: `actions` has the wrong shape or non-finite entries.
            RuntimeError: Some worlds were never reset, or a worker died or hung.
        """
        actions = torch.as_tensor(actions)
        if tuple(actions.shape) != (self.num_envs, self.action_dim):
            raise ValueError(f"actions must be [N={self.num_envs}, D={self.action_dim}], got {tuple(actions.shape)}")
        actions = actions.detach().to(device="cpu", dtype=torch.float32)
        if not bool(torch.isfinite(actions).all()):
            raise ValueError("actions have non-finite entries")
        never = (~self._was_reset).nonzero().flatten().tolist()
        if never:
            raise RuntimeError(f"worlds {never} were never reset; call reset(seed=...) first")

        n = self.num_envs
        reward = torch.zeros(n, dtype=torch.float32)  # [N], 0 for frozen worlds
        components = {name: torch.zeros(n, dtype=torch.float32) for name in REWARD_COMPONENTS}  # each [N]
        active = (~(self._terminated | self._truncated)).nonzero().flatten().tolist()
        if active:
            out = self._worlds.step(active, actions[active].clone())
            index = torch.tensor(active, dtype=torch.long)
            self._images[index] = out["image"]
            self._states[index] = out["state"]
            self._terminated[index] = out["terminated"]
            self._truncated[index] = out["truncated"]
            self._success[index] = out["success"]
            reward[index] = out["reward"]
            components["dense"][index] = out["dense"]
            components["normalized_dense"][index] = out["normalized_dense"]
            components["success"][index] = out["success"].to(torch.float32)
        return StepResult(
            obs=self._observation(),
            reward=self._out(reward),
            terminated=self._out(self._terminated),
            truncated=self._out(self._truncated),
            info={
                "success": self._out(self._success),
                "reward_components": {name: self._out(value) for name, value in components.items()},
                "elapsed_steps": self._out(self._worlds.elapsed_steps()),
            },
        )

    def close(self) -> None:
        """Stop the workers (CPU) or release the simulator (GPU). Safe to call twice."""
        self._worlds.close()

    def __del__(self) -> None:
        worlds = getattr(self, "_worlds", None)
        if worlds is not None:
            try:
                worlds.close()
            except Exception:  # noqa: BLE001  (interpreter shutdown: modules may be half torn down)
                pass

    def _observation(self) -> Observation:
        return Observation(
            image=self._out(self._images),
            instruction=[self.instruction] * self.num_envs,
            state=self._out(self._states),
        )

    def _out(self, tensor: torch.Tensor) -> torch.Tensor:
        """A fresh copy on `device`: callers may keep or scribble on what they get (ManiSkill PR #828)."""
        return tensor.to(self.device, copy=True)


# ---------------------------------------------------------------------------------------------------------------
# Shared by both backends: environment variables, building a ManiSkill env, reading its outputs
# ---------------------------------------------------------------------------------------------------------------


def maniskill_env_defaults() -> dict[str, str]:
    """Environment variables ManiSkill/SAPIEN should see, for those not set already.

    `MS_ASSET_DIR`: ManiSkill's default (`~/.maniskill`) where it is writable, else a folder under the temp dir.
    `VK_ICD_FILENAMES`: Mesa's lavapipe (software Vulkan), where installed, so SAPIEN never picks a broken ICD.
    `MUJOCO_GL`: `egl`, since importing mani_skill imports mujoco (see below).
    `MS_RENDERER_LOG_LEVEL`: only errors from SAPIEN's renderer (it warns once per world otherwise).
    """
    found: dict[str, str] = {}
    if "MS_ASSET_DIR" not in os.environ:
        home = os.path.join(os.path.expanduser("~"), ".maniskill")
        try:
            os.makedirs(home, exist_ok=True)
            writable = os.access(home, os.W_OK)
        except OSError:
            writable = False
        found["MS_ASSET_DIR"] = (
            home if writable else os.path.join(tempfile.gettempdir(), f"mmrl-maniskill-{os.getuid()}")
        )
    if "VK_ICD_FILENAMES" not in os.environ and "VK_DRIVER_FILES" not in os.environ:
        icds = [path for pattern in _LAVAPIPE_ICDS for path in sorted(glob.glob(pattern))]
        if icds:
            found["VK_ICD_FILENAMES"] = icds[0]
    if "MUJOCO_GL" not in os.environ:
        # `import mani_skill` imports mujoco, which picks its GL backend once, at import: GLFW unless told otherwise,
        # and GLFW needs a display. EGL keeps MuJoCo envs in the same process rendering (as sim.robotics does).
        found["MUJOCO_GL"] = "egl"
    if "MS_RENDERER_LOG_LEVEL" not in os.environ:
        found["MS_RENDERER_LOG_LEVEL"] = "error"
    return found


def _make_maniskill(spec: dict[str, Any], num_envs: int, sim_backend: str, render_backend: str) -> tuple[Any, int]:
    """Build the ManiSkill env (imports mani_skill here, never at module import) and say its episode length."""
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401  (registers the tasks)
    from mani_skill.utils.registration import REGISTERED_ENVS

    max_steps = spec["max_episode_steps"] or REGISTERED_ENVS[spec["task"]].max_episode_steps
    size = spec["image_size"]
    try:
        env = gym.make(
            spec["task"],
            num_envs=num_envs,
            obs_mode="rgb+state",
            reward_mode=spec["reward_mode"],
            control_mode=spec["control_mode"],
            render_mode=None,
            sensor_configs=dict(width=size, height=size),
            sim_backend=sim_backend,
            render_backend=render_backend,
            max_episode_steps=max_steps,
        )
    except AssertionError as error:  # ManiSkill asserts on an unknown control mode; say which ones exist
        raise ValueError(
            f"ManiSkill refused {spec['task']} with control_mode={spec['control_mode']!r}: {error}"
        ) from error
    return env, int(max_steps)


def _env_info(env: Any, obs: dict, spec: dict[str, Any], max_steps: int) -> dict[str, Any]:
    """What the parent needs to know about a freshly built env."""
    cameras = list(obs["sensor_data"])
    camera = spec["camera"] or cameras[0]
    if camera not in cameras:
        raise ValueError(f"task {spec['task']} has no camera {camera!r}; cameras: {', '.join(cameras)}")
    space = env.unwrapped.single_action_space
    return dict(
        camera=camera,
        max_episode_steps=max_steps,
        action_low=np.asarray(space.low, dtype=np.float32).copy(),
        action_high=np.asarray(space.high, dtype=np.float32).copy(),
        state_dim=int(obs["state"].shape[-1]),
    )


def _read_obs(obs: dict, camera: str) -> dict[str, torch.Tensor]:
    """Image `[B, H, W, 3]` uint8 and state `[B, S]` float32 of a ManiSkill observation, as CPU copies."""
    return {
        "image": obs["sensor_data"][camera]["rgb"].detach().to("cpu", torch.uint8).clone(),
        "state": obs["state"].detach().to("cpu", torch.float32).clone(),
    }


def _read_step(
    env: Any, obs: dict, reward: Any, terminated: Any, truncated: Any, info: dict, action: torch.Tensor, camera: str
) -> dict[str, torch.Tensor]:
    """Everything a step reports for a batch of B worlds, as CPU copies; reward components recomputed from `info`."""
    base = env.unwrapped
    dense = base.compute_dense_reward(obs=obs, action=action, info=info)
    normalized = base.compute_normalized_dense_reward(obs=obs, action=action, info=info)
    success = torch.as_tensor(info["success"]).reshape(-1)

    def cpu(x: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(x).detach().reshape(-1).to("cpu", dtype).clone()

    return {
        **_read_obs(obs, camera),
        "reward": cpu(reward, torch.float32),
        "terminated": cpu(terminated, torch.bool),
        "truncated": cpu(truncated, torch.bool),
        "success": cpu(success, torch.bool),
        "dense": cpu(dense, torch.float32),
        "normalized_dense": cpu(normalized, torch.float32),
    }


def _explain(error: BaseException) -> str:
    """A one-line reason for a failed build/reset, with the setup hint when it is about Vulkan."""
    text = f"{type(error).__name__}: {error}"
    if any(word in text.lower() for word in ("vk::", "vulkan", "renderer", "render device")):
        text += f"; SAPIEN could not render: {SETUP_HINT}"
    return text


# ---------------------------------------------------------------------------------------------------------------
# CPU backend: one worker process per world
# ---------------------------------------------------------------------------------------------------------------

_POLL_S = 0.5  # how often a waiting parent checks that the worker it waits for is still alive


def _worker_main(conn: Connection, spec: dict[str, Any], env_vars: dict[str, str]) -> None:
    """One world: build a CPU ManiSkill env, then answer ("reset", seed) / ("step", action) / ("close",)."""
    for key, value in env_vars.items():
        os.environ.setdefault(key, value)
    torch.set_num_threads(1)  # one small world per process: threads only fight over the shared cores
    try:
        env, max_steps = _make_maniskill(spec, num_envs=1, sim_backend="physx_cpu", render_backend="cpu")
        # The first reset rebuilds the scene (ManiSkill "reconfigures"); do it now so that every reset the caller
        # asks for takes the same path and the same seed gives the same state.
        obs, _ = env.reset(seed=0)
        info = _env_info(env, obs, spec, max_steps)
    except BaseException as error:  # noqa: BLE001  (everything goes back to the parent, which raises)
        conn.send(("error", _explain(error), traceback.format_exc()))
        return
    conn.send(("ready", info))
    camera = info["camera"]
    while True:
        try:
            command, *args = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if command == "close":
            break
        try:
            if command == "reset":
                obs, _ = env.reset(seed=int(args[0]))
                out = _read_obs(obs, camera)
            elif command == "step":
                action = torch.as_tensor(args[0], dtype=torch.float32).reshape(1, -1)  # [1, D]
                obs, reward, terminated, truncated, step_info = env.step(action)
                out = _read_step(env, obs, reward, terminated, truncated, step_info, action, camera)
            else:
                raise ValueError(f"unknown command {command!r}")
            out["elapsed_steps"] = torch.as_tensor(env.unwrapped.elapsed_steps).reshape(-1).to(torch.int64).clone()
            conn.send(("ok", {k: v.numpy() for k, v in out.items()}))
        except BaseException as error:  # noqa: BLE001
            conn.send(("error", _explain(error), traceback.format_exc()))
    env.close()
    conn.close()
    # Skip the interpreter's teardown of torch and SAPIEN (about 2 s a worker); nothing is left to flush but stdio.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class _WorkerPool:
    """N worker processes, one ManiSkill CPU env each, driven in lockstep over pipes."""

    def __init__(self, num_envs: int, spec: dict[str, Any], timeout_s: float):
        self.spec = spec
        self.timeout_s = timeout_s
        self._elapsed = torch.zeros(num_envs, dtype=torch.int64)  # [N]
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._closed = False
        ctx = mp.get_context("spawn")  # fork would copy torch's and SAPIEN's threads and locks half-initialised
        env_vars = maniskill_env_defaults()
        try:
            for k in range(num_envs):
                parent, child = ctx.Pipe()
                proc = ctx.Process(
                    target=_worker_main, args=(child, spec, env_vars), name=f"maniskill-{k}", daemon=True
                )
                proc.start()
                child.close()  # so that the parent sees EOF when the worker dies
                self._procs.append(proc)
                self._conns.append(parent)
            infos = [self._recv(k, "start") for k in range(num_envs)]
        except BaseException:
            self.close()
            raise
        self.info = infos[0]

    def reset(self, ids: list[int], seeds: list[int]) -> dict[str, torch.Tensor]:
        outs = self._call(ids, [("reset", s) for s in seeds], "reset")
        self._elapsed[ids] = 0
        return outs

    def step(self, ids: list[int], actions: torch.Tensor) -> dict[str, torch.Tensor]:
        outs = self._call(ids, [("step", a.numpy()) for a in actions], "step")
        self._elapsed[ids] = outs["elapsed_steps"]
        return outs

    def elapsed_steps(self) -> torch.Tensor:
        return self._elapsed.clone()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            try:
                conn.send(("close",))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 5.0
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()

    def _call(self, ids: list[int], messages: list[tuple], what: str) -> dict[str, torch.Tensor]:
        """Send one message to each worker of `ids`, then gather their answers stacked in `ids` order."""
        if self._closed:
            raise RuntimeError("the ManiSkill workers are closed (after close() or an earlier worker failure)")
        try:
            for k, message in zip(ids, messages):
                self._conns[k].send(message)
            outs = [self._recv(k, what) for k in ids]
        except BaseException:
            # A worker that failed or hung leaves the others out of step with the caller: stop them all.
            self.close()
            raise
        return {key: torch.stack([torch.from_numpy(out[key]) for out in outs]).squeeze(1) for key in outs[0]}

    def _recv(self, k: int, what: str) -> Any:
        """Worker k's answer; raise, naming the worker, if it fails, dies or says nothing for `timeout_s`."""
        conn, proc = self._conns[k], self._procs[k]
        where = f"ManiSkill worker {k} ({self.spec['task']}, pid {proc.pid}) during {what}"
        deadline = time.monotonic() + self.timeout_s
        while not conn.poll(_POLL_S):
            if not proc.is_alive():
                raise RuntimeError(f"{where} died with exit code {proc.exitcode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{where} gave no answer within {self.timeout_s:.0f} s")
        try:
            status, *payload = conn.recv()
        except (EOFError, OSError):  # EOF, or "connection reset" when the worker was killed mid-write
            proc.join(timeout=1.0)
            raise RuntimeError(f"{where} died with exit code {proc.exitcode}") from None
        if status == "error":
            reason, trace = payload
            raise RuntimeError(f"{where} failed: {reason}\n--- worker traceback ---\n{trace}")
        return payload[0]


# ---------------------------------------------------------------------------------------------------------------
# GPU backend: one ManiSkill env holding all N worlds (physx_cuda). Not yet run on a GPU.
# ---------------------------------------------------------------------------------------------------------------


class _GpuWorlds:
    """All N worlds in one GPU-parallel ManiSkill env, driven in this process."""

    def __init__(self, num_envs: int, spec: dict[str, Any], timeout_s: float):
        del timeout_s  # nothing to wait for: the simulator runs in this process
        for key, value in maniskill_env_defaults().items():
            os.environ.setdefault(key, value)  # read by ManiSkill/SAPIEN at import and env creation
        self.num_envs = num_envs
        self.spec = spec
        self._env, max_steps = _make_maniskill(spec, num_envs, sim_backend="physx_cuda", render_backend="gpu")
        # The first reset reconfigures the scenes and must be a full one (ManiSkill refuses a partial reconfigure).
        obs, _ = self._env.reset(seed=list(range(num_envs)))
        self.info = _env_info(self._env, obs, spec, max_steps)
        self._device = self._env.unwrapped.device
        self._closed = False

    def reset(self, ids: list[int], seeds: list[int]) -> dict[str, torch.Tensor]:
        # One world per call: a batched reset seeds its torch randomness from the first seed only, which would make
        # a world's start depend on its neighbours' seeds. A single-world partial reset seeds it from its own seed.
        obs = None
        # The seed is repeated N times so that both ManiSkill's torch seed (its first entry) and world i's row of
        # its batched numpy RNG (entry i) come from this world's seed, as in a one-world CPU env.
        for i, seed in zip(ids, seeds):
            env_idx = torch.tensor([i], device=self._device)
            obs, _ = self._env.reset(seed=[seed] * self.num_envs, options={"env_idx": env_idx})
        assert obs is not None
        out = _read_obs(obs, self.info["camera"])
        return {key: value[ids] for key, value in out.items()}

    def step(self, ids: list[int], actions: torch.Tensor) -> dict[str, torch.Tensor]:
        # Every world steps (the GPU scene is one batch); frozen worlds get zero actions and their results are
        # dropped by the caller, which keeps their last observation.
        full = torch.zeros(self.num_envs, actions.shape[1], dtype=torch.float32)  # [N, D]
        full[ids] = actions
        full = full.to(self._device)
        obs, reward, terminated, truncated, info = self._env.step(full)
        out = _read_step(self._env, obs, reward, terminated, truncated, info, full, self.info["camera"])
        return {key: value[ids] for key, value in out.items()}

    def elapsed_steps(self) -> torch.Tensor:
        return torch.as_tensor(self._env.unwrapped.elapsed_steps).detach().to("cpu", torch.int64).clone()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()
