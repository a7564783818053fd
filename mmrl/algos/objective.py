"""The objective: every term the policy is trained on, in one pure function.

`loss = surrogate(logprobs, old_logprobs, advantages; w) + kl_coef * KL(policy || reference)
        - entropy_coef * H(policy) + PAPO(-gamma * KL(policy || policy with a masked image) + eta * entropies)`

`w` are the rollout correction's importance weights (`mmrl.algos.correction`) when the old log-probs were recomputed
by the trainer and differ from the sampler's. Tensors and explicit scalars in, a `LossOutput` out (the scalar loss with gradients and detached metrics); no
policy, no config, no `.item()`. The trainer runs the forward passes (policy, reference, masked image) and calls
this once per micro-batch.
"""

from __future__ import annotations

import torch

from .base import Aggregation, KLEstimator, LossOutput, PolicyLossFn
from .correction import CorrectionMode, mismatch_metrics, rollout_correction
from .losses import aggregate, entropy_bonus_loss, kl_estimate
from .papo import papo_loss_terms


def objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    loss_fn: PolicyLossFn,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    aggregation: Aggregation = "token_mean",
    max_len: int | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    masked_logprobs: torch.Tensor | None = None,
    masked_entropy: torch.Tensor | None = None,
    papo_gamma: float = 0.0,
    papo_eta: float = 0.0,
    papo_kl_bound: float | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    correction: CorrectionMode | None = None,
    correction_cap: float = 2.0,
) -> LossOutput:
    """The loss of one micro-batch and its metrics.

    Args:
        logprobs: `[r, L]` per token under the current weights, with gradients.
        old_logprobs: `[r, L]` per token under the policy that sampled the rows: the sampling-time log-probs, or the
            trainer's own recomputation of them before the step's first update.
        advantages: `[r]` one per row.
        completion_mask: `[r, L]` bool; positions outside it may hold anything.
        loss_fn: the surrogate, a `POLICY_LOSSES` entry (ppo_clip, dual_clip, gspo).
        clip_low: lower clip range of the ratio (`1 - clip_low`).
        clip_high: upper clip range (`1 + clip_high`); above `clip_low` it is DAPO's clip-higher.
        aggregation: how per-token values become one number, for every term (see `aggregate`).
        max_len: L_max for `seq_mean_token_sum_norm`.
        ref_logprobs: `[r, L]` per token under the frozen reference; with `kl_coef > 0` the KL term is added.
        kl_coef: weight of the KL to the reference.
        kl_estimator: k1, k2 or k3 (http://joschu.net/blog/kl-approx.html).
        entropy: `[r, L]` per-position entropy of the current policy, with gradients (needed by `entropy_coef` and
            `papo_eta`).
        entropy_coef: weight of the entropy bonus.
        masked_logprobs: `[r, L]` the same tokens scored with part of the image hidden (PAPO); with
            `papo_gamma > 0` the perception terms are added, and their metrics (`papo/*`) are logged either way.
        masked_entropy: `[r, L]` the masked pass's entropy (PAPO's double-entropy regulariser).
        papo_gamma: weight of PAPO's implicit perception loss.
        papo_eta: weight of PAPO's double-entropy regulariser.
        papo_kl_bound: PAPO's per-token KL clamp.
        rollout_logprobs: `[r, L]` the sampler's log-probs, when `old_logprobs` are the trainer's recomputation;
            the mismatch between the two is then measured (`mismatch/*`) and, with `correction`, corrected.
        correction: the rollout correction's mode (`token_truncate`, `token_mask`, `sequence_truncate`,
            `sequence_mask`), or None for none; needs `rollout_logprobs`.
        correction_cap: its bound.

    Returns:
        `LossOutput` with metrics `loss/policy` (the surrogate alone), `loss/kl` (the KL to the reference, 0 without
        one), the surrogate's own (`clip_fraction`, `approx_kl`, ...), `entropy` with an entropy bonus, and PAPO's
        `papo/*` with PAPO on, `mismatch/*` and `correction/*` with rollout log-probs; all detached.
    """
    # The trainer keeps per-row inputs (old log-probs, advantages, masks) on the CPU; scores live on the model device.
    device = logprobs.device
    old_logprobs, advantages, completion_mask = (t.to(device) for t in (old_logprobs, advantages, completion_mask))
    if rollout_logprobs is not None:
        rollout_logprobs = rollout_logprobs.to(device)
    token_weights, correction_metrics = None, {}
    if correction is not None:
        if rollout_logprobs is None:
            raise ValueError("a rollout correction needs the sampler's log-probs (rollout_logprobs)")
        token_weights, correction_metrics = rollout_correction(
            old_logprobs, rollout_logprobs, completion_mask, mode=correction, cap=correction_cap
        )
    elif rollout_logprobs is not None:
        correction_metrics = mismatch_metrics(old_logprobs, rollout_logprobs, completion_mask)
    surrogate = loss_fn(
        logprobs,
        old_logprobs,
        advantages,
        completion_mask,
        clip_low=clip_low,
        clip_high=clip_high,
        aggregation=aggregation,
        max_len=max_len,
        token_weights=token_weights,
    )
    loss = surrogate.loss
    metrics = {
        "loss/policy": surrogate.loss.detach(), "loss/kl": torch.zeros(()), **surrogate.metrics, **correction_metrics
    }  # fmt: skip
    if ref_logprobs is not None and kl_coef > 0:
        per_token_kl = kl_estimate(logprobs, ref_logprobs, kl_estimator, mask=completion_mask)
        kl = aggregate(per_token_kl, completion_mask, aggregation, max_len=max_len)
        loss = loss + kl_coef * kl
        metrics["loss/kl"] = kl.detach()
    if entropy_coef > 0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the per-position entropy (score the policy with_entropy=True)")
        bonus = entropy_bonus_loss(
            entropy, completion_mask, coef=entropy_coef, aggregation=aggregation, max_len=max_len
        )
        loss = loss + bonus.loss
        metrics.update(bonus.metrics)
    if masked_logprobs is not None:  # PAPO's terms; with papo_gamma 0 (monitoring) only their metrics
        papo = papo_loss_terms(
            logprobs,
            masked_logprobs,
            completion_mask,
            gamma=papo_gamma,
            eta=papo_eta,
            entropy=entropy,
            masked_entropy=masked_entropy,
            bound=papo_kl_bound,
            aggregation=aggregation,
            max_len=max_len,
        )
        if papo_gamma > 0:
            loss = loss + papo.loss
        metrics.update(papo.metrics)
    return LossOutput(loss=loss, metrics=metrics)
