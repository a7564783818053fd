"""Planar pushing: push the block onto the coloured square the instruction names (base: `sim.robotics.planar`).

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

**State** `[N, 6]`: gripper xy `[0:2]`, block xy `[2:4]`, goal square centre xy `[4:6]`. **Proprio** `[N, 4]`:
the gripper's xy and velocity (the block and the goal are for the policy to see).

**Expert** (`expert_action`): with `u` the unit vector from block to goal, it first walks around the block if it is
on the wrong side (it sidesteps, then goes back along the block's side), then goes to the point behind the block on
the goal-block line, then pushes towards the spot where the block's centre lands on the goal, steering back onto
the line as it goes. Each step is the same direction-keeping saturated proportional control as in `reach`.
"""

from __future__ import annotations

import numpy as np
import torch

from sim.registry import ENVS
from sim.robotics.planar import (
    COLOURS,
    PARKED,
    PlanarMujocoEnv,
    add_noise,
    sample_apart,
    saturated_action,
)


@ENVS.register("push")
class PushEnv(PlanarMujocoEnv):
    """N worlds of planar pushing: push the block onto the coloured square the instruction names.

    See the module docstring for the task, randomizations, reward and the expert.

    >>> env = PushEnv(num_envs=2)
    >>> obs = env.reset(seed=0)
    >>> obs.state.shape  # gripper xy, block xy, goal xy
    torch.Size([2, 6])
    >>> obs.proprio.shape  # gripper xy and velocity: what the robot knows of itself
    torch.Size([2, 4])

    Args:
        num_envs: N, the number of worlds.
        num_squares: Coloured squares per world (1 to 4), one of them the goal.
        options: `PlanarMujocoEnv`'s (image_size, max_episode_steps (default 20), action_scale, frame_skip, reward:
            `"dense"` is progress + 0.5 approach + success, shadows, camera, device, backend).
    """

    default_max_episode_steps = 20

    _xml = "push.xml"
    _BLOCK_RANGE = 0.1  # the block starts in [-0.1, 0.1]^2
    _GOAL_RANGE = 0.15  # the goal square's centre lies in [-0.15, 0.15]^2
    _GOAL_DISTANCE = (0.1, 0.2)  # block-to-goal distance at the start
    _GRIPPER_GAP = 0.08  # the gripper starts at least this far from the block's centre
    _SQUARE_GAP = 0.1  # distractor squares keep this far from the goal and the block
    _APPROACH_WEIGHT = 0.5

    def __init__(self, num_envs: int, num_squares: int = 1, **options):
        if not 1 <= num_squares <= len(COLOURS):
            raise ValueError(f"num_squares must be in [1, {len(COLOURS)}], got {num_squares}")
        super().__init__(num_envs, **options)
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
        return add_noise(torch.from_numpy(action.astype(np.float32)), noise, generator)

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
        others = sample_apart(  # the distractor squares
            rng, self.num_squares - 1, -self._GOAL_RANGE, self._GOAL_RANGE, self._SQUARE_GAP, [goal, block]
        )
        gripper = sample_apart(rng, 1, -self.half_width, self.half_width, self._GRIPPER_GAP, [block])[0]
        colours = rng.permutation(len(COLOURS))[: self.num_squares]  # colours[0] is the goal's
        g, b = self._gripper_qpos, self._block_qpos
        data.qpos[g : g + 2] = gripper
        data.qpos[b : b + 2] = block
        for mocap in self._mocap_ids:
            data.mocap_pos[mocap] = PARKED
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
