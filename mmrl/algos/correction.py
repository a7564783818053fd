"""Rollout correction: importance weights for the gap between the sampler's log-probs and the trainer's.

The rows a step trains on were sampled by one computation of the policy (transformers' `generate`, a vLLM engine, a
copy one update behind when collection is pipelined) and are scored by another (the trainer's forward). Where the two
differ (another kernel, another precision, stale weights), the PPO ratio `pi_theta / pi_old` with `pi_old` the
trainer's recomputed log-probs is taken on samples that `pi_old` did not draw. The correction reweights every token
by `rho = pi_old / pi_rollout`, bounded so that a few tokens the sampler found unlikely cannot dominate the batch
(truncated importance sampling, "TIS"; masked importance sampling, "MIS", as in verl's rollout correction and
TRL's `vllm_importance_sampling_mode`):

    token_truncate     w_t = min(rho_t, cap)
    token_mask         w_t = rho_t if 1/cap <= rho_t <= cap else 0
    sequence_truncate  w_t = min(rho_seq, cap)                        rho_seq = exp(sum_t log rho_t), one per row
    sequence_mask      w_t = rho_seq if 1/cap <= rho_seq <= cap else 0

The weights are constants (no gradient) multiplying each token's surrogate loss; padding gets weight 0. The mismatch
metrics say how far the two computations are apart, whether or not a correction is applied.
"""

from __future__ import annotations

from typing import Literal

import torch

from .losses import aggregate

CorrectionMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
CORRECTION_MODES: tuple[str, ...] = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
_MAX_LOG_RATIO = 20.0  # as in the losses: exp(20) never binds in sane training and never overflows


def mismatch_metrics(
    trainer_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the sampler's log-probs are from the trainer's on the same tokens (all detached).

    Returns:
        `mismatch/kl`: k3 estimate of KL(rollout || trainer) from the rollout's own samples (the tokens are its
        draws), averaged over tokens; `mismatch/abs_logprob_diff`: mean `|log pi_old - log pi_rollout|`;
        `mismatch/ratio_max`: the largest token ratio `pi_old / pi_rollout`; `mismatch/ratio_min`: the smallest.
    """
    mask = mask.bool()
    with torch.no_grad():
        log_rho = torch.where(mask, trainer_logprobs - rollout_logprobs, torch.zeros_like(trainer_logprobs))
        log_rho = log_rho.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        rho = log_rho.exp()
        tokens = mask.any()
        return {
            "mismatch/kl": aggregate(rho - 1 - log_rho, mask),
            "mismatch/abs_logprob_diff": aggregate(log_rho.abs(), mask),
            "mismatch/ratio_max": rho.masked_fill(~mask, float("-inf")).amax() if tokens else torch.ones(()),
            "mismatch/ratio_min": rho.masked_fill(~mask, float("inf")).amin() if tokens else torch.ones(()),
        }


def rollout_correction(
    trainer_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: CorrectionMode = "token_truncate",
    cap: float = 2.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token importance weights `[R, L]` from the trainer's and the sampler's log-probs, and their metrics.

    Args:
        trainer_logprobs: `[R, L]` per token under the trainer's computation of the policy that sampled the rows
            (the "old" log-probs, recomputed before any update of this step).
        rollout_logprobs: `[R, L]` per token as the sampler computed them.
        mask: `[R, L]` bool completion mask; padding may hold anything in the log-probs.
        mode: see the module docstring.
        cap: the upper bound (truncate) or the band `[1/cap, cap]` (mask); > 1.

    Returns:
        `(weights, metrics)`: weights detached, 0 at padding and at masked tokens (or rows); metrics are
        `mismatch_metrics` plus `correction/weight_mean` and `correction/cut_fraction` (the share of tokens whose
        weight the bound changed: truncated, or set to 0 by a mask).
    """
    if mode not in CORRECTION_MODES:
        raise ValueError(f"unknown rollout correction {mode!r}; use one of {', '.join(CORRECTION_MODES)}")
    if not cap > 1:
        raise ValueError(f"the rollout correction's cap must be > 1, got {cap}")
    mask = mask.bool()
    with torch.no_grad():
        log_rho = torch.where(mask, trainer_logprobs - rollout_logprobs, torch.zeros_like(trainer_logprobs))
        if mode.startswith("sequence"):
            log_rho = log_rho.sum(-1, keepdim=True).expand_as(log_rho)  # [R, L], each row's sequence ratio
        rho = log_rho.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp()
        if mode.endswith("truncate"):
            weights, cut = rho.clamp(max=cap), rho > cap
        else:
            cut = (rho > cap) | (rho < 1 / cap)
            weights = torch.where(cut, torch.zeros_like(rho), rho)
        weights = torch.where(mask, weights, torch.zeros_like(weights))
        metrics = mismatch_metrics(trainer_logprobs, rollout_logprobs, mask)
        metrics["correction/weight_mean"] = aggregate(weights, mask)
        metrics["correction/cut_fraction"] = aggregate(cut.float(), mask)
    return weights, metrics
