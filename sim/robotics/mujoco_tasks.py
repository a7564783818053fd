"""Small planar MuJoCo tasks seen from above: `reach` (move to the named target) and `push` (push a block onto a goal).

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

**Observation.** `image` uint8 `[N, H, W, 3]` from the top camera (H = W = `image_size`, a multiple of 32);
`instruction`, N strings; `state` float32 `[N, S]` privileged state, in metres (layouts below).

**Backends.** `backend="mujoco"` (default) steps each world with `mj_step` and renders it with OpenGL on the CPU.
`backend="warp"` steps all N worlds as one MuJoCo Warp batch and ray-traces their N images at once, on the env's
`device` (a GPU; the CPU works, slowly); the task logic is the same host code. The two agree to about 1e-5 m and a
few grey levels (sim/robotics/warp_backend.py).

**Finished worlds.** There is no autoreset. A world whose episode ended (terminated or truncated) is frozen until
it is reset: `step` ignores its action, does not advance its physics, returns its last image and state, reward 0
and every reward component 0, and repeats its final `terminated`, `truncated` and `success`.

`reach`
-------
**Task.** `num_targets` (default 3) coloured discs lie on the floor; the instruction
`"Move the gripper to the {colour} target."` names one of them. Targets are visual only: the gripper passes over
them.

**Randomizations** (per world, from that world's seed only): the gripper's start, uniform in `[-0.1, 0.1]^2`; the
targets' positions, uniform in `[-0.17, 0.17]^2`, at least 0.08 m from the gripper's start and from each other
(the discs have radius 0.024, so they never touch); their colours, distinct, from red, green, blue, yellow; which
one is the target. Any start is at most 0.27 m from the target along each axis: 5 to 6 steps at full speed.

**Success** when the gripper's centre is within `success_radius` (default 0.025 m, about the target disc's radius:
the gripper covers the target's centre) of the target's centre. Episodes end on success (`terminated`) or after
`max_episode_steps` (default 8, `truncated`).

**Reward.** `reward="dense"` (default): `progress + success`, where `progress` is the decrease of the
gripper-to-target distance during the step divided by the workspace width (0.4 m), and `success` is 1 on the step
that succeeds. `reward="sparse"`: `success` only. Both components are logged in `info["reward_components"]`.

**State** `[N, 4 + 3K]` (K = `num_targets`): gripper xy `[0:2]`; the named target's xy `[2:4]`; every disc's xy in
slot order `[4:4+2K]` (x0, y0, x1, y1, ...); every disc's colour as an index into `COLOURS` `[4+2K:4+3K]`.

**Expert** (`expert_action`): straight-line saturated proportional control, `(target - gripper) / action_scale`,
scaled down as a vector so that its largest coordinate is at most 1 (the direction is kept). It succeeds within 6
steps from every start (100% of seeds in the tests); uniform random actions succeed in a few percent of episodes.

`push`
------
**Task.** A purple block (a flat cylinder of radius 0.025 m) and `num_squares` (default 1) coloured squares (side
0.08 m) lie on the floor; the instruction `"Push the block onto the {colour} square."` names the goal square. The
gripper and the block collide as spheres of their discs' radii (an exact contact along the line between their
centres); the block slides on two joints whose damping and friction loss stop it soon after a push ends.

**Randomizations** (per world, from that world's seed only): the block's start, uniform in `[-0.1, 0.1]^2`; the
goal square's centre, uniform in `[-0.15, 0.15]^2` and 0.1 to 0.2 m from the block; the other squares (if
`num_squares > 1`) uniform in the same square, at least 0.1 m from the goal, the block and each other; the squares' colours (distinct); the gripper's start, uniform
in the workspace, at least 0.08 m from the block.

**Success** when the block's centre is inside the goal square (`|dx|, |dy| <= 0.04`). Episodes end on success or
after `max_episode_steps` (default 20).

**Reward.** `reward="dense"` (default): `progress + 0.5 * approach + success`: `progress` is the decrease of the
block-to-goal distance divided by the workspace width; `approach` the decrease of the gripper-to-block gap (centre
distance minus the contact distance 0.045 m, floored at 0) divided by the workspace width; `success` 1 on the step
that succeeds. `reward="sparse"`: `success` only. All three components are logged.

**State** `[N, 6]`: gripper xy `[0:2]`, block xy `[2:4]`, goal square centre xy `[4:6]`.

**Expert** (`expert_action`): with `u` the unit vector from block to goal, it first walks around the block if it is
on the wrong side (it sidesteps, then goes back along the block's side), then goes to the point behind the block on
the goal-block line, then pushes towards the spot where the block's centre lands on the goal, steering back onto
the line as it goes. Each step is the same direction-keeping saturated proportional control as in `reach`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from sim.base import Observation, StepResult, check_continuous_actions, resolve_env_ids, resolve_seeds
from sim.registry import ENVS
from sim.robotics.warp_backend import WarpWorlds

MJCF_DIR = Path(__file__).resolve().parent / "mjcf"  # package data, installed with `sim`
# Names only: the RGBA values live in the MJCF files (one mocap body per colour, named "<prefix>_<colour>").
COLOURS = ("red", "green", "blue", "yellow")
_PARKED = np.array([5.0, 0.0, 0.0])  # mocap position of a disc or square a world does not use: far out of view
_SHADOW_MAP = 2048  # shadow map side when shadows=True (MuJoCo's default 4096 costs about 4x more per frame)


def import_mujoco() -> Any:
    """Import `mujoco` with an offscreen GL backend chosen first (EGL unless the caller set `MUJOCO_GL`).

    MuJoCo reads `MUJOCO_GL` once, when it is first imported, so this must run before any other import of it.
    """
    os.environ.setdefault("MUJOCO_GL", "egl")
    import mujoco

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
        max_episode_steps: Steps after which a world is truncated.
        action_scale: Metres the gripper's setpoint moves for an action of 1.
        frame_skip: Physics sub-steps (of 10 ms) per env step. The servo is tuned for the default 10.
        reward: `"dense"` (shaped) or `"sparse"` (1 on success only).
        shadows: Render shadows of the scene's sun light. Off by default: shadow maps dominate CPU render time.
        camera: `"top"`, the fixed view of the whole workspace, or `"ego"`, an egocentric view that rides with the
            gripper (0.64 m across, the gripper at the centre): the action then depends only on where the target
            appears in the image, which a small policy learns much faster.
        device: Where the returned tensors live, and where the `warp` backend runs.
        backend: `"mujoco"` (default): plain MuJoCo on the CPU, one `mj_step` and one OpenGL render per world.
            `"warp"`: all N worlds stepped and ray-traced as one batch by MuJoCo Warp on `device` (a GPU; the CPU
            works but is slow), see sim/robotics/warp_backend.py. Needs the `warp` extra.
    """

    action_kind = "continuous"
    action_dim = 2
    _xml: str = ""  # scene file in MJCF_DIR

    def __init__(
        self,
        num_envs: int,
        image_size: int,
        max_episode_steps: int,
        action_scale: float,
        frame_skip: int,
        reward: Literal["dense", "sparse"],
        shadows: bool,
        device: str,
        camera: Literal["top", "ego"] = "top",
        backend: Literal["mujoco", "warp"] = "mujoco",
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if image_size < 32 or image_size % 32:
            raise ValueError(f"image_size must be a positive multiple of 32, got {image_size}")
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        if action_scale <= 0 or frame_skip < 1:
            raise ValueError(f"need action_scale > 0 and frame_skip >= 1, got {action_scale}, {frame_skip}")
        if reward not in ("dense", "sparse"):
            raise ValueError(f"reward must be 'dense' or 'sparse', got {reward!r}")
        if camera not in ("top", "ego"):
            raise ValueError(f"camera must be 'top' or 'ego', got {camera!r}")
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
        self._camera = mujoco.MjvCamera()
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self.camera = camera
        self._camera.fixedcamid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        self.backend = backend
        self._renderer = None
        self._warp: WarpWorlds | None = None
        if backend == "warp":
            self._warp = WarpWorlds(self.model, num_envs, image_size, self._camera.fixedcamid, shadows, self.device)
        else:
            self._renderer = offscreen_renderer(self.model, image_size, image_size)

        joint_x = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, "gripper_x")
        self._gripper_qpos = int(self.model.jnt_qposadr[joint_x])  # gripper_y follows gripper_x in qpos
        self.half_width = float(self.model.jnt_range[joint_x, 1])  # the workspace is [-half_width, half_width]^2
        self.workspace_size = 2.0 * self.half_width
        self.gripper_radius = float(self.model.geom_size[self._geom("gripper"), 0])

        self._images = np.zeros((num_envs, image_size, image_size, 3), dtype=np.uint8)  # [N, H, W, 3]
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
        self._renderer.update_scene(self.datas[k], camera=self._camera)
        self._renderer.render(out=self._images[k])

    def _observation(self) -> Observation:
        return Observation(
            image=self._tensor(self._images.copy()),
            instruction=list(self._instructions),
            state=self._tensor(self._state().astype(np.float32)),
        )

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


def _sample_apart(
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


@ENVS.register("reach")
class ReachEnv(PlanarMujocoEnv):
    """N worlds of planar reaching towards the coloured target the instruction names (see the module docstring).

    >>> env = ReachEnv(num_envs=2)
    >>> obs = env.reset(seed=0)
    >>> obs.image.shape, obs.state.shape
    (torch.Size([2, 64, 64, 3]), torch.Size([2, 13]))
    >>> result = env.step(env.expert_action())

    Args:
        num_envs: N, the number of worlds.
        image_size: Side of the square images in pixels; a multiple of 32.
        num_targets: Coloured discs per world (1 to 4), one of them the target.
        max_episode_steps: Steps after which a world is truncated.
        success_radius: Success when the gripper's centre is this close to the target's centre, in metres.
        action_scale: Metres the gripper moves for an action of 1.
        frame_skip: Physics sub-steps (of 10 ms) per env step.
        reward: `"dense"` (progress + success) or `"sparse"` (success).
        shadows: Render shadows (slow on CPU).
        camera: `"top"` (the whole workspace) or `"ego"` (a view that rides with the gripper).
        device: Where the returned tensors live (and where the `warp` backend runs).
        backend: `"mujoco"` (CPU, per world) or `"warp"` (all worlds in one MuJoCo Warp batch; the `warp` extra).
    """

    _xml = "reach.xml"
    _START_RANGE = 0.1  # the gripper starts in [-0.1, 0.1]^2
    _TARGET_RANGE = 0.17  # target centres lie in [-0.17, 0.17]^2: whole discs inside the workspace
    _MIN_GAP = 0.08  # between target centres, and from a target to the gripper's start

    def __init__(
        self,
        num_envs: int,
        image_size: int = 64,
        num_targets: int = 3,
        max_episode_steps: int = 8,
        success_radius: float = 0.025,
        action_scale: float = 0.05,
        frame_skip: int = 10,
        reward: Literal["dense", "sparse"] = "dense",
        shadows: bool = False,
        camera: Literal["top", "ego"] = "top",
        device: str = "cpu",
        backend: Literal["mujoco", "warp"] = "mujoco",
    ):
        if not 1 <= num_targets <= len(COLOURS):
            raise ValueError(f"num_targets must be in [1, {len(COLOURS)}], got {num_targets}")
        super().__init__(
            num_envs, image_size, max_episode_steps, action_scale, frame_skip, reward, shadows, device, camera, backend
        )
        self.num_targets = num_targets
        self.success_radius = float(success_radius)
        self.target_radius = float(self.model.geom_size[self._geom("target_red"), 0])
        self._mocap_ids = [self._mocap(f"target_{c}") for c in COLOURS]
        self._disc_xy = np.zeros((num_envs, num_targets, 2))  # [N, K, 2]
        self._disc_colour = np.zeros((num_envs, num_targets), dtype=np.int64)  # [N, K] index into COLOURS
        self._target_slot = np.zeros(num_envs, dtype=np.int64)  # [N] which disc is the target

    @property
    def target_xy(self) -> np.ndarray:
        """Every world's target centre `[N, 2]` float64, in metres (a copy)."""
        return self._disc_xy[np.arange(self.num_envs), self._target_slot].copy()

    @property
    def target_colour(self) -> list[str]:
        """Every world's target colour name."""
        return [COLOURS[c] for c in self._disc_colour[np.arange(self.num_envs), self._target_slot]]

    def expert_action(self, noise: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
        """The scripted expert's action for every world: straight towards the target at full speed, then onto it.

        Args:
            noise: Standard deviation of Gaussian noise added to the action (before clipping to `[-1, 1]`).
            generator: Source of the noise; required when `noise > 0`.

        Returns:
            `[N, 2]` float32 actions in `[-1, 1]`.
        """
        action = saturated_action(self.target_xy - self.gripper_xy, self.action_scale)  # [N, 2]
        return _add_noise(torch.from_numpy(action.astype(np.float32)), noise, generator)

    def _init_world(self, k: int, rng: np.random.Generator) -> None:
        data = self.datas[k]
        start = rng.uniform(-self._START_RANGE, self._START_RANGE, size=2)
        discs = _sample_apart(rng, self.num_targets, -self._TARGET_RANGE, self._TARGET_RANGE, self._MIN_GAP, [start])
        colours = rng.permutation(len(COLOURS))[: self.num_targets]
        slot = int(rng.integers(self.num_targets))
        g = self._gripper_qpos
        data.qpos[g : g + 2] = start
        for mocap in self._mocap_ids:
            data.mocap_pos[mocap] = _PARKED
        for (x, y), colour in zip(discs, colours):
            data.mocap_pos[self._mocap_ids[colour]] = (x, y, 0.0)
        self._disc_xy[k] = discs
        self._disc_colour[k] = colours
        self._target_slot[k] = slot
        self._instructions[k] = f"Move the gripper to the {COLOURS[colours[slot]]} target."

    def _measure(self) -> np.ndarray:
        return np.linalg.norm(self.target_xy - self.gripper_xy, axis=1)  # [N] gripper-to-target distance

    def _score(self, before: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        success = after <= self.success_radius  # [N]
        return success, {"progress": (before - after) / self.workspace_size, "success": success.astype(np.float64)}

    def _reward_weights(self) -> dict[str, float]:
        return {"progress": 1.0, "success": 1.0} if self.reward_mode == "dense" else {"success": 1.0}

    def _state(self) -> np.ndarray:
        n = self.num_envs
        return np.concatenate(
            [self.gripper_xy, self.target_xy, self._disc_xy.reshape(n, -1), self._disc_colour.astype(np.float64)],
            axis=1,
        )  # [N, 4 + 3K]


@ENVS.register("push")
class PushEnv(PlanarMujocoEnv):
    """N worlds of planar pushing: push the block onto the coloured square the instruction names.

    See the module docstring for the task, randomizations, reward and the expert.

    >>> env = PushEnv(num_envs=2)
    >>> obs = env.reset(seed=0)
    >>> obs.state.shape  # gripper xy, block xy, goal xy
    torch.Size([2, 6])

    Args:
        num_envs: N, the number of worlds.
        image_size: Side of the square images in pixels; a multiple of 32.
        num_squares: Coloured squares per world (1 to 4), one of them the goal.
        max_episode_steps: Steps after which a world is truncated.
        action_scale: Metres the gripper moves for an action of 1.
        frame_skip: Physics sub-steps (of 10 ms) per env step.
        reward: `"dense"` (progress + 0.5 approach + success) or `"sparse"` (success).
        shadows: Render shadows (slow on CPU).
        camera: `"top"` (the whole workspace) or `"ego"` (a view that rides with the gripper).
        device: Where the returned tensors live (and where the `warp` backend runs).
        backend: `"mujoco"` (CPU, per world) or `"warp"` (all worlds in one MuJoCo Warp batch; the `warp` extra).
    """

    _xml = "push.xml"
    _BLOCK_RANGE = 0.1  # the block starts in [-0.1, 0.1]^2
    _GOAL_RANGE = 0.15  # the goal square's centre lies in [-0.15, 0.15]^2
    _GOAL_DISTANCE = (0.1, 0.2)  # block-to-goal distance at the start
    _GRIPPER_GAP = 0.08  # the gripper starts at least this far from the block's centre
    _SQUARE_GAP = 0.1  # distractor squares keep this far from the goal and the block
    _APPROACH_WEIGHT = 0.5

    def __init__(
        self,
        num_envs: int,
        image_size: int = 64,
        num_squares: int = 1,
        max_episode_steps: int = 20,
        action_scale: float = 0.05,
        frame_skip: int = 10,
        reward: Literal["dense", "sparse"] = "dense",
        shadows: bool = False,
        camera: Literal["top", "ego"] = "top",
        device: str = "cpu",
        backend: Literal["mujoco", "warp"] = "mujoco",
    ):
        if not 1 <= num_squares <= len(COLOURS):
            raise ValueError(f"num_squares must be in [1, {len(COLOURS)}], got {num_squares}")
        super().__init__(
            num_envs, image_size, max_episode_steps, action_scale, frame_skip, reward, shadows, device, camera, backend
        )
        self.num_squares = num_squares
        mujoco = self._mujoco
        block_x = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, "block_x")
        self._block_qpos = int(self.model.jnt_qposadr[block_x])  # block_y follows block_x in qpos
        self.block_radius = float(self.model.geom_size[self._geom("block_collider"), 0])
        self.goal_half = float(self.model.geom_size[self._geom("goal_red"), 0])  # half the square's side
        self.contact_distance = self.gripper_radius + self.block_radius  # centre distance when they touch
        self._mocap_ids = [self._mocap(f"goal_{c}") for c in COLOURS]
        self._goal = np.zeros((num_envs, 2))  # [N, 2] goal square centre

    @property
    def block_xy(self) -> np.ndarray:
        """Every world's block centre `[N, 2]` float64, in metres (a copy)."""
        b = self._block_qpos
        return np.stack([data.qpos[b : b + 2] for data in self.datas])

    @property
    def goal_xy(self) -> np.ndarray:
        """Every world's goal square centre `[N, 2]` float64, in metres (a copy)."""
        return self._goal.copy()

    def expert_action(self, noise: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
        """The scripted expert's action for every world: get behind the block, then push it onto the goal.

        Args:
            noise: Standard deviation of Gaussian noise added to the action (before clipping to `[-1, 1]`).
            generator: Source of the noise; required when `noise > 0`.

        Returns:
            `[N, 2]` float32 actions in `[-1, 1]`.
        """
        gripper, block, goal = self.gripper_xy, self.block_xy, self._goal  # [N, 2] each
        to_goal = goal - block  # [N, 2]
        u = to_goal / np.maximum(np.linalg.norm(to_goal, axis=1, keepdims=True), 1e-9)  # [N, 2] push direction
        v = np.stack([-u[:, 1], u[:, 0]], axis=1)  # [N, 2] its left normal
        rel = gripper - block
        along = (rel * u).sum(1, keepdims=True)  # [N, 1] < 0: behind the block
        across = (rel * v).sum(1, keepdims=True)  # [N, 1] lateral offset from the push line
        side = np.where(across >= 0, 1.0, -1.0)  # [N, 1] the side of the line the gripper is on
        contact = self.contact_distance
        clear = contact + 0.015  # lateral offset that passes the block without touching it
        # Behind: far enough back that heading for the approach point slides along the block's back, not its front.
        # (A stricter threshold makes the gripper sidestep whenever a push leaves it slightly off the line.)
        behind = along <= -0.5 * contact
        aligned = behind & (np.abs(across) <= 0.01)
        # Push: aim at where the gripper is when the block's centre sits on the goal, pulled back onto the push line
        # (the target lies on the line, so a sideways error is steered out while pushing).
        push = goal - u * (contact - 0.005)
        # Behind but off the line: go to the point just behind the block.
        approach = block - u * (contact + 0.005)
        # Not behind, and in the block's way: first sidestep to a lane beside the block...
        sidestep = block + along * u + side * clear * v
        # ...then go back along that lane to behind the block.
        go_back = block - clear * u + side * clear * v
        in_the_way = np.abs(across) < 0.9 * clear
        target = np.where(aligned, push, np.where(behind, approach, np.where(in_the_way, sidestep, go_back)))
        action = saturated_action(target - gripper, self.action_scale)  # [N, 2]
        return _add_noise(torch.from_numpy(action.astype(np.float32)), noise, generator)

    def _init_world(self, k: int, rng: np.random.Generator) -> None:
        data = self.datas[k]
        block = rng.uniform(-self._BLOCK_RANGE, self._BLOCK_RANGE, size=2)
        low, high = self._GOAL_DISTANCE
        for _ in range(1000):
            goal = rng.uniform(-self._GOAL_RANGE, self._GOAL_RANGE, size=2)
            if low <= np.hypot(*(goal - block)) <= high:
                break
        else:  # unreachable for the ranges above, but never return a goal that breaks the documented distances
            raise RuntimeError("could not place the goal square")
        others = _sample_apart(  # the distractor squares
            rng, self.num_squares - 1, -self._GOAL_RANGE, self._GOAL_RANGE, self._SQUARE_GAP, [goal, block]
        )
        gripper = _sample_apart(rng, 1, -self.half_width, self.half_width, self._GRIPPER_GAP, [block])[0]
        colours = rng.permutation(len(COLOURS))[: self.num_squares]  # colours[0] is the goal's
        g, b = self._gripper_qpos, self._block_qpos
        data.qpos[g : g + 2] = gripper
        data.qpos[b : b + 2] = block
        for mocap in self._mocap_ids:
            data.mocap_pos[mocap] = _PARKED
        for (x, y), colour in zip(np.concatenate([goal[None], others]), colours):
            data.mocap_pos[self._mocap_ids[colour]] = (x, y, 0.0)
        self._goal[k] = goal
        self._instructions[k] = f"Push the block onto the {COLOURS[colours[0]]} square."

    def _measure(self) -> np.ndarray:
        block = self.block_xy
        block_to_goal = np.linalg.norm(self._goal - block, axis=1)  # [N]
        gap = np.maximum(np.linalg.norm(block - self.gripper_xy, axis=1) - self.contact_distance, 0.0)  # [N]
        inside = (np.abs(self._goal - block) <= self.goal_half).all(axis=1)  # [N]
        return np.stack([block_to_goal, gap, inside], axis=1)  # [N, 3]

    def _score(self, before: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        success = after[:, 2] > 0.5  # [N]
        return success, {
            "progress": (before[:, 0] - after[:, 0]) / self.workspace_size,
            "approach": (before[:, 1] - after[:, 1]) / self.workspace_size,
            "success": success.astype(np.float64),
        }

    def _reward_weights(self) -> dict[str, float]:
        if self.reward_mode == "sparse":
            return {"success": 1.0}
        return {"progress": 1.0, "approach": self._APPROACH_WEIGHT, "success": 1.0}

    def _state(self) -> np.ndarray:
        return np.concatenate([self.gripper_xy, self.block_xy, self._goal], axis=1)  # [N, 6]


def _add_noise(action: torch.Tensor, noise: float, generator: torch.Generator | None) -> torch.Tensor:
    """`action + noise * N(0, 1)` clipped to `[-1, 1]`; explicit randomness only."""
    if noise <= 0:
        return action
    if generator is None:
        raise ValueError("noise > 0 needs a torch.Generator (no hidden global randomness)")
    perturbed = action + noise * torch.randn(action.shape, generator=generator)
    return perturbed.clamp(-1.0, 1.0)
