"""Policy-gradient losses over per-token log-probs, with padding masked out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from . import POLICY_LOSSES

Aggregation = Literal["token_mean", "seq_mean_token_mean"]
KLEstimator = Literal["k1", "k2", "k3"]


@dataclass(frozen=True)
class LossOutput:
    """A scalar loss to differentiate and detached diagnostics (synced once by the logger, never `.item()` here)."""

    loss: torch.Tensor  # [] with grad
    metrics: dict[str, torch.Tensor]  # name -> [] detached


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: Aggregation = "token_mean") -> torch.Tensor:
    """Reduce per-token values to a scalar over the tokens in `mask`.

    Args:
        values: `[R, L]` per token.
        mask: `[R, L]` bool.
        mode: `token_mean` averages over every unmasked token of the batch (DAPO); `seq_mean_token_mean`
            averages within each row, then over rows (the original GRPO).

    Returns:
        `[]`.
    """
    mask = mask.to(values.dtype)
    values = torch.where(mask.bool(), values, torch.zeros_like(values))  # inf/NaN in padding must not leak
    if mode == "token_mean":
        return (values * mask).sum() / mask.sum().clamp(min=1)
    if mode == "seq_mean_token_mean":
        per_row = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [R]
        return per_row.mean()
    raise ValueError(f"unknown aggregation {mode!r}; use token_mean or seq_mean_token_mean")


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy (http://joschu.net/blog/kl-approx.html).

    Args:
        logprobs: `[R, L]` per token under the policy.
        ref_logprobs: `[R, L]` per token under the frozen reference.

    Returns:
        `[R, L]`: k1 = log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r with r = pi_ref / pi (unbiased, >= 0).
    """
    log_ratio = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        log_ratio = log_ratio.clamp(-20.0, 20.0)  # exp overflow guard, as verl does
        return log_ratio.exp() - 1 - log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; use k1, k2 or k3")


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: Aggregation = "token_mean",
) -> LossOutput:
    """Clipped surrogate objective (PPO, https://arxiv.org/abs/1707.06347) with asymmetric clipping.

    `clip_high > clip_low` is DAPO's clip-higher (https://arxiv.org/abs/2503.14476), which keeps exploration alive.

    Args:
        logprobs: `[R, L]` per token under the current weights (with grad).
        old_logprobs: `[R, L]` per token under the weights that sampled the completions.
        advantages: `[R]`, one per completion, shared by its tokens.
        completion_mask: `[R, L]` bool.

    Returns:
        `LossOutput` with metrics `clip_fraction` and `approx_kl` (k3 between old and current).
    """
    mask = completion_mask.bool()
    # Padding positions may hold anything (even inf); zero them before exp so nothing leaks into gradients.
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
    ratio = log_ratio.exp()  # [R, L]
    adv = advantages.unsqueeze(-1)  # [R, 1]
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)  # [R, L]
    loss = aggregate(per_token, mask, aggregation)
    with torch.no_grad():
        clip_fraction = aggregate((clipped > unclipped).float(), mask)
        approx_kl = aggregate(log_ratio.exp() - 1 - log_ratio, mask)
    return LossOutput(loss=loss, metrics={"clip_fraction": clip_fraction, "approx_kl": approx_kl})
