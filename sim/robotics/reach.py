"""Planar reaching: move the gripper to the coloured target the instruction names (base: `sim.robotics.planar`).

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

`reward="clip"`: a reward from the image alone, VLM-RM's goal-baseline CLIP reward (Rocamonde et al. 2023,
https://arxiv.org/abs/2310.12921; `rewards.clip.goal_baseline_reward`) made potential-based (Ng et al. 1999). The
potential of a world's frame is `phi = 1 - 1/2 ||(x - g) P||^2` with `x` the CLIP embedding of its observation image
(the first camera's), `g` that of "the gripper is on the {colour} disc" and the baseline "the gripper is far from the
{colour} disc" for the named target's colour, projection strength `clip_alpha`. The step's reward (component `clip`)
is `phi(frame after) - phi(frame before)`, so an episode's return telescopes to `phi(last) - phi(first)`, and ending
early on success (the world then stands still at 0 reward) costs nothing. The baseline names the same colour so that
the goal-minus-baseline direction is the distance to that disc only: which discs are in view moves `g` and `b` alike.
`progress` and `success` are still logged as components, with no weight. `clip_model` is a CLIP checkpoint folder,
by default `assets/tiny_models/clip_reach` (trained on these egocentric 128 px renders by `scripts/make_tiny_clip.py`),
loaded once per process and run on all N frames in one batch.

**State** `[N, 4 + 3K]` (K = `num_targets`): gripper xy `[0:2]`; the named target's xy `[2:4]`; every disc's xy in
slot order `[4:4+2K]` (x0, y0, x1, y1, ...); every disc's colour as an index into `COLOURS` `[4+2K:4+3K]`. **Proprio** `[N, 4]`: the gripper's xy and
velocity, never the target's position (which the policy must read from the image and the instruction).

**Expert** (`expert_action`): straight-line saturated proportional control, `(target - gripper) / action_scale`,
scaled down as a vector so that its largest coordinate is at most 1 (the direction is kept). It succeeds within 6
steps from every start (100% of seeds in the tests); uniform random actions succeed in a few percent of episodes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from rewards.clip import goal_baseline_reward, load_clip
from sim.registry import ENVS
from sim.robotics.planar import (
    COLOURS,
    PARKED,
    PlanarMujocoEnv,
    add_noise,
    sample_apart,
    saturated_action,
)

# The committed CLIP of `reward="clip"`, found from this file (not the working directory): <repo>/assets/...
DEFAULT_CLIP_MODEL = Path(__file__).resolve().parents[2] / "assets" / "tiny_models" / "clip_reach"
CLIP_GOAL = "the gripper is on the {colour} disc"
CLIP_BASELINE = "the gripper is far from the {colour} disc"


@ENVS.register("reach")
class ReachEnv(PlanarMujocoEnv):
    """N worlds of planar reaching towards the coloured target the instruction names (see the module docstring).

    >>> env = ReachEnv(num_envs=2)
    >>> obs = env.reset(seed=0)
    >>> obs.image.shape, obs.state.shape, obs.proprio.shape
    (torch.Size([2, 64, 64, 3]), torch.Size([2, 13]), torch.Size([2, 4]))
    >>> result = env.step(env.expert_action())

    Args:
        num_envs: N, the number of worlds.
        num_targets: Coloured discs per world (1 to 4), one of them the target.
        success_radius: Success when the gripper's centre is this close to the target's centre, in metres.
        clip_model: With `reward="clip"`: the CLIP checkpoint folder (default `DEFAULT_CLIP_MODEL`).
        clip_alpha: With `reward="clip"`: VLM-RM's projection strength in [0, 1] (0 is the plain cosine with the goal).
        options: `PlanarMujocoEnv`'s (image_size, max_episode_steps (default 8), action_scale, frame_skip, reward:
            `"dense"` is progress + success, `"clip"` the CLIP potential difference, shadows, camera, device,
            backend).
    """

    default_max_episode_steps = 8
    reward_modes = ("dense", "sparse", "clip")

    _xml = "reach.xml"
    _START_RANGE = 0.1  # the gripper starts in [-0.1, 0.1]^2
    _TARGET_RANGE = 0.17  # target centres lie in [-0.17, 0.17]^2: whole discs inside the workspace
    _MIN_GAP = 0.08  # between target centres, and from a target to the gripper's start

    def __init__(
        self,
        num_envs: int,
        num_targets: int = 3,
        success_radius: float = 0.025,
        clip_model: str | os.PathLike[str] | None = None,
        clip_alpha: float = 0.5,
        **options,
    ):
        if not 1 <= num_targets <= len(COLOURS):
            raise ValueError(f"num_targets must be in [1, {len(COLOURS)}], got {num_targets}")
        if options.get("reward", "dense") != "clip" and clip_model is not None:
            raise ValueError(
                f"clip_model is used by reward='clip' only, got reward={options.get('reward', 'dense')!r}"
            )
        if not 0.0 <= clip_alpha <= 1.0:
            raise ValueError(f"clip_alpha must be in [0, 1], got {clip_alpha}")
        clip_model = os.fspath(DEFAULT_CLIP_MODEL if clip_model is None else clip_model)
        if options.get("reward") == "clip" and not os.path.isfile(os.path.join(clip_model, "config.json")):
            raise ValueError(
                f"clip_model {clip_model!r} is not a CLIP checkpoint folder (no config.json); the default one is made "
                "by scripts/make_tiny_clip.py"
            )
        super().__init__(num_envs, **options)
        self.num_targets = num_targets
        self.success_radius = float(success_radius)
        self.target_radius = float(self.model.geom_size[self._geom("target_red"), 0])
        self._mocap_ids = [self._mocap(f"target_{c}") for c in COLOURS]
        self._disc_xy = np.zeros((num_envs, num_targets, 2))  # [N, K, 2]
        self._disc_colour = np.zeros((num_envs, num_targets), dtype=np.int64)  # [N, K] index into COLOURS
        self._target_slot = np.zeros(num_envs, dtype=np.int64)  # [N] which disc is the target
        self.clip_alpha = float(clip_alpha)
        self._clip = None
        if self.reward_mode == "clip":
            self._clip = load_clip(clip_model, device=self.device)  # once per process (load_clip caches)
            # Every colour's goal and baseline, embedded once: `[C, D]` each, indexed by the target's colour.
            self._clip_goal = self._clip.embed_texts([CLIP_GOAL.format(colour=c) for c in COLOURS])
            self._clip_baseline = self._clip.embed_texts([CLIP_BASELINE.format(colour=c) for c in COLOURS])

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
        return add_noise(torch.from_numpy(action.astype(np.float32)), noise, generator)

    def _init_world(self, k: int, rng: np.random.Generator) -> None:
        data = self.datas[k]
        start = rng.uniform(-self._START_RANGE, self._START_RANGE, size=2)
        discs = sample_apart(rng, self.num_targets, -self._TARGET_RANGE, self._TARGET_RANGE, self._MIN_GAP, [start])
        colours = rng.permutation(len(COLOURS))[: self.num_targets]
        slot = int(rng.integers(self.num_targets))
        g = self._gripper_qpos
        data.qpos[g : g + 2] = start
        for mocap in self._mocap_ids:
            data.mocap_pos[mocap] = PARKED
        for (x, y), colour in zip(discs, colours):
            data.mocap_pos[self._mocap_ids[colour]] = (x, y, 0.0)
        self._disc_xy[k] = discs
        self._disc_colour[k] = colours
        self._target_slot[k] = slot
        self._instructions[k] = f"Move the gripper to the {COLOURS[colours[slot]]} target."

    def clip_potential(self) -> np.ndarray:
        """Every world's CLIP potential `phi` of its current frame, `[N]` float64 (`reward="clip"` only)."""
        if self._clip is None:
            raise RuntimeError(f"clip_potential needs reward='clip', this env has reward={self.reward_mode!r}")
        images = self._images if self._images.ndim == 4 else self._images[:, 0]  # [N, H, W, 3] the first camera
        target = self._disc_colour[np.arange(self.num_envs), self._target_slot]  # [N] colour index
        image_emb = self._clip.embed_images(torch.from_numpy(images))  # [N, D]
        index = torch.from_numpy(target).to(image_emb.device)
        phi = goal_baseline_reward(
            image_emb, self._clip_goal[index], self._clip_baseline[index], alpha=self.clip_alpha
        )  # [N]
        return phi.double().cpu().numpy()

    def _measure(self) -> np.ndarray:
        """`[N, 2]`: the gripper-to-target distance and the CLIP potential (0 unless `reward="clip"`)."""
        distance = np.linalg.norm(self.target_xy - self.gripper_xy, axis=1)  # [N]
        phi = self.clip_potential() if self._clip is not None else np.zeros(self.num_envs)  # [N]
        return np.stack([distance, phi], axis=1)

    def _score(self, before: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        success = after[:, 0] <= self.success_radius  # [N]
        components = {
            "progress": (before[:, 0] - after[:, 0]) / self.workspace_size,
            "success": success.astype(np.float64),
        }
        if self._clip is not None:
            components["clip"] = after[:, 1] - before[:, 1]  # potential-based: phi(after) - phi(before)
        return success, components

    def _reward_weights(self) -> dict[str, float]:
        return {"dense": {"progress": 1.0, "success": 1.0}, "sparse": {"success": 1.0}, "clip": {"clip": 1.0}}[
            self.reward_mode
        ]

    def _state(self) -> np.ndarray:
        n = self.num_envs
        return np.concatenate(
            [self.gripper_xy, self.target_xy, self._disc_xy.reshape(n, -1), self._disc_colour.astype(np.float64)],
            axis=1,
        )  # [N, 4 + 3K]
