"""Gymnasium's MuJoCo envs (`Reacher-v5`, `Pusher-v5`, ...) as one batched `VecEnv` with image observations.

**Task.** Whatever the Gymnasium env `env_id` defines; the instruction is fixed per env id (`INSTRUCTIONS`, or the
`instruction` option): `Reacher-v5` "Move the fingertip to the red target.", `Pusher-v5` "Push the white cylinder
onto the red disc.". Episodes last the env's registered time limit (Reacher 50 steps, Pusher 100) unless
`max_episode_steps` says otherwise; `terminated` is Gymnasium's own (never, for these two).

**Randomizations.** Gymnasium's own `reset_model`, driven by the world's seed only: world k is reset with
`env.reset(seed=world_seed)`.

**Reward.** Gymnasium's reward, unchanged. Its terms from `info` (the keys `reward_*`, e.g. `reward_dist`,
`reward_ctrl`) are logged as components without the prefix (`dist`, `ctrl`), plus `success` (0/1).

**Success** is ours where Gymnasium defines none, and only for the env ids of `SUCCESS`: the planar (xy) distance
between two bodies below a threshold (the `success_distance` option overrides it).

* `Reacher`: fingertip to target below 0.02 m: the fingertip sphere (radius 0.01) touches the target sphere
  (radius 0.009) with a millimetre to spare. Gymnasium's reward has no success notion; 0.02 is about 10% of the
  arm's reach (0.21 m), tight enough that a random policy meets it in only a small share of episodes.
* `Pusher`: object centre to goal centre below 0.08 m, i.e. the object's centre is on the red goal disc (radius
  0.08).

Other env ids report `success` all False. With `terminate_on_success=True` a success also ends the episode
(`terminated`); by default it does not, so the task stays Gymnasium's.

**Action** `[N, D]` float within the env's `action_space` bounds (`action_low`, `action_high`; values outside are
clipped, NaN read as 0). Reacher and Pusher: torques in `[-1, 1]` (D = 2 and 7).

**Observation.** `image` uint8 `[N, H, W, 3]`: each world rendered at `image_size` directly (no resize) by one
`mujoco.Renderer` shared by the N worlds, from Gymnasium's default view (a free camera looking at the median of the
geoms' positions from `model.stat.extent` away, then the env's `default_camera_config`, then the `camera_config`
option). Gymnasium fixes that look-at point at a world's first render, so it would depend on the first seed; here
it is computed once from the model's initial pose, so every world and every instance renders the same view.
`state` float32 `[N, S]`: Gymnasium's observation vector (Reacher S = 10: cos and sin of the two joint angles,
target xy, joint velocities, fingertip minus target xy; Pusher S = 23: joint angles and velocities, fingertip,
object and goal positions).

**Finished worlds** (as in `sim.robotics.planar`): a world whose episode ended is frozen until reset; `step`
ignores its action, returns its last image and state, reward 0, components 0, and repeats its final flags.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from sim.base import Observation, StepResult, check_continuous_actions, resolve_env_ids, resolve_seeds
from sim.registry import ENVS
from sim.robotics.planar import import_mujoco, offscreen_renderer

INSTRUCTIONS = {
    "Reacher": "Move the fingertip to the red target.",
    "Pusher": "Push the white cylinder onto the red disc.",
}
# env name (the env id without its version) -> (body A, body B, threshold in metres): success is |A - B|_xy < it.
SUCCESS = {
    "Reacher": ("fingertip", "target", 0.02),
    "Pusher": ("object", "goal", 0.08),
}


@ENVS.register("gym_mujoco")
class GymMujocoEnv:
    """N Gymnasium MuJoCo envs in one process, behind the `VecEnv` contract (see the module docstring).

    >>> env = GymMujocoEnv(num_envs=2, env_id="Reacher-v5")
    >>> obs = env.reset(seed=0)
    >>> obs.image.shape, obs.state.shape, env.action_dim
    (torch.Size([2, 64, 64, 3]), torch.Size([2, 10]), 2)

    Args:
        num_envs: N, the number of worlds.
        env_id: A Gymnasium MuJoCo env id, e.g. `"Reacher-v5"` or `"Pusher-v5"`.
        image_size: Side of the square images in pixels.
        max_episode_steps: Steps after which a world is truncated; None: the env's registered limit.
        instruction: The instruction of every world; None: `INSTRUCTIONS` for the env, or a generic one.
        success_distance: Overrides the success threshold of `SUCCESS` for the env, in metres.
        terminate_on_success: End a world's episode (terminated) when it succeeds.
        camera_config: `MjvCamera` attributes applied after the env's default camera config, e.g.
            `{"elevation": -90.0, "distance": 0.6}` for a top-down view.
        shadows: Render shadows (slow on CPU).
        env_kwargs: Keyword arguments for `gymnasium.make` (e.g. `{"frame_skip": 4}`).
        device: Where the returned tensors live.
    """

    action_kind = "continuous"
    default_max_episode_steps = "env_id"  # what max_episode_steps=None takes: the Gymnasium env's registered limit

    def __init__(
        self,
        num_envs: int,
        env_id: str = "Reacher-v5",
        image_size: int = 64,
        max_episode_steps: int | None = None,
        instruction: str | None = None,
        success_distance: float | None = None,
        terminate_on_success: bool = False,
        camera_config: dict[str, Any] | None = None,
        shadows: bool = False,
        env_kwargs: dict[str, Any] | None = None,
        device: str = "cpu",
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if image_size < 1:
            raise ValueError(f"image_size must be positive, got {image_size}")
        mujoco = import_mujoco()  # before gymnasium imports it, so MUJOCO_GL is set first
        import gymnasium as gym

        self._mujoco = mujoco
        self.num_envs = num_envs
        self.env_id = env_id
        self.image_size = image_size
        self.device = torch.device(device)
        self.terminate_on_success = terminate_on_success
        spec = gym.spec(env_id)
        limit = max_episode_steps if max_episode_steps is not None else spec.max_episode_steps
        if limit is None or limit < 1:
            raise ValueError(f"{env_id} has no time limit; pass max_episode_steps >= 1")
        self.max_episode_steps = int(limit)
        # `.unwrapped`: our own bookkeeping replaces TimeLimit and OrderEnforcing, and the passive checker's
        # per-step checks cost more than the bridge itself.
        self.envs = [
            gym.make(env_id, disable_env_checker=True, **(env_kwargs or {})).unwrapped for _ in range(num_envs)
        ]
        first = self.envs[0]
        if not hasattr(first, "model") or not hasattr(first, "data"):
            raise ValueError(f"{env_id} is not a MuJoCo env (no model/data)")
        space = first.action_space
        self.action_dim = int(np.prod(space.shape))
        self.action_low = torch.as_tensor(space.low, dtype=torch.float32).reshape(-1)  # [D]
        self.action_high = torch.as_tensor(space.high, dtype=torch.float32).reshape(-1)  # [D]
        self._low = self.action_low.numpy().astype(np.float64)
        self._high = self.action_high.numpy().astype(np.float64)

        name = env_id.split("-")[0]
        self.instruction = instruction if instruction is not None else INSTRUCTIONS.get(name, f"Solve {name}.")
        self._success_rule = SUCCESS.get(name)
        if self._success_rule is not None and success_distance is not None:
            body_a, body_b, _ = self._success_rule
            self._success_rule = (body_a, body_b, float(success_distance))

        # One renderer for all N worlds: every env holds an identical copy of the model, so the first one's model
        # renders any world's data. The render context (and its shadow map) is sized here, once.
        model = first.model
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, image_size)
        model.vis.global_.offheight = max(model.vis.global_.offheight, image_size)
        if not shadows:
            model.vis.quality.shadowsize = 0
        self._renderer = offscreen_renderer(model, image_size, image_size)
        self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = shadows
        self._camera = self._default_camera(first, camera_config or {})

        self._images = np.zeros((num_envs, image_size, image_size, 3), dtype=np.uint8)  # [N, H, W, 3]
        obs_dim = int(np.prod(first.observation_space.shape))
        self._states = np.zeros((num_envs, obs_dim), dtype=np.float32)  # [N, S]
        self._elapsed = np.zeros(num_envs, dtype=np.int64)  # [N]
        self._terminated = np.zeros(num_envs, dtype=bool)  # [N]
        self._truncated = np.zeros(num_envs, dtype=bool)  # [N]
        self._success = np.zeros(num_envs, dtype=bool)  # [N]
        self._was_reset = np.zeros(num_envs, dtype=bool)  # [N]
        self._component_names: list[str] = []  # reward terms seen in Gymnasium's info, in order of appearance

    # ------------------------------------------------------------------------------------------------ contract
    def reset(self, seed: int | Sequence[int], env_ids: Sequence[int] | None = None) -> Observation:
        """Reset the worlds `env_ids` (all when None) with Gymnasium's `reset(seed=...)`.

        Args:
            seed: One seed per reset world, or an int from which world k of `env_ids` gets `seed + k`.
            env_ids: Indices of the worlds to reset; None resets all N.

        Returns:
            The observation of all N worlds (copies).
        """
        ids = resolve_env_ids(env_ids, self.num_envs)
        for k, world_seed in zip(ids, resolve_seeds(seed, len(ids))):
            observation, _ = self.envs[k].reset(seed=world_seed)
            self._states[k] = np.asarray(observation, dtype=np.float32).reshape(-1)
            self._render(k)
        self._elapsed[ids] = 0
        self._terminated[ids] = False
        self._truncated[ids] = False
        self._success[ids] = self._successes(ids)
        self._was_reset[ids] = True
        return self._observation()

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step every live world's Gymnasium env once with its action.

        Args:
            actions: `[N, D]` float; clipped to `[action_low, action_high]`, NaN read as 0.

        Returns:
            A StepResult: observation of all worlds, Gymnasium's reward `[N]` float32, terminated and truncated
            `[N]` bool, and info with `success` `[N]` bool and `reward_components` (name -> `[N]` float32).

        Raises:
            ValueError: `actions` is not `[N, D]`.
            RuntimeError: Some world was never reset.
        """
        action = check_continuous_actions(actions, self.num_envs, self.action_dim, self._low, self._high)  # [N, D]
        if not self._was_reset.all():
            raise RuntimeError(f"worlds {np.flatnonzero(~self._was_reset).tolist()} were never reset; reset first")
        live = np.flatnonzero(~(self._terminated | self._truncated))
        reward = np.zeros(self.num_envs)  # [N]
        terms: dict[str, np.ndarray] = {name: np.zeros(self.num_envs) for name in self._component_names}
        env_terminated = np.zeros(self.num_envs, dtype=bool)  # [N]
        for k in live:
            observation, r, terminated, _, info = self.envs[k].step(action[k])
            self._states[k] = np.asarray(observation, dtype=np.float32).reshape(-1)
            reward[k] = r
            env_terminated[k] = terminated
            for key, value in info.items():
                if key.startswith("reward_") and np.isscalar(value):
                    name = key[len("reward_") :]
                    if name not in terms:
                        self._component_names.append(name)
                        terms[name] = np.zeros(self.num_envs)
                    terms[name][k] = value
            self._render(k)
        self._elapsed[live] += 1
        success = np.zeros(self.num_envs, dtype=bool)
        success[live] = self._successes(live)
        self._success[live] = success[live]
        ended = env_terminated | (success if self.terminate_on_success else False)
        self._terminated |= ended
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[live] = True
        self._truncated |= mask & ~ended & (self._elapsed >= self.max_episode_steps)
        terms["success"] = success.astype(np.float64)
        return StepResult(
            obs=self._observation(),
            reward=self._tensor(reward.astype(np.float32)),
            terminated=self._tensor(self._terminated.copy()),
            truncated=self._tensor(self._truncated.copy()),
            info={
                "success": self._tensor(self._success.copy()),
                "reward_components": {name: self._tensor(value.astype(np.float32)) for name, value in terms.items()},
            },
        )

    def close(self) -> None:
        """Free the renderer and close the Gymnasium envs."""
        renderer, self._renderer = getattr(self, "_renderer", None), None
        if renderer is not None:
            renderer.close()
        for env in getattr(self, "envs", []):
            env.close()

    # ------------------------------------------------------------------------------------------------ helpers
    def _successes(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Whether each world of `ids` meets the env's success rule now, `[len(ids)]` bool."""
        if self._success_rule is None:
            return np.zeros(len(ids), dtype=bool)
        body_a, body_b, threshold = self._success_rule
        gaps = [self.envs[k].get_body_com(body_a)[:2] - self.envs[k].get_body_com(body_b)[:2] for k in ids]
        return np.array([np.hypot(*gap) < threshold for gap in gaps], dtype=bool)

    def _default_camera(self, env: Any, overrides: dict[str, Any]) -> Any:
        """Gymnasium's default view (its `OffScreenViewer._init_camera` + `default_camera_config`), made
        deterministic by looking at the model's initial pose instead of the first rendered state."""
        mujoco = self._mujoco
        camera = mujoco.MjvCamera()
        renderer = getattr(env, "mujoco_renderer", None)
        camera_id = getattr(renderer, "camera_id", -1)
        if camera_id is not None and camera_id >= 0:
            camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
            camera.fixedcamid = camera_id
        else:
            camera.type = mujoco.mjtCamera.mjCAMERA_FREE
            camera.fixedcamid = -1
            pose = mujoco.MjData(env.model)
            mujoco.mj_forward(env.model, pose)
            camera.lookat[:] = np.median(pose.geom_xpos, axis=0)
            camera.distance = env.model.stat.extent
        config = dict(getattr(renderer, "default_cam_config", None) or {})
        config.update(overrides)
        for key, value in config.items():
            if isinstance(value, np.ndarray | list | tuple):
                getattr(camera, key)[:] = value
            else:
                setattr(camera, key, value)
        return camera

    def _render(self, k: int) -> None:
        self._renderer.update_scene(self.envs[k].data, camera=self._camera)
        self._renderer.render(out=self._images[k])

    def _observation(self) -> Observation:
        return Observation(
            image=self._tensor(self._images.copy()),
            instruction=[self.instruction] * self.num_envs,
            state=self._tensor(self._states.copy()),
        )

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        return tensor if self.device.type == "cpu" else tensor.to(self.device)
