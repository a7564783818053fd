"""What every algorithm piece agrees on: the registries, the call each registered function has, and `LossOutput`.

A leaf of `mmrl.algos` (it imports only torch and the generic `Registry`): the estimators and losses register into
these registries, and the package's `__init__` re-exports them, so no module of the package imports its parent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from rewards.registry import Registry

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k1", "k2", "k3"]


@dataclass(frozen=True)
class LossOutput:
    """A scalar loss to differentiate and detached diagnostics (synced once by the logger, never `.item()` here)."""

    loss: torch.Tensor  # [] with grad
    metrics: dict[str, torch.Tensor]  # name -> [] detached


class AdvantageFn(Protocol):
    """What every registered advantage estimator accepts: `[R]` rewards, groups contiguous -> `[R]` advantages."""

    def __call__(
        self, rewards: torch.Tensor, *, group_size: int, scale_by_std: bool = ..., eps: float = ...
    ) -> torch.Tensor: ...


class StepAdvantageFn(Protocol):
    """What every registered step-credit estimator accepts: `[R, T]` returns-to-go of each turn and `[R, T]` bool
    `active` (the world acted at turn t), groups contiguous, and `[R, T]` state keys (equal where the observation was
    the same; GiGPO's anchor states) -> `[R, T]` advantages, 0 where not active."""

    def __call__(
        self,
        returns: torch.Tensor,
        active: torch.Tensor,
        *,
        group_size: int,
        scale_by_std: bool = ...,
        eps: float = ...,
        state_keys: torch.Tensor | None = ...,
        step_weight: float = ...,
    ) -> torch.Tensor: ...


class PolicyLossFn(Protocol):
    """What every registered policy loss accepts; each returns metrics `clip_fraction` (and `_low`/`_high`),
    `approx_kl` and `ratio/mean|min|max`."""

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        completion_mask: torch.Tensor,
        *,
        clip_low: float = ...,
        clip_high: float = ...,
        aggregation: Aggregation = ...,
        max_len: int | None = ...,
        token_weights: torch.Tensor | None = ...,
    ) -> LossOutput: ...


# Not `Registry[AdvantageFn]`: `register` returns its type parameter, so the decorated functions would lose their
# extra keywords (`scale`, `clip_c`) to the type checker. Annotate the looked-up function with the Protocol instead.
ADVANTAGES = Registry("advantage estimator")  # episode credit: one advantage per episode return
# Step credit (`algo.credit: step`): one advantage per turn, against the same turn of the group's other worlds. Its
# names are those of the episode estimators they generalise; `algo.advantage` picks from this registry then.
STEP_ADVANTAGES = Registry("step-credit advantage estimator")
# Advantages from a learned value function (`algo.advantage: gae`): these build a critic, see `algos.critic`.
CRITIC_ADVANTAGES = Registry("critic advantage estimator")
POLICY_LOSSES = Registry("policy loss")
