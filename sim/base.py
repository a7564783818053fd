"""The one environment contract every task, simulator and renderer is wrapped into.

A `VecEnv` holds N independent worlds. Observations carry images as uint8 tensors `[N, H, W, 3]` (or
`[N, V, H, W, 3]`: V views of each world, such as two cameras, shown to the policy in order) and one instruction
string per world, optionally the privileged `state` `[N, S]` and the robot's proprioceptive state `proprio`
`[N, P]` (what a deployed robot measures of itself). Actions are either text (a list of N strings the env parses) or continuous
(a float tensor `[N, D]`). There is no autoreset: the caller decides which worlds to reset with `env_ids`.
Single-step tasks (visual RLVR) are envs whose episodes end after one step.

Every tensor an env returns is a fresh copy, never a view of an internal buffer (ManiSkill PR #828).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch

ActionKind = Literal["text", "continuous"]


@dataclass(frozen=True)
class Observation:
    """What the policy sees of N worlds."""

    image: torch.Tensor  # [N, H, W, 3] uint8, or [N, V, H, W, 3]: V views of each world (cameras), in order
    instruction: list[str]  # N strings
    state: torch.Tensor | None = None  # [N, S] privileged state, optional
    # [N, P] float32, what the robot knows of itself (joint or end-effector positions, velocities, gripper): the
    # state a deployed policy reads too, never the task's hidden quantities (a target's position); optional.
    proprio: torch.Tensor | None = None
    # [N, 2] int64 (H, W): each world's images fill the top-left H x W of the H x W canvas of `image`, the rest is
    # padding (an env that shows images at their own sizes: the dataset env's resize="native"); None: they fill it.
    sizes: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.instruction)

    def view_images(self) -> list[list[torch.Tensor]]:
        """Every world's V images as shown, each cropped to its world's size (`sizes`): N lists of `[h, w, 3]` uint8
        tensors (views of `image`, not copies). What a policy encodes."""
        views = self.views  # [N, V, H, W, 3]
        if self.sizes is None:
            return [list(row) for row in views]
        return [[view[:h, :w] for view in row] for row, (h, w) in zip(views, self.sizes.tolist())]

    @property
    def views(self) -> torch.Tensor:
        """Every world's images as `[N, V, H, W, 3]` (V = 1 for one image per world); not a copy."""
        return self.image if self.image.dim() == 5 else self.image.unsqueeze(1)

    @property
    def first_view(self) -> torch.Tensor:
        """Each world's first (or only) image `[N, H, W, 3]`: what pictures of an episode show; not a copy."""
        return self.image[:, 0] if self.image.dim() == 5 else self.image

    def select(self, rows: Sequence[int] | torch.Tensor) -> Observation:
        """The observation of a subset of worlds (copies)."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        return Observation(
            image=self.image[idx].clone(),
            instruction=[self.instruction[i] for i in idx.tolist()],
            state=None if self.state is None else self.state[idx].clone(),
            proprio=None if self.proprio is None else self.proprio[idx].clone(),
            sizes=None if self.sizes is None else self.sizes[idx].clone(),
        )


@dataclass(frozen=True)
class StepResult:
    """The outcome of one step of N worlds.

    `info` holds per-world entries as tensors or lists of length N. Conventions:
    `info["reward_components"]`: dict name -> [N] float tensor, each logged as `reward/<name>`;
    `info["reasons"]`: list of N strings saying why a row scored low ("" where nothing went wrong);
    `info["success"]`: [N] bool tensor where the task has a notion of success;
    `info["task"]`: list of N strings, the kind of task each world holds, where an env mixes kinds (evaluation
    reports per kind).
    """

    obs: Observation
    reward: torch.Tensor  # [N] float32
    terminated: torch.Tensor  # [N] bool
    truncated: torch.Tensor  # [N] bool
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class VecEnv(Protocol):
    """N independent worlds behind one batched interface."""

    num_envs: int
    action_kind: ActionKind
    max_episode_steps: int

    def reset(self, seed: int | Sequence[int], env_ids: Sequence[int] | None = None) -> Observation:
        """Reset the worlds `env_ids` (all when None) and return the observation of ALL worlds.

        `seed` is either one int per reset world, or a single int from which world k of `env_ids` gets
        `seed + k`. GRPO groups pass the same seed G times so the group starts from one state.
        """
        ...

    def step(self, actions: list[str] | torch.Tensor) -> StepResult:
        """Advance every world by one action: N strings for text envs, a `[N, D]` tensor for continuous ones."""
        ...

    def close(self) -> None: ...


def resolve_seeds(seed: int | Sequence[int], count: int) -> list[int]:
    """Per-world seeds for `count` worlds from an int (seed + k) or an explicit sequence."""
    if isinstance(seed, int):
        return [seed + k for k in range(count)]
    seeds = [int(s) for s in seed]
    if len(seeds) != count:
        raise ValueError(f"got {len(seeds)} seeds for {count} worlds")
    return seeds


def resolve_env_ids(env_ids: Sequence[int] | None, num_envs: int) -> list[int]:
    """The worlds a reset names: all N when `env_ids` is None; out-of-range or repeated ids raise."""
    ids = list(range(num_envs)) if env_ids is None else [int(i) for i in env_ids]
    bad = [i for i in ids if not 0 <= i < num_envs]
    if bad:
        raise ValueError(f"env_ids {bad} out of range for {num_envs} worlds")
    if len(set(ids)) != len(ids):
        raise ValueError(f"env_ids has duplicates: {ids}")
    return ids


def check_expert_noise(
    noise: float, generator: torch.Generator | None, never: Sequence[int] = (), *, probability: bool = True
) -> None:
    """The checks every scripted expert makes before answering: `noise` a probability (or, with `probability=False`,
    a scale such as a standard deviation: any finite number >= 0), a generator to draw it from when `noise > 0` (no
    hidden global randomness), and no world that was never reset (`never`: their indices).

    Raises:
        ValueError: `noise` is not a number in [0, 1] (a finite one >= 0 with `probability=False`), or `noise > 0`
            without a generator.
        RuntimeError: `never` is not empty.
    """
    number = not isinstance(noise, bool) and isinstance(noise, numbers.Real) and math.isfinite(noise)
    if probability and not (number and 0 <= noise <= 1):
        raise ValueError(f"noise must be a probability in [0, 1], got {noise!r}")
    if not probability and not (number and noise >= 0):
        raise ValueError(f"noise must be a finite number >= 0, got {noise!r}")
    if noise > 0 and generator is None:
        raise ValueError("expert_action(noise > 0) needs a torch.Generator (no hidden global randomness)")
    if never:
        raise RuntimeError(f"worlds {list(never)} were never reset; reset them first")


def check_text_actions(actions: Sequence[str], num_envs: int, name: str) -> list[str]:
    """The N answers of a text env's `step` as a list; anything but N strings raises, naming the env `name`."""
    if isinstance(actions, str) or not isinstance(actions, Sequence):
        raise ValueError(f"{name} takes a list of {num_envs} strings, got {type(actions).__name__}")
    if len(actions) != num_envs:
        raise ValueError(f"got {len(actions)} actions for {num_envs} worlds")
    if not all(isinstance(a, str) for a in actions):
        raise ValueError(f"every action of {name} must be a string")
    return list(actions)


def check_continuous_actions(
    actions: torch.Tensor | Sequence[Sequence[float]],
    num_envs: int,
    action_dim: int,
    low: float | np.ndarray = -1.0,
    high: float | np.ndarray = 1.0,
) -> np.ndarray:
    """The `[N, D]` actions of a continuous env's `step` as a float64 NumPy copy, NaN read as 0, clipped to bounds.

    A copy: a float64 CPU tensor would otherwise share memory with the caller's, and NaNs are zeroed in place.

    Raises:
        ValueError: `actions` is not `[num_envs, action_dim]`.
    """
    array = torch.as_tensor(actions).detach().to("cpu", torch.float64).numpy().copy()  # [N, D]
    if array.shape != (num_envs, action_dim):
        raise ValueError(f"actions must be [N={num_envs}, D={action_dim}], got {list(array.shape)}")
    array[np.isnan(array)] = 0.0  # (np.nan_to_num costs more than the rest of the action handling)
    return np.clip(array, low, high)


class PerWorldReset:
    """The contract's `reset` for envs that start their worlds one reset at a time.

    A subclass sets `num_envs` and implements `reset_worlds(ids, seeds)` (start the worlds `ids`, world `ids[k]` from
    `seeds[k]` only) and `_observation()` (all N worlds, copies).
    """

    num_envs: int

    def reset(self, seed: int | Sequence[int], env_ids: Sequence[int] | None = None) -> Observation:
        """Start new episodes in the worlds `env_ids` (all when None); the others are left as they are.

        Args:
            seed: One seed per reset world, or an int from which world k of `env_ids` gets `seed + k`.
            env_ids: Indices of the worlds to reset; None resets all N.

        Returns:
            The observation of all N worlds (copies): image `[N, H, W, 3]` uint8 and N instructions.
        """
        ids = resolve_env_ids(env_ids, self.num_envs)
        seeds = resolve_seeds(seed, len(ids))
        if ids:
            self.reset_worlds(ids, seeds)
        return self._observation()

    def reset_worlds(self, ids: list[int], seeds: list[int]) -> None:
        raise NotImplementedError

    def _observation(self) -> Observation:
        raise NotImplementedError


class SingleStepImageEnv(PerWorldReset):
    """The base of the image envs whose worlds are drawn, shown once and scored: one answer per world, then done.

    grounding, gui_click and dataset are single-step; the render envs (svg, chart, cad) share its buffers and reset
    and add their own multi-turn `step` (self-correction over `turns`). In the manner of ManiSkill3's task hooks, a
    subclass calls `super().__init__(num_envs, image_size, device)` and implements:

    * `draw_worlds(ids, seeds) -> (images, instructions, boxes)`: draw the worlds `ids` (`[K]` indices), each from
      its own seed only: `images` `[K, H, W, 3]` uint8 (NumPy or torch), K instruction strings, and `boxes` `[K, 4]`
      float target boxes (x1, y1, x2, y2, pixels of the image; NaN rows for targets without one) or None. Per-world
      state beyond these (scenes, screens, records) is the subclass's to keep.
    * `score(texts) -> (reward, info)`: score one answer per world (all N live): reward `[N]` float and the info
      dict of the contract (`reward_components`, `reasons`, `success`, ...), tensors on any device.

    The base owns the rest: `reset` (`PerWorldReset`: seeds and ids resolved as the contract says, unreset worlds
    untouched), `step`
    (checked actions; stepping a world whose episode ended, or that was never reset, raises; every episode ends:
    terminated True, truncated False), `target_boxes`, and returning fresh copies on `device`. Buffers live on the
    CPU: `_images` `[N, H, W, 3]` uint8, `_instructions` (N strings), `_target_boxes` `[N, 4]` float32,
    `_ended` and `_was_reset` `[N]` bool.
    """

    action_kind: ActionKind = "text"
    max_episode_steps: int = 1
    has_boxes: bool = True  # whether `target_boxes` means anything for this env

    def __init__(self, num_envs: int, image_size: int, device: str | torch.device = "cpu"):
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        self.num_envs = num_envs
        self.image_size = image_size
        self.device = torch.device(device)
        self._images = torch.zeros(num_envs, image_size, image_size, 3, dtype=torch.uint8)  # [N, H, W, 3]
        self._instructions = [""] * num_envs
        self._target_boxes = torch.full((num_envs, 4), float("nan"))  # [N, 4]
        self._ended = torch.ones(num_envs, dtype=torch.bool)  # [N]; worlds never reset count as ended
        self._was_reset = torch.zeros(num_envs, dtype=torch.bool)  # [N]

    # ------------------------------------------------------------------------------------------------ hooks
    def draw_worlds(
        self, ids: list[int], seeds: list[int]
    ) -> tuple[np.ndarray | torch.Tensor, list[str], np.ndarray | torch.Tensor | None]:
        raise NotImplementedError

    def score(self, texts: list[str]) -> tuple[torch.Tensor, dict[str, Any]]:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------------ contract
    @property
    def target_boxes(self) -> torch.Tensor:
        """The target boxes `[N, 4]` float32 (x1, y1, x2, y2; x2/y2 exclusive; NaN rows without one), a copy."""
        if not self.has_boxes:
            raise AttributeError(f"{type(self).__name__} has no target boxes")
        return self._out(self._target_boxes)

    @property
    def reward_target_names(self) -> tuple[str, ...]:
        """What `reward_targets` holds: the names registered rewards read targets by (`sim.mix`)."""
        return ("target_box",) if self.has_boxes else ()

    def reward_targets(self) -> dict[str, Any]:
        """The current worlds' targets by the names registered rewards take (`target_box` `[N, 4]`), CPU copies."""
        return {"target_box": self._target_boxes.clone()} if self.has_boxes else {}

    def reset_worlds(self, ids: list[int], seeds: list[int]) -> None:
        """Draws the worlds `ids` (`draw_worlds`) into the buffers; their episodes start."""
        images, instructions, boxes = self.draw_worlds(ids, seeds)
        index = torch.tensor(ids, dtype=torch.long)
        self._images[index] = torch.as_tensor(images, dtype=torch.uint8).cpu()
        self._target_boxes[index] = (
            float("nan") if boxes is None else torch.as_tensor(boxes, dtype=torch.float32).cpu()
        )
        for i, instruction in zip(ids, instructions):
            self._instructions[i] = instruction
        self._ended[index] = False
        self._was_reset[index] = True

    def step(self, actions: list[str]) -> StepResult:
        """Score one answer per world; every episode then ends.

        Args:
            actions: N answer strings.

        Returns:
            A StepResult with the unchanged observation, reward `[N]` float32, terminated all True, truncated all
            False, and the info of `score`.

        Raises:
            ValueError: `actions` is not a list of N strings.
            RuntimeError: Some worlds already ended their episode and were not reset since.
        """
        texts = check_text_actions(actions, self.num_envs, type(self).__name__)
        ended = self._ended.nonzero().flatten().tolist()
        if ended:
            raise RuntimeError(f"worlds {ended} have ended their episode (or were never reset); reset them first")
        reward, info = self.score(texts)
        self._ended[:] = True
        n, device = self.num_envs, self.device
        return StepResult(
            obs=self._observation(),
            reward=reward.to(device=device, dtype=torch.float32),
            terminated=torch.ones(n, dtype=torch.bool, device=device),
            truncated=torch.zeros(n, dtype=torch.bool, device=device),
            info=_on_device(info, device),
        )

    def close(self) -> None:
        """Nothing to release by default: worlds are drawn in-process."""

    def _observation(self) -> Observation:
        return Observation(image=self._out(self._images), instruction=list(self._instructions))

    def _out(self, tensor: torch.Tensor) -> torch.Tensor:
        """A fresh copy on the env's device (never a view of the env's buffers)."""
        return tensor.to(self.device, copy=True)


class TextEpisodeEnv(PerWorldReset):
    """The base of the multi-step envs with text actions and click experts (gui_task, miniwob): per-world episodes.

    A subclass calls `_start_bookkeeping(num_envs)` in its `__init__` (after setting `num_envs`, `image_size`,
    `max_episode_steps`, `device` and its `_images` buffer `[N, S, S, 3]` uint8) and implements:

    * `start_worlds(ids, seeds)`: start the worlds `ids`, each from its own seed only, writing their `_images`,
      `_instructions` and `task_names` rows; the base then starts their episodes.
    * `step(actions)`: check the actions with `_check_step`, advance the running worlds, keep `_steps`,
      `_terminated`, `_truncated`, `_success` and `_ended` (frozen until reset) up to date, and return `_result`.
    * `expert_answer(i, offset)`: the expert's next action for running world i; a click lands `offset` `[2]` (x, y)
      times the clicked element's width and height off its centre (`expert_action`'s noise).

    Per-world state (Python lists, only Python reads them): `_steps` taken this episode, `_ended` (never-reset
    worlds count as ended), `_terminated`, `_truncated`, `_success`.
    """

    action_kind: ActionKind = "text"
    image_size: int
    max_episode_steps: int
    device: torch.device
    _images: torch.Tensor  # [N, S, S, 3] uint8

    def _start_bookkeeping(self, num_envs: int) -> None:
        self._instructions = [""] * num_envs
        self.task_names = [""] * num_envs  # the task of each world
        self._was_reset = [False] * num_envs
        self._steps = [0] * num_envs
        self._ended = [True] * num_envs  # frozen until reset; never-reset worlds count as ended
        self._terminated = [False] * num_envs
        self._truncated = [False] * num_envs
        self._success = [False] * num_envs

    def start_worlds(self, ids: list[int], seeds: list[int]) -> None:
        raise NotImplementedError

    def expert_answer(self, i: int, offset: np.ndarray) -> str:
        raise NotImplementedError

    def reset_worlds(self, ids: list[int], seeds: list[int]) -> None:
        """Starts the worlds `ids` (`start_worlds`) and their episodes."""
        self.start_worlds(ids, seeds)
        for i in ids:
            self._was_reset[i] = True
            self._steps[i] = 0
            self._ended[i] = self._terminated[i] = self._truncated[i] = self._success[i] = False

    def expert_action(self, noise: float = 0.0, generator: torch.Generator | None = None) -> list[str]:
        """The expert's next action for every world's current screen (`finish()` for worlds that ended).

        Args:
            noise: Std of the Gaussian noise on click coordinates, in units of the clicked element's width (x) and
                height (y). Other actions are never noisy.
            generator: Source of the noise; required when `noise > 0`.

        Returns:
            N action strings, e.g. `click(57, 83)`, `type("fox")`, `scroll(down)`, `press(back)`, `finish()`.
        """
        # [N, 2], drawn for every world so that worlds stay independent
        offsets = noise * noise_draws(self.num_envs, 2, noise, generator)
        return ["finish()" if self._ended[i] else self.expert_answer(i, offsets[i]) for i in range(self.num_envs)]

    def _check_step(self, actions: list[str]) -> list[str]:
        """The N actions of a step as a list, after checking them and that every world was reset."""
        texts = check_text_actions(actions, self.num_envs, type(self).__name__)
        never = [i for i, started in enumerate(self._was_reset) if not started]
        if never:
            raise RuntimeError(f"worlds {never} were never reset; reset them first")
        return texts

    def _result(self, reward: torch.Tensor, info: dict[str, Any]) -> StepResult:
        """The step's result: the new observation, `reward` `[N]`, the episodes' ends, `info` plus `task` and
        `success` (`[N]` bool: the episode ended in success, repeated while frozen), all on `device`."""
        dev = self.device
        return StepResult(
            obs=self._observation(),
            reward=reward.to(device=dev, dtype=torch.float32),
            terminated=torch.tensor(self._terminated, device=dev),
            truncated=torch.tensor(self._truncated, device=dev),
            info={**info, "task": list(self.task_names), "success": torch.tensor(self._success, device=dev)},
        )

    def _observation(self) -> Observation:
        return Observation(image=self._images.clone(), instruction=list(self._instructions))


def noise_draws(num: int, dims: int, noise: float, generator: torch.Generator | None) -> np.ndarray:
    """`[num, dims]` standard normal draws for an expert's `noise` (a scale; zeros when it is 0), after
    `check_expert_noise`; the caller scales them."""
    check_expert_noise(noise, generator, probability=False)
    if noise == 0:
        return np.zeros((num, dims))
    return torch.randn(num, dims, generator=generator, dtype=torch.float64).numpy()


def _on_device(value: Any, device: torch.device) -> Any:
    """`value` with every tensor (in dicts and lists too) moved to `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _on_device(v, device) for k, v in value.items()}
    return value
