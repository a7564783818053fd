"""highway-env driving (https://github.com/Farama-Foundation/HighwayEnv) as one batched `VecEnv`, `highway`.

**Task.** The ego car (green) drives in one of highway-env's scenarios (`scenario`: `highway` = `highway-fast-v0`,
`merge` = `merge-v0`, `roundabout` = `roundabout-v0`, `intersection` = `intersection-v0`, or any highway-env id
whose action is `DiscreteMetaAction`) for `max_episode_steps` decisions (one a second by default) without crashing.
The instruction names the goal and the valid answers, e.g. `"Drive along the highway as far as you can without
crashing. Answer with one of: LANE_LEFT, IDLE, LANE_RIGHT, FASTER, SLOWER."` (the intersection only has SLOWER,
IDLE, FASTER). An episode ends on a collision (`terminated`), when the scenario itself ends it without one (merge:
the ramp is passed; intersection: the exit is reached; `terminated`), or after `max_episode_steps` (`truncated`).

**Action.** `action_mode="text"` (default): N strings. The meta-action is the first of LANE_LEFT, LANE_RIGHT, IDLE,
FASTER, SLOWER (case-insensitive; `lane left` and `lane-left` also count) in the answer region of the text (inside
the last `<answer>...</answer>` if there is one, after removing `<think>` blocks). Text with no action, or one the
scenario does not have, executes IDLE, is charged `invalid_penalty`, and gets a reason in `info["reasons"]`.
With `answer="letter"` the instruction lists a letter per meta-action ("Answer with one letter: A LANE_LEFT, B
IDLE, ..."), an answer that is one of those letters alone is its action (names still count), and the expert
answers in letters: one token of a character-level tokenizer instead of up to ten.
`action_mode="continuous"`: `[N, D=2]` float in `[-1, 1]` (highway-env's `ContinuousAction`: acceleration scaled to
+-5 m/s^2, steering to +-45 degrees; clipped, NaN read as 0).

**Observation.** `image` uint8 `[N, H, W, 3]`: highway-env's own top-down render, centred on the ego car, square,
`view_length` metres across (default per scenario, 40-50 m: cars stay several pixels long at 64 px), drawn at
`supersample * image_size` pixels and reduced to `image_size` with a box filter (pygame draws cars at a few pixels
as grey blobs; drawn larger and averaged down they keep their colours). `state` float32 `[N, 6]`: ego x, y (m),
speed (m/s), heading (rad), lateral offset from its lane's centre (m), heading error to its lane (rad).

**Randomizations.** highway-env's own, driven by the world's seed only (`env.reset(seed=world_seed)`): the ego's
lane, the other cars' lanes, positions, speeds and driving-style parameters (and spawns, in the intersection).

**Reward** (`reward`; every term is also logged in `info["reward_components"]`; all modes subtract
`invalid_penalty * invalid`, where `invalid` is 1 for text that named no valid action):

* `"carl"` (default), CaRL's simple reward (Jaeger et al. 2025, https://arxiv.org/abs/2504.17838): route
  completion in the step, multiplied by soft penalties, with hard infractions ending the episode,
  `r_t = RC_t * prod_i p_i,t - T * collision_t`. Here `RC_t = max(0, (x_t - x_{t-1}) . u) / L`: the ego's
  displacement projected on its lane's direction `u` at the start of the step, over the route length
  `L = reference_speed * max_episode_steps / policy_frequency` (the road covered at the scenario's top target speed
  in a whole episode, so a full episode at top speed sums to about 1, CaRL's 100 % route completion). Soft
  penalties: `offroad_factor` (default 0) when the ego is off its lane's surface, `unsafe_factor` (default 0.5)
  when its time to collision with the car ahead in its lane is below `ttc_threshold` (1.5 s). A collision ends the
  episode and costs `T = collision_penalty` (default 1, a whole route's worth, so a late crash never beats a clean
  but slower run). Components: `progress` (RC_t), `penalty` (the product of factors), `collision`, `invalid`.
* `"vlm_rl"`, VLM-RL's hierarchical reward synthesis (Huang et al. 2024, https://arxiv.org/abs/2412.15544; the
  formula of the released code, `clip_rewarded_sac.py`): the contrasting-language-goal (CLG) score of the rendered
  image `c = cos(x, positive) - cos(x, negative)` (`rewards.clip_contrast_reward`, prompts "the road is clear with
  no car accidents" / "two cars have collided with each other on the road") is normalised to
  `s = clip(1 + c / clg_threshold, 0, 1)` (1 when the image is at least as close to the positive goal, 0 when it is
  `clg_threshold` = 0.03 closer to the negative one), and sets the desired speed `v_d = s * v_ref`. Then
  `r = (1 - |v - v_d| / v_ref) * f_center * f_angle * f_std` with `f_center = max(0, 1 - |d| / 3 m)` (d the
  lateral offset from the lane centre), `f_angle = max(0, 1 - |heading error| / 90 deg)` and
  `f_std = max(0, 1 - std(d over the episode so far) / 0.4 m)`; a collision replaces r with `-collision_penalty`
  (VLM-RL's code uses -10 and ends the episode). Needs a CLIP checkpoint folder (`clip_model`). Components: `clg`
  (s), `speed`, `center`, `angle`, `stability`, `collision`, `invalid`.
* `"env"`: highway-env's own reward for the scenario (highway: speed and right-lane terms in [0, 1], 0 off-road).
  Components: `env`, `collision`, `invalid`.

`v_ref = reference_speed` defaults to the scenario's top meta-action target speed (30 m/s on highway and merge,
16 m/s in the roundabout, 9 m/s in the intersection).

**Success** (`info["success"]`): the episode ended without a collision, either by reaching `max_episode_steps` or
by the scenario's own goal (merge, intersection). It is False while an episode runs.

**Expert** (`expert_action`): a rule-based driver from the vehicle state, in two stages.
1. Lane and wanted speed: the ego's (target) lane counts as blocked when the car ahead in it is closer than a 1.5 s
   headway plus 6 m or will be reached within 3 s, or when a car on a merging ramp (a `forbidden` lane) is beside or
   up to two headways ahead within two lane widths (it may cut in). Blocked, it changes to a free neighbouring lane
   (leader gap beyond the headway plus 5 m, follower gap large enough for its closing speed) if it can, else wants
   SLOWER; not blocked, it wants FASTER while below the top speed with the road free for two headways, else IDLE.
2. Speed check: the wanted action is kept if the route stays clear at the speed it leads to: the ego's route is
   predicted over 3 s with highway-env's speed lag, the other cars' routes at constant speed, and a car heading the
   same way must stay 7 m away along or 3 m across the ego's heading, a crossing car 7 m away. Else the first clear
   one of IDLE, SLOWER, FASTER is taken (the one keeping the most clearance if none is clear).
Measured over 20 seeds of 20 steps: success 100 % on highway (random actions: 30 %), 95 % on merge and
intersection, 55 % in the roundabout (its entry conflicts are not predicted well).
In continuous mode it returns `[N, 2]` actions that follow the current lane's centre with highway-env's own
steering law and track the top speed, or slow down when blocked or when a car ahead crosses its path within 3 s
(no lane changes).

**Finished worlds** (as in `sim.robotics.planar`): a world whose episode ended is frozen until reset; `step`
ignores its action, returns its last image and state, reward 0, every component 0, and repeats its final flags.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image

from rewards.clip import clip_contrast_reward, load_clip
from sim.base import (
    Observation,
    StepResult,
    check_continuous_actions,
    check_text_actions,
    resolve_env_ids,
    resolve_seeds,
)
from sim.driving.actions import META_ACTIONS, parse_meta_action
from sim.driving.expert import HighwayExpert, time_to_collision
from sim.registry import ENVS

# Short scenario names -> highway-env ids. The `-fast` highway variant simulates at 5 Hz instead of 15 and checks
# only the ego's collisions, so it is several times cheaper than `highway-v0` for the same task.
SCENARIOS = {
    "highway": "highway-fast-v0",
    "merge": "merge-v0",
    "roundabout": "roundabout-v0",
    "intersection": "intersection-v0",
}
GOALS = {
    "highway": "Drive along the highway as far as you can without crashing.",
    "merge": "Drive along the highway past the merging ramp without crashing.",
    "roundabout": "Drive through the roundabout without crashing.",
    "intersection": "Drive through the intersection without crashing.",
}
_DEFAULT_GOAL = "Drive without crashing."
VIEW_LENGTH = {"highway": 40.0, "merge": 50.0, "roundabout": 50.0, "intersection": 50.0}  # metres across the image
POSITIVE_GOALS = ("the road is clear with no car accidents",)  # VLM-RL's contrasting language goals
NEGATIVE_GOALS = ("two cars have collided with each other on the road",)

# Expert rule constants (seconds and metres).

# VLM-RL's vehicle-state factors (their CARLA defaults, `reward_fn_5_default` in the released config).
_MAX_CENTER_DISTANCE_M = 3.0
_MAX_ANGLE_RAD = math.pi / 2
_MAX_CENTER_STD_M = 0.4


@ENVS.register("highway")
class HighwayEnv(HighwayExpert):
    """N worlds of highway-env driving, one highway-env instance per world (see the module docstring).

    >>> env = HighwayEnv(num_envs=2, image_size=64)
    >>> obs = env.reset(seed=0)
    >>> obs.image.shape
    torch.Size([2, 64, 64, 3])
    >>> result = env.step(env.expert_action())  # e.g. ["FASTER", "IDLE"]

    Args:
        num_envs: N, the number of worlds.
        image_size: Side of the square images in pixels.
        scenario: A short name of `SCENARIOS` or a highway-env id (`"highway-v0"`, `"merge-v0"`, ...).
        max_episode_steps: Decisions per episode before truncation.
        reward: `"carl"`, `"vlm_rl"` or `"env"` (see the module docstring).
        action_mode: `"text"` (meta-actions) or `"continuous"` (`[N, 2]` acceleration and steering).
        vehicles_count: Other cars on the road, for scenarios that have this setting (highway); None: 10 there
            (highway-env's 20 costs about twice the simulation time for the same density ahead of the ego), and the
            scenario's own traffic elsewhere.
        view_length: Metres shown across the image; None uses the scenario's default (`VIEW_LENGTH`, else 50).
        supersample: The render is drawn this many times larger, then box-filtered down to `image_size`.
        policy_frequency: Decisions per simulated second.
        reference_speed: `v_ref` of the rewards in m/s; None: the scenario's top target speed.
        collision_penalty: Cost of a collision (`carl`: subtracted; `vlm_rl`: the reward becomes its negative).
        invalid_penalty: Subtracted from the reward of text that names no valid action.
        offroad_factor: `carl` soft penalty while off the lane's surface.
        unsafe_factor: `carl` soft penalty while the time to collision with the car ahead is below `ttc_threshold`.
        ttc_threshold: Seconds; see `unsafe_factor`.
        clip_model: Path of a CLIP checkpoint folder (`transformers.CLIPModel`); required for `reward="vlm_rl"`.
        positive_goals: VLM-RL's positive language goals.
        negative_goals: VLM-RL's negative language goals.
        clg_threshold: The CLG score range mapped onto [0, 1] (0.03 in VLM-RL's code).
        expert_headway: Seconds of time gap the expert keeps to the car ahead (1.5); its standstill gap (6 m) and
            time-to-collision threshold (3 s) scale with it. Below the default: a tailgating demonstrator.
        expert_speed_check: Text mode: whether the expert's wanted speed action passes the route-clearance check
            (stage 2 of the module docstring's expert); False: a demonstrator who never looks ahead before speeding
            up. (The continuous expert has no such check.)
        answer: Text mode: `"name"` answers name the meta-action (`LANE_LEFT`); `"letter"` answers are one letter,
            A, B, ... for the scenario's meta-actions in `META_ACTIONS` order, which the instruction lists (one token
            of a character-level tokenizer, where `LANE_LEFT` is nine). Names are understood in either mode; the
            expert answers in the chosen one.
        config: Further highway-env config entries, applied last (e.g. `{"lanes_count": 4}`).
        device: Where the returned tensors live; the simulation and rendering run on the CPU.
    """

    action_kind = "text"  # `action_mode`'s default, for listings that do not build an env; an env's is its mode

    def __init__(
        self,
        num_envs: int,
        image_size: int = 64,
        scenario: str = "highway",
        max_episode_steps: int = 20,
        reward: Literal["carl", "vlm_rl", "env"] = "carl",
        action_mode: Literal["text", "continuous"] = "text",
        vehicles_count: int | None = None,
        view_length: float | None = None,
        supersample: int = 2,
        policy_frequency: int = 1,
        reference_speed: float | None = None,
        collision_penalty: float = 1.0,
        invalid_penalty: float = 0.1,
        offroad_factor: float = 0.0,
        unsafe_factor: float = 0.5,
        ttc_threshold: float = 1.5,
        clip_model: str | os.PathLike[str] | None = None,
        positive_goals: Sequence[str] = POSITIVE_GOALS,
        negative_goals: Sequence[str] = NEGATIVE_GOALS,
        clg_threshold: float = 0.03,
        expert_headway: float = 1.5,
        expert_speed_check: bool = True,
        answer: Literal["name", "letter"] = "name",
        config: dict[str, Any] | None = None,
        device: str = "cpu",
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if image_size < 16:
            raise ValueError(f"image_size must be >= 16, got {image_size}")
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        if reward not in ("carl", "vlm_rl", "env"):
            raise ValueError(f"reward must be 'carl', 'vlm_rl' or 'env', got {reward!r}")
        if action_mode not in ("text", "continuous"):
            raise ValueError(f"action_mode must be 'text' or 'continuous', got {action_mode!r}")
        if supersample < 1 or policy_frequency < 1:
            raise ValueError(f"supersample and policy_frequency must be >= 1, got {supersample}, {policy_frequency}")
        if answer not in ("name", "letter"):
            raise ValueError(f"answer must be 'name' or 'letter', got {answer!r}")
        if clg_threshold <= 0:
            raise ValueError(f"clg_threshold must be > 0, got {clg_threshold}")
        if expert_headway <= 0:
            raise ValueError(f"expert_headway must be > 0 seconds, got {expert_headway}")
        if reward == "vlm_rl":
            if clip_model is None:
                raise ValueError(
                    "reward='vlm_rl' needs clip_model: the path of a CLIP checkpoint folder (transformers CLIPModel)"
                )
            if not os.path.isdir(os.fspath(clip_model)):
                raise ValueError(f"clip_model {os.fspath(clip_model)!r} is not a folder (a saved CLIP checkpoint)")

        self.num_envs = num_envs
        self.image_size = image_size
        self.scenario = scenario
        self.env_id = SCENARIOS.get(scenario, scenario)
        self.max_episode_steps = max_episode_steps
        self.reward_mode = reward
        self.action_mode = action_mode
        self.action_kind = action_mode
        self.action_dim = 2
        self.policy_frequency = policy_frequency
        self.collision_penalty = float(collision_penalty)
        self.invalid_penalty = float(invalid_penalty)
        self.offroad_factor = float(offroad_factor)
        self.unsafe_factor = float(unsafe_factor)
        self.ttc_threshold = float(ttc_threshold)
        self.positive_goals = [positive_goals] if isinstance(positive_goals, str) else list(positive_goals)
        self.negative_goals = [negative_goals] if isinstance(negative_goals, str) else list(negative_goals)
        self.clg_threshold = float(clg_threshold)
        self.expert_headway = float(expert_headway)
        self.expert_speed_check = bool(expert_speed_check)
        self.device = torch.device(device)
        self.action_low = torch.full((2,), -1.0)  # [D]
        self.action_high = torch.full((2,), 1.0)  # [D]
        self._clip = load_clip(clip_model) if reward == "vlm_rl" else None

        gym, highway_env = _import_highway_env()
        short = next((name for name, env_id in SCENARIOS.items() if env_id == self.env_id), None)
        view = view_length if view_length is not None else VIEW_LENGTH.get(short or "", 50.0)
        if view <= 0:
            raise ValueError(f"view_length must be > 0, got {view}")
        self._render_size = image_size * supersample
        overrides: dict[str, Any] = {
            # Our own observation is the render; highway-env's default Kinematics observation builds pandas frames
            # every step (about half a step's time: BENCHMARKS.md), so it is replaced by an empty one.
            "observation": {"type": "AttributesObservation", "attributes": []},
            "screen_width": self._render_size,
            "screen_height": self._render_size,
            "scaling": self._render_size / view,
            "policy_frequency": policy_frequency,
            # highway-env's own time limit (seconds) matches ours, so it never cuts an episode short.
            "duration": max_episode_steps / policy_frequency,
        }
        if action_mode == "continuous":
            overrides["action"] = {"type": "ContinuousAction"}
        if self.env_id not in gym.registry:
            raise ValueError(
                f"unknown scenario {scenario!r}; short names: {', '.join(SCENARIOS)}, or a highway-env id"
            )
        self._envs = []
        for _ in range(num_envs):
            env = gym.make(self.env_id, render_mode="rgb_array", disable_env_checker=True).unwrapped
            if vehicles_count is None and "vehicles_count" in env.config:
                overrides["vehicles_count"] = 10
            elif vehicles_count is not None:
                if "vehicles_count" not in env.config:
                    raise ValueError(
                        f"scenario {self.env_id} has no vehicles_count setting; pass vehicles_count=None "
                        "(or set its own traffic entries through config)"
                    )
                overrides["vehicles_count"] = int(vehicles_count)
            env.configure({**overrides, **(config or {})})
            self._envs.append(env)
        first = self._envs[0]
        first.reset(seed=0)  # spaces and the action type follow the config only after a reset
        action_type = first.action_type
        if action_mode == "text":
            if not hasattr(action_type, "actions_indexes"):
                raise ValueError(f"scenario {self.env_id} has no meta-actions (DiscreteMetaAction); use continuous")
            self.actions = tuple(name for name in META_ACTIONS if name in action_type.actions_indexes)
            self._action_index = dict(action_type.actions_indexes)
        else:
            self.actions = ()
            self._action_index = {}
        default_speeds = highway_env.vehicle.controller.MDPVehicle.DEFAULT_TARGET_SPEEDS
        speeds = np.asarray(first.config.get("action", {}).get("target_speeds") or default_speeds, dtype=np.float64)
        self._target_speeds = speeds
        self.reference_speed = float(reference_speed) if reference_speed is not None else float(speeds.max())
        if self.reference_speed <= 0:
            raise ValueError(f"reference_speed must be > 0, got {self.reference_speed}")
        self.route_length = self.reference_speed * max_episode_steps / policy_frequency  # metres, CaRL's 100 %

        goal = GOALS.get(short or "", _DEFAULT_GOAL)
        if short == "highway" and reward == "env":
            goal = "Drive fast in the right lane without crashing."
        self.answer = answer
        self.letters = {name: chr(ord("A") + k) for k, name in enumerate(self.actions)}  # meta-action -> its letter
        if action_mode == "text" and answer == "letter":
            choices = ", ".join(f"{letter} {name}" for name, letter in self.letters.items())
            self.instruction = f"{goal} Answer with one letter: {choices}."
        elif action_mode == "text":
            self.instruction = f"{goal} Answer with one of: {', '.join(self.actions)}."
        else:
            self.instruction = f"{goal} Control acceleration and steering, each in [-1, 1]."

        self._viewers: list[Any] = [None] * num_envs
        self._images = np.zeros((num_envs, image_size, image_size, 3), dtype=np.uint8)  # [N, H, W, 3]
        self._elapsed = np.zeros(num_envs, dtype=np.int64)  # [N]
        self._terminated = np.zeros(num_envs, dtype=bool)  # [N]
        self._truncated = np.zeros(num_envs, dtype=bool)  # [N]
        self._success = np.zeros(num_envs, dtype=bool)  # [N]
        self._was_reset = np.zeros(num_envs, dtype=bool)  # [N]
        self._offsets: list[list[float]] = [[] for _ in range(num_envs)]  # lateral offsets of each episode (vlm_rl)

    # ------------------------------------------------------------------------------------------------ contract
    def reset(self, seed: int | Sequence[int], env_ids: Sequence[int] | None = None) -> Observation:
        """Start new episodes in the worlds `env_ids` (all when None), each from its own seed.

        Args:
            seed: One seed per reset world, or an int from which world k of `env_ids` gets `seed + k`.
            env_ids: Indices of the worlds to reset; None resets all N.

        Returns:
            The observation of all N worlds (copies): image `[N, H, W, 3]` uint8, N instructions, state `[N, 6]`.
        """
        ids = resolve_env_ids(env_ids, self.num_envs)
        seeds = resolve_seeds(seed, len(ids))
        for k, world_seed in zip(ids, seeds):
            # gymnasium wants a non-negative seed; the modulo keeps every non-negative seed as it is.
            self._envs[k].reset(seed=int(world_seed) % 2**64)
            self._render(k)
            self._offsets[k] = [self._lane_pose(self._envs[k].vehicle)[1]]
        self._elapsed[ids] = 0
        self._terminated[ids] = False
        self._truncated[ids] = False
        self._success[ids] = False
        self._was_reset[ids] = True
        return self._observation()

    def step(self, actions: list[str] | torch.Tensor) -> StepResult:
        """Advance every live world by one decision, render it and score it.

        Args:
            actions: N strings in text mode; a `[N, 2]` float tensor in continuous mode.

        Returns:
            A StepResult: observation of all worlds, reward `[N]` float32, terminated and truncated `[N]` bool, and
            info with `success` `[N]` bool, `reward_components` (name -> `[N]` float32), `reasons` (N strings, ""
            where nothing went wrong) and `action` (N strings: the meta-action executed, "" in continuous mode or
            for a frozen world). Worlds that had already ended are unchanged and get reward 0.

        Raises:
            ValueError: `actions` does not match the action mode and N.
            RuntimeError: Some world was never reset.
        """
        n = self.num_envs
        if not self._was_reset.all():
            raise RuntimeError(f"worlds {np.flatnonzero(~self._was_reset).tolist()} were never reset; reset first")
        reasons = [""] * n
        invalid = np.zeros(n)
        executed = [""] * n
        if self.action_mode == "text":
            actions = check_text_actions(actions, n, "HighwayEnv (text)")
            commands: list[Any] = []
            for k, text in enumerate(actions):
                name, reason = parse_meta_action(text, self.actions, self.letters if self.answer == "letter" else None)
                if name is None:
                    name, reasons[k], invalid[k] = "IDLE", f"{reason} (IDLE executed)", 1.0
                executed[k] = name
                commands.append(self._action_index[name])
        else:
            commands = list(check_continuous_actions(actions, n, self.action_dim))  # [N, D] float64, NaN -> 0

        live = ~(self._terminated | self._truncated)  # [N]
        components = {name: np.zeros(n) for name in self._component_names()}
        reward = np.zeros(n)
        crashed = np.zeros(n, dtype=bool)
        for k in np.flatnonzero(live):
            env = self._envs[k]
            before = self._progress_frame(env.vehicle)
            _, env_reward, env_terminated, env_truncated, _ = env.step(commands[k])
            self._render(k)
            vehicle = env.vehicle
            crashed[k] = bool(vehicle.crashed)
            self._elapsed[k] += 1
            self._offsets[k].append(self._lane_pose(vehicle)[1])
            if self.reward_mode == "carl":
                position, direction = before
                progress = max(float(np.dot(vehicle.position - position, direction)), 0.0) / self.route_length
                factor = 1.0
                if not vehicle.on_road:
                    factor *= self.offroad_factor
                if time_to_collision(env.road, vehicle) < self.ttc_threshold:
                    factor *= self.unsafe_factor
                components["progress"][k] = progress
                components["penalty"][k] = factor
                reward[k] = progress * factor - self.collision_penalty * crashed[k]
            elif self.reward_mode == "env":
                components["env"][k] = float(env_reward)
                reward[k] = float(env_reward)
            self._terminated[k] = bool(env_terminated) or crashed[k]
            self._truncated[k] = not self._terminated[k] and (
                bool(env_truncated) or self._elapsed[k] >= self.max_episode_steps
            )
            if self._terminated[k] or self._truncated[k]:
                self._success[k] = not crashed[k]
        if self.reward_mode == "vlm_rl":
            reward = self._vlm_rl_rewards(live, crashed, components)
        components["collision"] = crashed.astype(np.float64)
        components["invalid"] = np.where(live, invalid, 0.0)
        reward = np.where(live, reward - self.invalid_penalty * components["invalid"], 0.0)
        info = {
            "success": self._tensor(self._success.copy()),
            "reward_components": {
                name: self._tensor(np.where(live, value, 0.0).astype(np.float32)) for name, value in components.items()
            },
            "reasons": [reason if live[k] else "" for k, reason in enumerate(reasons)],
            "action": [name if live[k] else "" for k, name in enumerate(executed)],
        }
        return StepResult(
            obs=self._observation(),
            reward=self._tensor(reward.astype(np.float32)),
            terminated=self._tensor(self._terminated.copy()),
            truncated=self._tensor(self._truncated.copy()),
            info=info,
        )

    def close(self) -> None:
        """Drop the renderers and the highway-env instances.

        highway-env's own `close` calls `pygame.quit()`, which would pull the display from under every other env of
        this process, so the viewers are dropped here instead (pygame frees their surfaces).
        """
        self._viewers = [None] * self.num_envs
        for env in getattr(self, "_envs", []):
            env.viewer = None
        self._envs = []

    # ------------------------------------------------------------------------------------------------ rewards
    def _component_names(self) -> tuple[str, ...]:
        if self.reward_mode == "carl":
            return ("progress", "penalty")
        if self.reward_mode == "vlm_rl":
            return ("clg", "speed", "center", "angle", "stability")
        return ("env",)

    def _vlm_rl_rewards(self, live: np.ndarray, crashed: np.ndarray, components: dict[str, np.ndarray]) -> np.ndarray:
        """VLM-RL's hierarchical synthesis for the live worlds (see the module docstring); `components` is filled."""
        n = self.num_envs
        reward = np.zeros(n)
        rows = np.flatnonzero(live)
        if rows.size == 0:
            return reward
        images = torch.from_numpy(self._images[rows].copy())  # [K, H, W, 3]
        contrast = clip_contrast_reward(images, self.positive_goals, self.negative_goals, model=self._clip)  # [K]
        semantic = np.clip(1.0 + contrast.double().numpy() / self.clg_threshold, 0.0, 1.0)  # [K]
        v_ref = self.reference_speed
        for row, k in enumerate(rows):
            vehicle = self._envs[k].vehicle
            heading_error, offset = self._lane_pose(vehicle)
            speed_term = 1.0 - abs(float(vehicle.speed) - semantic[row] * v_ref) / v_ref
            center = max(0.0, 1.0 - abs(offset) / _MAX_CENTER_DISTANCE_M)
            angle = max(0.0, 1.0 - abs(heading_error) / _MAX_ANGLE_RAD)
            stability = max(0.0, 1.0 - float(np.std(self._offsets[k])) / _MAX_CENTER_STD_M)
            components["clg"][k] = semantic[row]
            components["speed"][k] = speed_term
            components["center"][k] = center
            components["angle"][k] = angle
            components["stability"][k] = stability
            reward[k] = -self.collision_penalty if crashed[k] else speed_term * center * angle * stability
        return reward

    # ------------------------------------------------------------------------------------------------ helpers
    @staticmethod
    def _lane_pose(vehicle: Any) -> tuple[float, float]:
        """(heading error to the lane in rad, lateral offset from the lane centre in m) of a vehicle."""
        lane = vehicle.lane
        longitudinal, lateral = lane.local_coordinates(vehicle.position)
        error = (float(vehicle.heading) - float(lane.heading_at(longitudinal)) + math.pi) % (2 * math.pi) - math.pi
        return error, float(lateral)

    @staticmethod
    def _progress_frame(vehicle: Any) -> tuple[np.ndarray, np.ndarray]:
        """The ego's position and its lane's unit direction there, before a step (CaRL's progress is measured on it)."""
        lane = vehicle.lane
        heading = float(lane.heading_at(lane.local_coordinates(vehicle.position)[0]))
        return np.array(vehicle.position, dtype=np.float64), np.array([math.cos(heading), math.sin(heading)])

    def _render(self, k: int) -> None:
        """Draw world k into `self._images[k]`.

        The viewer is driven directly (`display` + `get_image`) instead of through `env.render()`: `render()` arms
        highway-env's automatic rendering, which then also draws every intermediate simulation frame of the next
        step (4 to 14 extra frames a decision) for nothing.
        """
        viewer = self._viewers[k]
        if viewer is None:
            viewer = self._viewers[k] = _make_viewer(self._envs[k])
        viewer.display()
        frame = viewer.get_image()  # [R, R, 3] uint8
        if frame.shape[0] != self.image_size or frame.shape[1] != self.image_size:
            frame = np.asarray(Image.fromarray(frame).resize((self.image_size, self.image_size), Image.BOX))
        self._images[k] = frame

    def _state(self) -> np.ndarray:
        rows = []
        for env in self._envs:
            vehicle = env.vehicle
            heading_error, offset = self._lane_pose(vehicle)
            x, y = (float(v) for v in vehicle.position)
            rows.append([x, y, float(vehicle.speed), float(vehicle.heading), offset, heading_error])
        return np.array(rows, dtype=np.float32).reshape(self.num_envs, 6)

    def _observation(self) -> Observation:
        return Observation(
            image=self._tensor(self._images.copy()),
            instruction=[self.instruction] * self.num_envs,
            state=self._tensor(self._state()),
        )

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        # `array` is always a fresh array here, so from_numpy hands out memory no one else holds.
        tensor = torch.from_numpy(array)
        return tensor if self.device.type == "cpu" else tensor.to(self.device)


def _import_highway_env() -> tuple[Any, Any]:
    """`gymnasium` and `highway_env` (which registers its ids with gymnasium on import).

    Raises:
        ImportError: highway-env is not installed, with the extra that brings it.
    """
    try:
        import gymnasium
        import highway_env
        import highway_env.vehicle.controller  # noqa: F401  (MDPVehicle's default target speeds)
    except ImportError as error:
        raise ImportError(
            f"the highway env needs highway-env and gymnasium (pip install 'mmrl[driving]'): {error}"
        ) from error
    return gymnasium, highway_env


def _make_viewer(env: Any) -> Any:
    """highway-env's `EnvViewer` for offscreen drawing into a surface.

    The viewer disables itself when `SDL_VIDEODRIVER=dummy` (its frames are then all background), yet draws fine
    offscreen under that driver, so it is re-enabled. When no video driver can start at all (a headless machine
    without the variable), the dummy driver is selected and the viewer built again.
    """
    import pygame
    from highway_env.envs.common.graphics import EnvViewer

    try:
        viewer = EnvViewer(env)
    except pygame.error:
        os.environ["SDL_VIDEODRIVER"] = "dummy"
        viewer = EnvViewer(env)
    viewer.enabled = True
    env.viewer = viewer
    return viewer
