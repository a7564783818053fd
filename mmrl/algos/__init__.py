"""Advantage estimators and policy losses: pure tensor functions registered by name.

The trainer looks them up in `ADVANTAGES` and `POLICY_LOSSES` and calls the one the config names; it never
branches on the variant itself.
"""

from rewards.registry import Registry

ADVANTAGES = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")

from .advantages import grpo_advantages  # noqa: E402
from .losses import LossOutput, aggregate, kl_estimate, ppo_clip_loss  # noqa: E402

__all__ = ["ADVANTAGES", "POLICY_LOSSES", "LossOutput", "aggregate", "grpo_advantages", "kl_estimate", "ppo_clip_loss"]
