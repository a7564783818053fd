"""Advantage estimators over contiguous groups: rows [g*G, (g+1)*G) are one group."""

from __future__ import annotations

import torch

from . import ADVANTAGES


@ADVANTAGES.register("grpo")
def grpo_advantages(
    rewards: torch.Tensor, *, group_size: int, scale_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantages (GRPO, https://arxiv.org/abs/2402.03300, eq. 3).

    Each reward minus its group's mean, divided by the group's standard deviation when `scale_by_std`
    (Dr. GRPO, https://arxiv.org/abs/2503.20783, drops that division as a source of difficulty bias).

    Args:
        rewards: `[R]` with R = B*G, groups contiguous.
        group_size: G.
        scale_by_std: divide by the group's (unbiased) standard deviation plus `eps`.
        eps: keeps groups whose rewards are all equal at zero advantage instead of 0/0.

    Returns:
        `[R]` advantages, zero for groups whose rewards are all equal.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size)  # [B, G]
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_by_std and group_size > 1:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)
