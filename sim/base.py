"""The one environment contract every task, simulator and renderer is wrapped into.

A `VecEnv` holds N independent worlds. Observations carry images as uint8 tensors `[N, H, W, 3]` and one
instruction string per world. Actions are either text (a list of N strings the env parses) or continuous
(a float tensor `[N, D]`). There is no autoreset: the caller decides which worlds to reset with `env_ids`.
Single-step tasks (visual RLVR) are envs whose episodes end after one step.

Every tensor an env returns is a fresh copy, never a view of an internal buffer (ManiSkill PR #828).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch

ActionKind = Literal["text", "continuous"]


@dataclass(frozen=True)
class Observation:
    """What the policy sees of N worlds."""

    image: torch.Tensor  # [N, H, W, 3] uint8
    instruction: list[str]  # N strings
    state: torch.Tensor | None = None  # [N, S] privileged state, optional

    def __len__(self) -> int:
        return len(self.instruction)

    def select(self, rows: Sequence[int] | torch.Tensor) -> Observation:
        """The observation of a subset of worlds (copies)."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        return Observation(
            image=self.image[idx].clone(),
            instruction=[self.instruction[i] for i in idx.tolist()],
            state=None if self.state is None else self.state[idx].clone(),
        )


@dataclass(frozen=True)
class StepResult:
    """The outcome of one step of N worlds.

    `info` holds per-world entries as tensors or lists of length N. Conventions:
    `info["reward_components"]`: dict name -> [N] float tensor, each logged as `reward/<name>`;
    `info["reasons"]`: list of N strings saying why a row scored low ("" where nothing went wrong);
    `info["success"]`: [N] bool tensor where the task has a notion of success.
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
