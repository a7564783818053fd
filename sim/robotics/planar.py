"""The planar MuJoCo base of `reach` and `push`: small tasks seen from above (scenes in `sim/robotics/mjcf/`).

Both are built to be learnable by a tiny VLA from a 64x64 image within a handful of steps: a top-down orthographic
camera shows the whole square workspace on a plain light floor, under flat light, with saturated colours.

**Common to both.** The workspace is the square `[-0.2, 0.2]^2` metres (MJCF scenes in `sim/robotics/mjcf/`). A dark
gripper disc (radius 0.02 m, about 10% of the workspace width in diameter) rides two slide joints with position
servos. The image has +x to the right and +y up.

**Action** `[N, D=2]` float in `[-1, 1]` (values outside are clipped, NaN counts as 0): the gripper's setpoint moves
to `gripper_xy + action * action_scale`, clipped to the workspace, and the physics runs `frame_skip` sub-steps of
10 ms. The servo gains are tuned so that the gripper ends the env step within about 0.1 mm of that setpoint when
nothing blocks it, so an action maps simply to a displacement. The default `action_scale=0.05` crosses half the
workspace (0.2 m) in 4 steps.

**Observation.** `image` uint8 `[N, H, W, 3]` from the top camera (H = W = `image_size`, a multiple of 32; with
`camera=["top", "ego"]`, `[N, 2, H, W, 3]`, both cameras);
`instruction`, N strings; `state` float32 `[N, S]` privileged state, in metres (layouts below); `proprio` float32
`[N, 4]`, what the robot measures of itself: the gripper's position (x, y, metres) and velocity (x, y, m/s), never
a target's or a block's position.

**Backends.** `backend="mujoco"` (default) steps each world with `mj_step` and renders it with OpenGL on the CPU.
`backend="warp"` steps all N worlds as one MuJoCo Warp batch and ray-traces their N images at once, on the env's
`device` (a GPU; the CPU works, slowly); the task logic is the same host code. The two agree to about 1e-5 m and a
few grey levels (sim/robotics/warp_backend.py).

**Finished worlds.** There is no autoreset. A world whose episode ended (terminated or truncated) is frozen until
it is reset: `step` ignores its action, does not advance its physics, returns its last image and state, reward 0
and every reward component 0, and repeats its final `terminated`, `truncated` and `success`.

The tasks: `sim/robotics/reach.py` and `sim/robotics/push.py` (their Task, Randomizations, Success, Reward, State
and Expert sections are in those modules).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from sim.base import (
    Observation,
    StepResult,
    check_continuous_actions,
    check_expert_noise,
    resolve_env_ids,
    resolve_seeds,
)
from sim.robotics.warp_backend import WarpWorlds

MJCF_DIR = Path(__file__).resolve().parent / "mjcf"  # package data, installed with `sim`
# Names only: the RGBA values live in the MJCF files (one mocap body per colour, named "<prefix>_<colour>").
COLOURS = ("red", "green", "blue", "yellow")
PARKED = np.array([5.0, 0.0, 0.0])  # mocap position of a disc or square a world does not use: far out of view
_SHADOW_MAP = 2048  # shadow map side when shadows=True (MuJoCo's default 4096 costs about 4x more per frame)


def import_mujoco() -> Any:
    """Import `mujoco` with an offscreen GL backend chosen first (EGL unless the caller set `MUJOCO_GL`).

    MuJoCo reads `MUJOCO_GL` once, when it is first imported, so this must run before any other import of it.

    Raises:
        ImportError: MuJoCo could not load the chosen GL backend, with the likely fix. A machine with NVIDIA's EGL
            driver but without glvnd's `libEGL.so.1` fails inside PyOpenGL with `'NoneType' object has no attribute
            'eglQueryString'`, which names neither.
    """
    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        import mujoco
    except (AttributeError, RuntimeError, OSError) as error:
        backend = os.environ["MUJOCO_GL"]
        raise ImportError(
            f"mujoco could not load its GL backend MUJOCO_GL={backend!r}: {type(error).__name__}: {error}. "
            "MUJOCO_GL=egl needs libEGL.so.1 (apt-get install libegl1, with a GPU driver's or Mesa's EGL); "
            "MUJOCO_GL=osmesa needs libOSMesa (apt-get install libosmesa6)."
        ) from error
    return mujoco


def offscreen_renderer(model: Any, height: int, width: int) -> Any:
    """A `mujoco.Renderer`, with a hint when no GL backend could make a context.

    Raises:
        RuntimeError: No offscreen GL context (usually `mujoco` was imported before `MUJOCO_GL` was set, so it chose
            GLFW, which needs a display).
    """
    mujoco = import_mujoco()
    try:
        return mujoco.Renderer(model, height, width)
    except mujoco.FatalError as error:
        raise RuntimeError(
            f"could not create an offscreen MuJoCo renderer (MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}): {error}. "
            "MuJoCo picks its GL backend when first imported; set MUJOCO_GL=egl (or osmesa) in the environment, or "
            "import sim.robotics before anything imports mujoco."
        ) from error


def saturated_action(delta: np.ndarray, action_scale: float) -> np.ndarray:
    """Proportional control in action units, scaled down so that no coordinate exceeds 1, keeping the direction.

    Args:
        delta: Displacements to make, in metres, `[N, 2]`.
        action_scale: Metres moved by an action of 1.

    Returns:
        Actions `[N, 2]` in `[-1, 1]`.
    """
    action = delta / action_scale  # [N, 2]
    # Dividing by the largest coordinate (when above 1) keeps the direction, where clipping each axis would bend it.
    peak = np.maximum(np.abs(action).max(axis=1, keepdims=True), 1.0)  # [N, 1]
    return action / peak


class PlanarMujocoEnv:
    """N worlds of a planar MuJoCo task sharing one `MjModel` and one offscreen renderer (one `MjData` each).

    Subclasses name their scene (`_xml`) and implement `_init_world`, `_measure`, `_score` and `_state`; this class
    does the seeding, stepping, rendering and the bookkeeping of finished worlds (see the module docstring).

    Args:
        num_envs: N, the number of worlds.
        image_size: Side of the square images in pixels; a multiple of 32.
        max_episode_steps: Steps after which a world is truncated (default: the task's `default_max_episode_steps`).
        action_scale: Metres the gripper's setpoint moves for an action of 1.
        frame_skip: Physics sub-steps (of 10 ms) per env step. The servo is tuned for the default 10.
        reward: `"dense"` (shaped) or `"sparse"` (1 on success only); a task may add modes (`reward_modes`).
        shadows: Render shadows of the scene's sun light. Off by default: shadow maps dominate CPU render time.
        camera: `"top"`, the fixed view of the whole workspace, or `"ego"`, an egocentric view that rides with the
            gripper (0.64 m across, the gripper at the centre): the action then depends only on where the target
            appears in the image, which a small policy learns much faster. A list (`["top", "ego"]`) renders every
            camera: the observation is then `[N, V, H, W, 3]`, the views in that order (the `mujoco` backend).
        device: Where the returned tensors live, and where the `warp` backend runs.
        backend: `"mujoco"` (default): plain MuJoCo on the CPU, one `mj_step` and one OpenGL render per world.
            `"warp"`: all N worlds stepped and ray-traced as one batch by MuJoCo Warp on `device` (a GPU; the CPU
            works but is slow), see sim/robotics/warp_backend.py. Needs the `warp` extra.
    """

    action_kind = "continuous"
    action_dim = 2
    _xml: str = ""  # scene file in MJCF_DIR
    default_max_episode_steps = 8  # a task's episode limit when `max_episode_steps` is not given
    reward_modes: tuple[str, ...] = ("dense", "sparse")  # the `reward` values a task implements

    def __init__(
        self,
        num_envs: int,
        image_size: int = 64,
        max_episode_steps: int | None = None,
        action_scale: float = 0.05,
        frame_skip: int = 10,
        reward: str = "dense",
        shadows: bool = False,
        device: str = "cpu",
        camera: Literal["top", "ego"] | list[Literal["top", "ego"]] = "top",
        backend: Literal["mujoco", "warp"] = "mujoco",
    ):
        max_episode_steps = self.default_max_episode_steps if max_episode_steps is None else max_episode_steps
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if image_size < 32 or image_size % 32:
            raise ValueError(f"image_size must be a positive multiple of 32, got {image_size}")
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        if action_scale <= 0 or frame_skip < 1:
            raise ValueError(f"need action_scale > 0 and frame_skip >= 1, got {action_scale}, {frame_skip}")
        if reward not in self.reward_modes:
            raise ValueError(f"reward must be one of {', '.join(map(repr, self.reward_modes))}, got {reward!r}")
        cameras = [camera] if isinstance(camera, str) else list(camera)
        if not cameras or any(c not in ("top", "ego") for c in cameras) or len(set(cameras)) != len(cameras):
            raise ValueError(f"camera must be 'top', 'ego' or a list of distinct ones, got {camera!r}")
        if len(cameras) > 1 and backend != "mujoco":
            raise ValueError(f"several cameras ({cameras}) need backend='mujoco'; the warp renderer draws one")
        if backend not in ("mujoco", "warp"):
            raise ValueError(f"backend must be 'mujoco' or 'warp', got {backend!r}")
        mujoco = import_mujoco()
        self._mujoco = mujoco
        self.num_envs = num_envs
        self.image_size = image_size
        self.max_episode_steps = max_episode_steps
        self.action_scale = float(action_scale)
        self.frame_skip = frame_skip
        self.reward_mode = reward
        self.shadows = shadows
        self.device = torch.device(device)
        self.action_low = torch.full((self.action_dim,), -1.0, dtype=torch.float32)  # [D]
        self.action_high = torch.full((self.action_dim,), 1.0, dtype=torch.float32)  # [D]

        self.model = mujoco.MjModel.from_xml_path(str(MJCF_DIR / self._xml))
        self.model.light_castshadow[:] = shadows
        if shadows:
            # The shadow map is allocated with the render context, so it must be sized before the renderer exists.
            self.model.vis.quality.shadowsize = _SHADOW_MAP
        # One MjData per world. With backend="warp" they are the host mirror where seeding and task logic run.
        self.datas = [mujoco.MjData(self.model) for _ in range(num_envs)]
        self._cameras = []
        for name in cameras:
            view = mujoco.MjvCamera()
            view.type = mujoco.mjtCamera.mjCAMERA_FIXED
            view.fixedcamid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, name)
            self._cameras.append(view)
        self._camera = self._cameras[0]  # the first view: what `world_to_pixel` maps to
        self.camera = cameras[0]
        self.cameras = tuple(cameras)
        self.backend = backend
        self._renderer = None
        self._warp: WarpWorlds | None = None
        if backend == "warp":
            self._warp = WarpWorlds(self.model, num_envs, image_size, self._camera.fixedcamid, shadows, self.device)
        else:
            self._renderer = offscreen_renderer(self.model, image_size, image_size)

        joint_x = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, "gripper_x")
        self._gripper_qpos = int(self.model.jnt_qposadr[joint_x])  # gripper_y follows gripper_x in qpos
        self._gripper_dof = int(self.model.jnt_dofadr[joint_x])  # and in qvel
        self.half_width = float(self.model.jnt_range[joint_x, 1])  # the workspace is [-half_width, half_width]^2
        self.workspace_size = 2.0 * self.half_width
        self.gripper_radius = float(self.model.geom_size[self._geom("gripper"), 0])

        views = () if len(cameras) == 1 else (len(cameras),)
        self._images = np.zeros((num_envs, *views, image_size, image_size, 3), dtype=np.uint8)  # [N, (V,) H, W, 3]
        self._instructions = [""] * num_envs
        self._elapsed = np.zeros(num_envs, dtype=np.int64)  # [N] steps since the world's reset
        self._terminated = np.zeros(num_envs, dtype=bool)  # [N]
        self._truncated = np.zeros(num_envs, dtype=bool)  # [N]
        self._success = np.zeros(num_envs, dtype=bool)  # [N]
        self._was_reset = np.zeros(num_envs, dtype=bool)  # [N] stepping a world never reset is an error
        self._measured = np.zeros((num_envs, 0))  # [N, M] `_measure()` after the last reset or step

    # ------------------------------------------------------------------------------------------------ contract
    def reset(self, seed: int | Sequence[int], env_ids: Sequence[int] | None = None) -> Observation:
        """Rebuild the worlds `env_ids` (all when None) from their seeds.

        Args:
            seed: One seed per reset world, or an int from which world k of `env_ids` gets `seed + k`.
            env_ids: Indices of the worlds to reset; None resets all N.

        Returns:
            The observation of all N worlds (copies): image `[N, H, W, 3]` uint8, N instructions, state `[N, S]`.
        """
        ids = resolve_env_ids(env_ids, self.num_envs)
        seeds = resolve_seeds(seed, len(ids))
        mujoco = self._mujoco
        for k, world_seed in zip(ids, seeds):
            data = self.datas[k]
            mujoco.mj_resetData(self.model, data)
            # One generator per world, seeded by that world's seed only, so a world never depends on its neighbours.
            self._init_world(k, np.random.default_rng(world_seed))
            data.ctrl[:2] = data.qpos[self._gripper_qpos : self._gripper_qpos + 2]  # hold still until told to move
            mujoco.mj_forward(self.model, data)
            if self._warp is None:
                self._render(k)
        if self._warp is not None:
            self._warp.upload(ids, self.datas)
            self._images[ids] = self._warp.render().numpy()[ids]
        self._elapsed[ids] = 0
        self._terminated[ids] = False
        self._truncated[ids] = False
        self._success[ids] = False
        self._was_reset[ids] = True
        self._measured = self._measure()
        return self._observation()

    def step(self, actions: torch.Tensor) -> StepResult:
        """Move every live world's gripper by `actions * action_scale`, simulate, render and score.

        Args:
            actions: `[N, D=2]` float; clipped to `[action_low, action_high]`, NaN read as 0.

        Returns:
            A StepResult: observation of all worlds, reward `[N]` float32, terminated and truncated `[N]` bool, and
            info with `success` `[N]` bool and `reward_components` (name -> `[N]` float32). Worlds that had already
            ended are unchanged and get reward 0 (see the module docstring).

        Raises:
            ValueError: `actions` is not `[N, 2]`.
            RuntimeError: Some world was never reset.
        """
        action = check_continuous_actions(actions, self.num_envs, self.action_dim)  # [N, D] float64, NaN -> 0
        if not self._was_reset.all():
            raise RuntimeError(f"worlds {np.flatnonzero(~self._was_reset).tolist()} were never reset; reset first")
        live = ~(self._terminated | self._truncated)  # [N]
        before = self._measured  # task quantities before the step (kept from the last reset or step)
        model, mujoco, g = self.model, self._mujoco, self._gripper_qpos
        for k in np.flatnonzero(live):
            data = self.datas[k]
            # The setpoint moves from where the gripper IS (not from the last setpoint), so a blocked gripper does
            # not wind up; ctrlrange (the workspace) clamps it.
            setpoint = data.qpos[g : g + 2] + action[k] * self.action_scale
            data.ctrl[:2] = np.clip(setpoint, -self.half_width, self.half_width)
            if self._warp is None:
                mujoco.mj_step(model, data, nstep=self.frame_skip)
                self._render(k)
        if self._warp is not None:
            self._step_warp(live)
        self._elapsed[live] += 1
        after = self._measured = self._measure()
        success, components = self._score(before, after)  # [N] bool, name -> [N] float64
        success &= live
        reward = sum(w * components[name] for name, w in self._reward_weights().items())  # [N]
        reward = np.where(live, reward, 0.0)
        self._success[live] = success[live]
        self._terminated |= success
        self._truncated |= live & ~success & (self._elapsed >= self.max_episode_steps)
        info = {
            "success": self._tensor(self._success.copy()),
            "reward_components": {
                name: self._tensor(np.where(live, value, 0.0).astype(np.float32)) for name, value in components.items()
            },
        }
        return StepResult(
            obs=self._observation(),
            reward=self._tensor(reward.astype(np.float32)),
            terminated=self._tensor(self._terminated.copy()),
            truncated=self._tensor(self._truncated.copy()),
            info=info,
        )

    def _step_warp(self, live: np.ndarray) -> None:
        """Advance the live worlds on the device in one batch, mirror their state to the host and draw them."""
        assert self._warp is not None
        ctrl = np.stack([data.ctrl for data in self.datas])  # [N, nu]
        qpos, qvel = self._warp.step(ctrl, live, self.frame_skip)  # [N, nq], [N, nv]
        for k in np.flatnonzero(live):
            self.datas[k].qpos[:] = qpos[k]
            self.datas[k].qvel[:] = qvel[k]
        self._images[live] = self._warp.render().numpy()[live]

    def close(self) -> None:
        """Free the render context (the GL context and its buffers), or the MuJoCo Warp model, data and images."""
        renderer, self._renderer = getattr(self, "_renderer", None), None
        if renderer is not None:
            renderer.close()
        self._warp = None

    # ------------------------------------------------------------------------------------------------ helpers
    @property
    def gripper_xy(self) -> np.ndarray:
        """Every world's gripper centre `[N, 2]` float64, in metres (a copy)."""
        g = self._gripper_qpos
        return np.stack([data.qpos[g : g + 2] for data in self.datas])

    def world_to_pixel(self, xy: np.ndarray, world: int | None = None) -> np.ndarray:
        """Pixel coordinates (column, row) of floor points as the env's camera sees them.

        Args:
            xy: Points on the floor in metres, `[..., 2]`.
            world: The world whose image is meant; needed with `camera="ego"` (the view follows that world's
                gripper), ignored with the fixed top camera.

        Returns:
            `[..., 2]` float (column, row), with (0, 0) the top-left corner of the image.
        """
        extent = float(self.model.cam_fovy[self._camera.fixedcamid])  # orthographic: the view's height in metres
        scale = self.image_size / extent  # pixels per metre
        if self.camera == "ego":
            if world is None:
                raise ValueError("world_to_pixel with camera='ego' needs the world whose gripper the view follows")
            xy = xy - self.gripper_xy[world]
        column = (xy[..., 0] + extent / 2) * scale
        row = (extent / 2 - xy[..., 1]) * scale  # +y is up in the image
        return np.stack([column, row], axis=-1)

    def _render(self, k: int) -> None:
        if len(self._cameras) == 1:
            self._renderer.update_scene(self.datas[k], camera=self._camera)
            self._renderer.render(out=self._images[k])
            return
        for v, view in enumerate(self._cameras):
            self._renderer.update_scene(self.datas[k], camera=view)
            self._renderer.render(out=self._images[k, v])

    def _observation(self) -> Observation:
        return Observation(
            image=self._tensor(self._images.copy()),
            instruction=list(self._instructions),
            state=self._tensor(self._state().astype(np.float32)),
            proprio=self._tensor(self._proprio().astype(np.float32)),
        )

    def _proprio(self) -> np.ndarray:
        """`[N, 4]` float64: each gripper's position and velocity (x, y, vx, vy), a fresh array."""
        g, v = self._gripper_qpos, self._gripper_dof
        return np.stack([np.concatenate([data.qpos[g : g + 2], data.qvel[v : v + 2]]) for data in self.datas])

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        # `array` is always a fresh array here, so from_numpy hands out memory no one else holds.
        tensor = torch.from_numpy(array)
        return tensor if self.device.type == "cpu" else tensor.to(self.device)

    def _geom(self, name: str) -> int:
        return self._mujoco.mj_name2id(self.model, self._mujoco.mjtObj.mjOBJ_GEOM, name)

    def _mocap(self, body: str) -> int:
        body_id = self._mujoco.mj_name2id(self.model, self._mujoco.mjtObj.mjOBJ_BODY, body)
        return int(self.model.body_mocapid[body_id])

    def _reward_weights(self) -> dict[str, float]:
        raise NotImplementedError

    def _init_world(self, k: int, rng: np.random.Generator) -> None:
        """Place world k's objects (qpos, mocap) and set its instruction and task variables from `rng` only."""
        raise NotImplementedError

    def _measure(self) -> np.ndarray:
        """Task quantities `[N, M]` compared before and after a step to score it."""
        raise NotImplementedError

    def _score(self, before: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Success `[N]` bool and reward components (name -> `[N]` float) of the step from `before` to `after`."""
        raise NotImplementedError

    def _state(self) -> np.ndarray:
        """The privileged state `[N, S]` (a fresh array)."""
        raise NotImplementedError


def sample_apart(
    rng: np.random.Generator,
    count: int,
    low: float,
    high: float,
    min_gap: float,
    avoid: Sequence[np.ndarray] = (),
    max_tries: int = 1000,
) -> np.ndarray:
    """`count` points uniform in `[low, high]^2`, at least `min_gap` apart and from every point of `avoid`.

    Returns:
        `[count, 2]` float64.

    Raises:
        RuntimeError: The points did not fit within `max_tries` draws (the gaps are too large for the square).
    """
    placed: list[np.ndarray] = list(avoid)
    points: list[np.ndarray] = []
    for _ in range(max_tries):
        if len(points) == count:
            break
        candidate = rng.uniform(low, high, size=2)
        if all(np.hypot(*(candidate - p)) >= min_gap for p in placed):
            placed.append(candidate)
            points.append(candidate)
    if len(points) < count:
        raise RuntimeError(f"could not place {count} points {min_gap} apart in [{low}, {high}]^2")
    return np.array(points, dtype=np.float64).reshape(count, 2)


def add_noise(action: torch.Tensor, noise: float, generator: torch.Generator | None) -> torch.Tensor:
    """`action + noise * N(0, 1)` clipped to `[-1, 1]`; explicit randomness only."""
    check_expert_noise(noise, generator, probability=False)
    if noise == 0:
        return action
    perturbed = action + noise * torch.randn(action.shape, generator=generator)
    return perturbed.clamp(-1.0, 1.0)
