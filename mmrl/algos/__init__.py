"""Advantage estimators and policy losses: pure tensor functions registered by name.

The trainer looks them up in `ADVANTAGES` and `POLICY_LOSSES` and calls the one the config names; it never
branches on the variant itself. Closed choices (aggregation, KL estimator) are `Literal`s, not registries.
PAPO's extra terms live in `mmrl.algos.papo`, the data-side options (dynamic sampling, overlong handling,
difficulty filtering, multi-turn returns) in `mmrl.algos.data`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from rewards.registry import Registry

if TYPE_CHECKING:
    from .losses import Aggregation, LossOutput


class AdvantageFn(Protocol):
    """What every registered advantage estimator accepts: `[R]` rewards, groups contiguous -> `[R]` advantages."""

    def __call__(
        self, rewards: torch.Tensor, *, group_size: int, scale_by_std: bool = ..., eps: float = ...
    ) -> torch.Tensor: ...


class PolicyLossFn(Protocol):
    """What every registered policy loss accepts; each returns metrics `clip_fraction` and `approx_kl`."""

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
    ) -> LossOutput: ...


# Not `Registry[AdvantageFn]`: `register` returns its type parameter, so the decorated functions would lose their
# extra keywords (`scale`, `clip_c`) to the type checker. Annotate the looked-up function with the Protocol instead.
ADVANTAGES = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")

from .advantages import (  # noqa: E402
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from .losses import (  # noqa: E402
    LossOutput,
    aggregate,
    dual_clip_loss,
    entropy_bonus_loss,
    entropy_from_logits,
    gspo_loss,
    kl_estimate,
    kl_penalized_rewards,
    ppo_clip_loss,
)

__all__ = [
    "ADVANTAGES",
    "POLICY_LOSSES",
    "AdvantageFn",
    "LossOutput",
    "PolicyLossFn",
    "aggregate",
    "dr_grpo_advantages",
    "dual_clip_loss",
    "entropy_bonus_loss",
    "entropy_from_logits",
    "grpo_advantages",
    "gspo_loss",
    "kl_estimate",
    "kl_penalized_rewards",
    "ppo_clip_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
]
