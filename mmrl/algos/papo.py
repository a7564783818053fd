"""Perception-aware policy optimisation (PAPO, https://arxiv.org/abs/2507.06448): the loss terms and image masking.

PAPO adds to the GRPO/DAPO objective an *implicit perception loss*: the policy is run a second time on the same
prompt and completion with a masked copy of the image, and the KL between the two next-token distributions is
pushed **up** (`-gamma * KL`), so the answer has to depend on what the image shows. Maximising a KL is unbounded
and the model can "hack" it by making the masked pass degenerate, so the paper adds a *double entropy* regulariser
(`eta * (H_real + H_masked)`, both minimised) and implementations bound the per-token KL (TRL-style runs clamp it
to [0, 0.2]; the official code's `kl_prcp_clipping`).

Full objective, per the paper and its official code (`verl/workers/actor/dp_actor.py`):

    loss = policy_loss + kl_ref_term - gamma * KL_prcp + eta1 * H[pi(.|I)] + eta2 * H[pi(.|I_masked)]

Settings of the official scripts: 14x14 patches blackened with probability 0.6, gamma 0.02 (PAPO-G) or 0.01
(PAPO-D), eta 0.03-0.05 when the entropy terms are on, k3 (`low_var_kl`) as the per-token estimator.
TRL's `PAPOTrainer` instead zeroes individual pixel values with probability 0.3 (`mask_pixels`).

**Gradients through the masked pass are the caller's choice.** The functions here are pure and differentiate
through whatever they are given:

* masked log-probs *detached* (the official code: they are computed before the update, like the old log-probs):
  only the real-image pass is pushed away from the masked one, and the masked pass costs no activation memory.
  The masked-entropy term then has no gradient; it is still reported.
* masked log-probs *with grad* (TRL: a second forward inside the loss): both passes are pushed apart, and the
  masked-entropy term is what stops the masked pass from flattening into noise.

This module does not import the policy: masking works on the env's uint8 images `[N, H, W, 3]` (mask before the
processor, as the official code does with PIL images) or on processor output `pixel_values` `[sum_patches, D]`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ..types import Rollout
from .losses import Aggregation, KLEstimator, LossOutput, aggregate, kl_estimate


def mask_patches(
    images: torch.Tensor,
    *,
    ratio: float = 0.6,
    patch_size: int = 14,
    generator: torch.Generator,
    fill: float | torch.Tensor = 0.0,
) -> torch.Tensor:
    """Blacken random square patches, each independently with probability `ratio` (PAPO's masking).

    Two layouts:

    * `[N, H, W, C]` images (the env's uint8 observations): the image is cut into a `patch_size` grid starting at
      the top-left corner; border cells are partial, as in the official `random_patch_blackening` (14 px, 0.6).
      Each image gets its own mask; to share one mask per prompt, as the official code does, mask the B prompt
      images before repeating them G times.
    * `[sum_patches, D]` processor rows (Qwen2-VL `pixel_values`, D = C*T*p*p): each row *is* one p x p patch, so
      whole rows are masked and `patch_size` is unused. Those values are normalised, so "black" is not 0; pass
      `fill=black_patch_row(image_mean, image_std)`. `fill=0` gives the mean colour instead.

    The random draw happens on the generator's device and is then moved, so a CPU generator gives the same mask
    for CPU and GPU inputs.

    Args:
        images: `[N, H, W, C]` or `[sum_patches, D]`, any dtype.
        ratio: probability that a patch is masked.
        patch_size: side of a square patch in pixels (image layout only).
        generator: source of randomness (no global RNG is used).
        fill: value written into masked patches: a scalar, or a `[C]` (images) / `[D]` (rows) tensor.

    Returns:
        A masked copy, same shape and dtype.
    """
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"ratio must be in [0, 1], got {ratio}")
    fill_t = torch.as_tensor(fill, dtype=images.dtype, device=images.device)
    if images.ndim == 2:
        hit = torch.rand(images.shape[0], generator=generator, device=generator.device) < ratio  # [sum_patches]
        return torch.where(hit.to(images.device).unsqueeze(-1), fill_t, images)
    if images.ndim != 4:
        raise ValueError(f"expected [N, H, W, C] images or [sum_patches, D] rows, got shape {tuple(images.shape)}")
    n, h, w, _ = images.shape
    grid_h, grid_w = -(-h // patch_size), -(-w // patch_size)  # ceil: partial border cells are patches too
    hit = torch.rand(n, grid_h, grid_w, generator=generator, device=generator.device) < ratio  # [N, gh, gw]
    hit = hit.repeat_interleave(patch_size, dim=1).repeat_interleave(patch_size, dim=2)[:, :h, :w]  # [N, H, W]
    return torch.where(hit.to(images.device).unsqueeze(-1), fill_t, images)


def mask_pixels(
    pixel_values: torch.Tensor,
    *,
    ratio: float = 0.3,
    generator: torch.Generator,
    fill: float | torch.Tensor = 0.0,
) -> torch.Tensor:
    """Set each element independently to `fill` with probability `ratio` (TRL `PAPOTrainer`'s "random" mask, 0.3).

    Works on any layout; on normalised `pixel_values` the default fill 0 is the dataset mean colour, as in TRL.

    Args:
        pixel_values: any shape, any dtype.
        ratio: probability that an element is masked.
        generator: source of randomness (drawn on its device, then moved).
        fill: scalar, or a tensor broadcastable to `pixel_values`.

    Returns:
        A masked copy, same shape and dtype.
    """
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"ratio must be in [0, 1], got {ratio}")
    hit = torch.rand(pixel_values.shape, generator=generator, device=generator.device) < ratio
    fill_t = torch.as_tensor(fill, dtype=pixel_values.dtype, device=pixel_values.device)
    return torch.where(hit.to(pixel_values.device), fill_t, pixel_values)


def black_patch_row(
    image_mean: torch.Tensor | list[float],
    image_std: torch.Tensor | list[float],
    *,
    temporal_patch_size: int = 2,
    patch_size: int = 14,
) -> torch.Tensor:
    """The Qwen2-VL `pixel_values` row of an all-black patch: `(0 - mean) / std` per channel, laid out `[C, T, p, p]`.

    Args:
        image_mean: `[C]` the processor's `image_mean` (on the 0-1 scale).
        image_std: `[C]` the processor's `image_std`.
        temporal_patch_size: T (2 for Qwen2-VL and Qwen2.5-VL).
        patch_size: p (14 for Qwen2-VL and Qwen2.5-VL).

    Returns:
        `[C*T*p*p]` float32, for `mask_patches(..., fill=...)`.
    """
    mean = torch.as_tensor(image_mean, dtype=torch.float32)
    std = torch.as_tensor(image_std, dtype=torch.float32)
    return (-mean / std).repeat_interleave(temporal_patch_size * patch_size * patch_size)


def perception_kl(
    logprobs: torch.Tensor,
    masked_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    bound: float | None = None,
    estimator: KLEstimator = "k3",
) -> torch.Tensor:
    """Per-token KL(pi(.|image) || pi(.|masked image)), estimated on the sampled tokens.

    The same estimators as the reference KL, with the masked pass in the reference's place: k3 is
    `r - 1 - log r` with `r = pi_masked / pi_real` (the official code's `low_var_kl`, and TRL's formula).

    Args:
        logprobs: `[R, L]` per token with the real image.
        masked_logprobs: `[R, L]` per token with the masked image.
        mask: `[R, L]` bool completion mask.
        bound: clamp every token's KL to `[0, bound]`. Past the bound the token's gradient is zero, so the loss
            cannot be maximised without limit by a few tokens. None: no clamp.
        estimator: k1, k2 or k3.

    Returns:
        `[R, L]`, zero at padding.
    """
    kl = kl_estimate(logprobs, masked_logprobs, estimator, mask=mask)
    if bound is not None:
        kl = kl.clamp(0.0, bound)
    return kl


def double_entropy_loss(
    entropy: torch.Tensor,
    masked_entropy: torch.Tensor,
    mask: torch.Tensor,
    eta: float,
    *,
    masked_eta: float | None = None,
    aggregation: Aggregation = "token_mean",
    max_len: int | None = None,
) -> torch.Tensor:
    """PAPO's double entropy regulariser, `eta * H_real + masked_eta * H_masked`, both *minimised*.

    The loss-hacking failure mode of maximising the perception KL is a masked pass that spreads into near-uniform
    noise (and drags the real pass with it); penalising both entropies blocks it (the paper's Double Entropy Loss).

    Args:
        entropy: `[R, L]` per token with the real image: the full entropy (`entropy_from_logits`, as in TRL) or
            the sampled estimate `-logprobs` (the official code's `entropy_loss_type=sampled`).
        masked_entropy: `[R, L]` the same with the masked image.
        mask: `[R, L]` bool completion mask.
        eta: weight of the real-image entropy (0.03-0.05 in the paper).
        masked_eta: weight of the masked-image entropy; defaults to `eta`.
        aggregation: see `aggregate`.
        max_len: see `aggregate`.

    Returns:
        `[]`.
    """
    masked_eta = eta if masked_eta is None else masked_eta
    real = aggregate(entropy, mask, aggregation, max_len=max_len)
    masked = aggregate(masked_entropy, mask, aggregation, max_len=max_len)
    return eta * real + masked_eta * masked


def papo_loss_terms(
    logprobs: torch.Tensor,
    masked_logprobs: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    gamma: float,
    eta: float = 0.0,
    masked_eta: float | None = None,
    entropy: torch.Tensor | None = None,
    masked_entropy: torch.Tensor | None = None,
    bound: float | None = None,
    estimator: KLEstimator = "k3",
    aggregation: Aggregation = "token_mean",
    max_len: int | None = None,
) -> LossOutput:
    """PAPO's extra loss, `-gamma * KL_prcp + eta * H_real + masked_eta * H_masked`, to add to the policy loss.

    Args:
        logprobs: `[R, L]` per token with the real image (the pass the policy loss uses, with grad).
        masked_logprobs: `[R, L]` per token with the masked image; detach it or not (see the module docstring).
        completion_mask: `[R, L]` bool.
        gamma: weight of the implicit perception loss (0.02 PAPO-G, 0.01 PAPO-D in the official scripts).
        eta: weight of the real-image entropy term; 0 turns the double entropy loss off.
        masked_eta: weight of the masked-image entropy term; defaults to `eta`.
        entropy: `[R, L]` real-image entropies; None uses the sampled estimate `-logprobs`.
        masked_entropy: `[R, L]` masked-image entropies; None uses `-masked_logprobs`.
        bound: per-token KL clamp, see `perception_kl`.
        estimator: KL estimator, see `perception_kl`.
        aggregation: see `aggregate`.
        max_len: see `aggregate`.

    Returns:
        `LossOutput` with metrics `papo/kl` (aggregated KL before the bound), `papo/kl_at_bound` (share of tokens
        at the bound, 0 without one), `papo/entropy` and `papo/masked_entropy`, all detached.
    """
    mask = completion_mask.bool()
    kl_tokens = perception_kl(logprobs, masked_logprobs, mask, bound=bound, estimator=estimator)  # [R, L]
    loss = -gamma * aggregate(kl_tokens, mask, aggregation, max_len=max_len)
    entropy = -logprobs if entropy is None else entropy
    masked_entropy = -masked_logprobs if masked_entropy is None else masked_entropy
    if eta != 0.0 or (masked_eta is not None and masked_eta != 0.0):
        loss = loss + double_entropy_loss(
            entropy, masked_entropy, mask, eta, masked_eta=masked_eta, aggregation=aggregation, max_len=max_len
        )
    with torch.no_grad():
        raw_kl = kl_estimate(logprobs, masked_logprobs, estimator, mask=mask)
        at_bound = raw_kl >= bound if bound is not None else torch.zeros_like(mask)
        metrics = {
            "papo/kl": aggregate(raw_kl, mask, aggregation, max_len=max_len),
            "papo/kl_at_bound": aggregate(at_bound.float(), mask),
            "papo/entropy": aggregate(entropy, mask, aggregation, max_len=max_len),
            "papo/masked_entropy": aggregate(masked_entropy, mask, aggregation, max_len=max_len),
        }
    return LossOutput(loss=loss, metrics=metrics)


def masked_images(
    batch: Rollout, domain: str, ratio: float, generator: torch.Generator, image_processor: Any = None
) -> Rollout:
    """A copy of `batch` whose images are partly masked, for PAPO's perception loss.

    `domain="patches"` blackens whole vision patches (each `pixel_values` row is one patch) with probability
    `ratio`, as the official PAPO code does with 14 px patches; `domain="pixels"` zeroes single entries of the
    normalised pixel tensor (TRL's variant).

    Args:
        batch: the rollout whose `pixel_values` rows are masked.
        domain: `patches` or `pixels`.
        ratio: the share of patches (or entries) masked.
        generator: draws which.
        image_processor: the policy's image processor (`policy.processor.image_processor`), whose normalisation and
            patch sizes give the black patch; needed for `patches`.
    """
    if domain == "patches":
        ip = image_processor
        fill = black_patch_row(
            ip.image_mean,
            ip.image_std,
            temporal_patch_size=int(getattr(ip, "temporal_patch_size", 2)),
            patch_size=int(ip.patch_size),
        ).to(batch.pixel_values)
        if fill.numel() != batch.pixel_values.shape[-1]:
            raise ValueError(f"patch rows hold {batch.pixel_values.shape[-1]} values, expected {fill.numel()}")
        pixels = mask_patches(batch.pixel_values, ratio=ratio, generator=generator, fill=fill)
    elif domain == "pixels":
        pixels = mask_pixels(batch.pixel_values, ratio=ratio, generator=generator)
    else:
        raise ValueError(f"unknown masking domain {domain!r}; use patches or pixels")
    return replace(batch, pixel_values=pixels)
