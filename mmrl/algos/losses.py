"""Policy-gradient losses, KL estimators and entropy terms over per-token log-probs, with padding masked out.

Every function here is a pure tensor function: tensors and explicit scalars in, tensors out, no `.item()`, no
config objects, no loop over rows. Padding positions may hold anything (garbage, inf, NaN): each function masks
them *before* any nonlinearity, so neither the value nor the gradient sees them.
"""

from __future__ import annotations

import torch

from .base import POLICY_LOSSES, Aggregation, KLEstimator, LossOutput

__all__ = ["Aggregation", "KLEstimator", "LossOutput"]  # re-exported: they were defined here

_MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: large enough to never bind in sane training, small enough not to overflow


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: Aggregation = "token_mean", *, max_len: int | None = None
) -> torch.Tensor:
    """Reduce per-token values to a scalar over the tokens in `mask`.

    Args:
        values: `[R, L]` per token; padding may hold anything, including inf and NaN.
        mask: `[R, L]` bool (or 0/1).
        mode: `token_mean` averages over every unmasked token of the batch (DAPO, https://arxiv.org/abs/2503.14476);
            `seq_mean_token_mean` averages within each row, then over rows (the original GRPO);
            `seq_mean_token_sum_norm` sums each row and divides by the constant `max_len`, then averages over rows
            (Dr. GRPO, https://arxiv.org/abs/2503.20783: no length normalisation, so no length bias).
        max_len: the constant of `seq_mean_token_sum_norm`; defaults to the mask's width `L`. Pass the generation
            limit (`max_new_tokens`) when micro-batches are padded to different widths, or the scale drifts.

    Returns:
        `[]`. Rows without tokens count as zero in the row means (they still count as rows).
    """
    mask = mask.bool()
    values = torch.where(mask, values, torch.zeros_like(values))  # inf/NaN in padding must not leak
    weights = mask.to(values.dtype)
    if mode == "token_mean":
        return values.sum() / weights.sum().clamp(min=1)
    if mode == "seq_mean_token_mean":
        return (values.sum(-1) / weights.sum(-1).clamp(min=1)).mean()
    if mode == "seq_mean_token_sum_norm":
        norm = mask.shape[-1] if max_len is None else max_len
        return (values.sum(-1) / norm).mean()
    raise ValueError(f"unknown aggregation {mode!r}; use token_mean, seq_mean_token_mean or seq_mean_token_sum_norm")


def kl_estimate(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    estimator: KLEstimator = "k3",
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy (http://joschu.net/blog/kl-approx.html).

    Args:
        logprobs: `[R, L]` per token under the policy.
        ref_logprobs: `[R, L]` per token under the frozen reference.
        estimator: k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r with r = pi_ref / pi (unbiased, >= 0).
        mask: `[R, L]` bool; when given, padding positions are zeroed *before* the nonlinearity, so inf there
            cannot turn into NaN gradients (0 * inf in the backward of `square` or `exp`).

    Returns:
        `[R, L]` (zero at padding when `mask` is given).
    """
    log_ratio = ref_logprobs - logprobs
    if mask is not None:
        log_ratio = torch.where(mask.bool(), log_ratio, torch.zeros_like(log_ratio))
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        log_ratio = log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)  # exp overflow guard, as verl does
        return log_ratio.exp() - 1 - log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; use k1, k2 or k3")


def kl_penalized_rewards(
    rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    estimator: KLEstimator = "k1",
) -> torch.Tensor:
    """Fold a KL penalty against the reference into the scalar reward, `r - coef * sum_t KL_t`.

    The alternative to a KL *loss* term: the penalty becomes part of the return, as in PPO-RLHF
    (https://arxiv.org/abs/2203.02155) and REINFORCE++ (https://arxiv.org/abs/2501.03262), which use k1. The KL is
    detached: rewards are constants to the policy gradient.

    Args:
        rewards: `[R]`.
        logprobs: `[R, L]` per token under the sampling policy.
        ref_logprobs: `[R, L]` per token under the reference.
        mask: `[R, L]` bool completion mask.
        coef: KL coefficient (beta).
        estimator: k1, k2 or k3.

    Returns:
        `[R]` penalised rewards.
    """
    kl = kl_estimate(logprobs.detach(), ref_logprobs.detach(), estimator, mask=mask)  # [R, L], 0 at padding
    return rewards - coef * kl.sum(-1)


def entropy_from_logits(logits: torch.Tensor, *, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy of the next-token distribution at every position, `H = -sum_v p_v log p_v`.

    Computed from `log_softmax` in float32 (stable for huge logits, where `logsumexp - sum p*l` cancels
    catastrophically), with `-inf` logits (banned tokens) contributing exactly 0 and no NaN gradient.

    Args:
        logits: `[R, L, V]` (any leading shape works; the last dim is the vocabulary). Divide by the sampling
            temperature first if the entropy should be that of the sampling distribution.
        chunk_size: process this many positions at a time. The `[.., V]` float32 softmax is the memory peak
            (R*L*V*4 bytes); chunking bounds it in no-grad passes (verl's `entropy_from_logits_with_chunking`).
            With grad, autograd keeps every chunk's intermediates anyway.

    Returns:
        `[R, L]` float32 entropies, in nats.
    """
    if chunk_size is None or logits.shape[:-1].numel() <= chunk_size:
        return _entropy(logits)
    flat = logits.reshape(-1, logits.shape[-1])
    # A loop over chunks of positions (a memory bound), not over rows of the batch.
    parts = [_entropy(chunk) for chunk in flat.split(chunk_size)]
    return torch.cat(parts).reshape(logits.shape[:-1])


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = logits.float().log_softmax(-1)
    # Where a logit is -inf, p = 0 and p*log p is 0; sanitise log p first so the backward never sees 0 * inf.
    logp_finite = torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))
    return -(logp.exp() * logp_finite).sum(-1)


def entropy_bonus_loss(
    entropy: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    coef: float,
    aggregation: Aggregation = "token_mean",
    max_len: int | None = None,
) -> LossOutput:
    """Entropy bonus, `-coef * aggregate(H)`: minimising it raises entropy (keeps exploration alive).

    Args:
        entropy: `[R, L]` per token, e.g. from `entropy_from_logits`, with grad.
        completion_mask: `[R, L]` bool.
        coef: bonus weight; a negative value turns it into an entropy penalty.
        aggregation: see `aggregate`.
        max_len: see `aggregate`.

    Returns:
        `LossOutput` with metric `entropy` (the aggregated entropy, detached).
    """
    mean_entropy = aggregate(entropy, completion_mask, aggregation, max_len=max_len)
    return LossOutput(loss=-coef * mean_entropy, metrics={"entropy": mean_entropy.detach()})


def _masked_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # Padding positions may hold anything (even inf); zero them before exp so nothing leaks into gradients.
    return torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))  # [R, L]


def _ratio_metrics(
    log_ratio: torch.Tensor, clipped_ratio: torch.Tensor, gradient_cut: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The diagnostics every policy loss reports under the same keys (the trainer averages them over micro-batches).

    `clip_fraction` counts the tokens whose gradient a clip removes, split by side: `clip_fraction_low` where the
    clipped ratio fell below 1 (a negative advantage's ratio under `1 - clip_low`), `clip_fraction_high` where it rose
    above (a positive advantage's ratio over `1 + clip_high`). `ratio/*` are over the per-token ratios, `approx_kl` is
    k3 between the old policy and the current one.
    """
    with torch.no_grad():
        log_ratio = log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        ratio = log_ratio.exp()
        cut = gradient_cut & mask
        tokens = mask.any()
        return {
            "clip_fraction": aggregate(cut.float(), mask),
            "clip_fraction_low": aggregate((cut & (clipped_ratio < 1)).float(), mask),
            "clip_fraction_high": aggregate((cut & (clipped_ratio > 1)).float(), mask),
            "approx_kl": aggregate(ratio - 1 - log_ratio, mask),
            "ratio/mean": aggregate(ratio, mask),
            "ratio/min": ratio.masked_fill(~mask, float("inf")).amin() if tokens else torch.ones(()),
            "ratio/max": ratio.masked_fill(~mask, float("-inf")).amax() if tokens else torch.ones(()),
        }


def _weighted(per_token: torch.Tensor, token_weights: torch.Tensor | None) -> torch.Tensor:
    """`per_token` times the rollout-correction weights (constants), where there are any."""
    return per_token if token_weights is None else per_token * token_weights.detach()


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
    max_len: int | None = None,
    token_weights: torch.Tensor | None = None,
) -> LossOutput:
    """Clipped surrogate objective (PPO, https://arxiv.org/abs/1707.06347) with asymmetric clipping.

    `clip_high > clip_low` is DAPO's clip-higher (https://arxiv.org/abs/2503.14476), which keeps exploration alive.

    Args:
        logprobs: `[R, L]` per token under the current weights (with grad).
        old_logprobs: `[R, L]` per token under the weights that sampled the completions.
        advantages: `[R]`, one per completion, shared by its tokens.
        completion_mask: `[R, L]` bool.
        clip_low: the ratio is clipped below at `1 - clip_low`.
        clip_high: the ratio is clipped above at `1 + clip_high`.
        aggregation: see `aggregate`.
        max_len: see `aggregate`.
        token_weights: `[R, L]` constants multiplying each token's loss (the rollout correction's importance weights,
            `mmrl.algos.correction`), or None.

    Returns:
        `LossOutput` with metrics `clip_fraction` (and its `_low`/`_high` sides), `approx_kl` (k3 between old and
        current) and `ratio/mean|min|max`.
    """
    mask = completion_mask.bool()
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask)
    ratio = log_ratio.exp()  # [R, L]
    adv = advantages.unsqueeze(-1)  # [R, 1]
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)  # [R, L]
    loss = aggregate(_weighted(per_token, token_weights), mask, aggregation, max_len=max_len)
    return LossOutput(loss=loss, metrics=_ratio_metrics(log_ratio, ratio, clipped > unclipped, mask))


@POLICY_LOSSES.register("dual_clip")
def dual_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float = 3.0,
    aggregation: Aggregation = "token_mean",
    max_len: int | None = None,
    token_weights: torch.Tensor | None = None,
) -> LossOutput:
    """Dual-clip PPO (https://arxiv.org/abs/1912.09729): PPO-clip plus a bound of `clip_c * |A|` for `A < 0`.

    With a negative advantage, plain PPO-clip leaves `-A * ratio` unbounded above when the ratio has run far past
    `1 + clip_high` (stale or off-policy samples), so one token can dominate the batch. The second clip caps that
    token's loss at `-clip_c * A` and cuts its gradient.

    Args:
        logprobs: `[R, L]` per token under the current weights (with grad).
        old_logprobs: `[R, L]` per token under the weights that sampled the completions.
        advantages: `[R]`.
        completion_mask: `[R, L]` bool.
        clip_low: see `ppo_clip_loss`.
        clip_high: see `ppo_clip_loss`.
        clip_c: the lower bound of the ratio at which the dual clip binds; must exceed 1 (3.0 in the paper and verl).
        aggregation: see `aggregate`.
        max_len: see `aggregate`.
        token_weights: see `ppo_clip_loss`.

    Returns:
        `LossOutput` with metrics `clip_fraction` (either clip binding), its sides, `approx_kl` and `ratio/*`.
    """
    if clip_c <= 1.0:
        raise ValueError(f"clip_c must be > 1, got {clip_c}")
    mask = completion_mask.bool()
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask)
    ratio = log_ratio.exp()  # [R, L]
    adv = advantages.unsqueeze(-1)  # [R, 1]
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    ppo = torch.maximum(unclipped, clipped)  # [R, L]
    bound = (-adv * clip_c).expand_as(ppo)  # [R, L]; = clip_c * |A| where it applies
    dual = torch.minimum(ppo, bound)
    per_token = torch.where(adv < 0, dual, ppo)
    loss = aggregate(_weighted(per_token, token_weights), mask, aggregation, max_len=max_len)
    cut = (clipped > unclipped) | ((adv < 0) & (ppo > bound))
    return LossOutput(loss=loss, metrics=_ratio_metrics(log_ratio, ratio, cut, mask))


@POLICY_LOSSES.register("gspo")
def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    aggregation: Aggregation = "seq_mean_token_mean",
    max_len: int | None = None,
    token_weights: torch.Tensor | None = None,
) -> LossOutput:
    """Group Sequence Policy Optimisation (GSPO, https://arxiv.org/abs/2507.18071), in its GSPO-token form.

    The importance ratio is the length-normalised sequence ratio `s_i = exp(mean_t log(pi / pi_old))`, clipped at
    the sequence level, so one completion is kept or clipped as a whole. Per token the ratio is
    `s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)]` (the paper's GSPO-token): its value is `s_i` at every token, its gradient
    is `s_i * grad log pi(y_t)`. With one advantage per completion and `seq_mean_token_mean` this is exactly
    GSPO's gradient; it is also what verl's `compute_policy_loss_gspo` does.

    Sequence ratios sit much closer to 1 than token ratios: the paper clips at 3e-4 / 4e-4 (section 5.1), hence
    the defaults; the usual 0.2 almost never binds.

    Args:
        logprobs: `[R, L]` per token under the current weights (with grad).
        old_logprobs: `[R, L]` per token under the weights that sampled the completions.
        advantages: `[R]`.
        completion_mask: `[R, L]` bool.
        clip_low: the sequence ratio is clipped below at `1 - clip_low`.
        clip_high: the sequence ratio is clipped above at `1 + clip_high`.
        aggregation: see `aggregate`; the paper's objective is `seq_mean_token_mean`.
        max_len: see `aggregate`.
        token_weights: see `ppo_clip_loss`.

    Returns:
        `LossOutput` with metrics `clip_fraction` (share of tokens in clipped sequences, by the side of the sequence
        ratio), `approx_kl` and `ratio/*` (per token).
    """
    mask = completion_mask.bool()
    logprobs = torch.where(mask, logprobs, torch.zeros_like(logprobs))  # inf - inf = NaN must not appear below
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask)  # [R, L]
    seq_log_ratio = log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)  # [R]
    log_seq_ratio = logprobs - logprobs.detach() + seq_log_ratio.detach().unsqueeze(-1)  # [R, L], value = [R]
    ratio = log_seq_ratio.clamp(max=_MAX_LOG_RATIO).exp()  # [R, L]
    adv = advantages.unsqueeze(-1)  # [R, 1]
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)  # [R, L]
    loss = aggregate(_weighted(per_token, token_weights), mask, aggregation, max_len=max_len)
    return LossOutput(loss=loss, metrics=_ratio_metrics(log_ratio, ratio.detach(), clipped > unclipped, mask))
