"""PAPO: hand-computed loss terms, KL pushed up, entropy pulled down, padding invariance, seeded masking."""

import math

import pytest
import torch

from mmrl.algos import entropy_from_logits
from mmrl.algos.papo import (
    black_patch_row,
    double_entropy_loss,
    mask_patches,
    mask_pixels,
    papo_loss_terms,
    perception_kl,
)

MASK = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)  # [R=2, L=3]


# ---------------------------------------------------------------- loss terms


def test_perception_kl_matches_hand_computation():
    logprobs = torch.log(torch.tensor([[0.5, 0.25]]))
    masked = torch.log(torch.tensor([[0.25, 0.5]]))
    mask = torch.ones(1, 2, dtype=torch.bool)
    # k3 with r = pi_masked / pi_real: r = 1/2 -> 0.5 - 1 + log 2; r = 2 -> 2 - 1 - log 2.
    k3 = torch.tensor([[0.5 - 1 + math.log(2), 1 - math.log(2)]])
    torch.testing.assert_close(perception_kl(logprobs, masked, mask), k3)
    torch.testing.assert_close(perception_kl(logprobs, masked, mask, bound=0.25), k3.clamp(max=0.25))
    # k1 = log pi_real - log pi_masked can be negative; the bound clamps it to [0, bound].
    k1 = perception_kl(logprobs, masked, mask, estimator="k1")
    torch.testing.assert_close(k1, torch.tensor([[math.log(2), -math.log(2)]]))
    k1_bounded = perception_kl(logprobs, masked, mask, estimator="k1", bound=0.2)
    torch.testing.assert_close(k1_bounded, torch.tensor([[0.2, 0.0]]))


def test_double_entropy_loss_matches_hand_computation():
    entropy = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), 0.0]])
    masked_entropy = torch.tensor([[2.0, 2.0, 2.0], [6.0, float("inf"), 0.0]])
    # token means over the 4 real tokens: (1 + 2 + 3 + 4) / 4 = 2.5 and (2 + 2 + 2 + 6) / 4 = 3.
    got = double_entropy_loss(entropy, masked_entropy, MASK, 0.03)
    torch.testing.assert_close(got, torch.tensor(0.03 * 2.5 + 0.03 * 3.0))
    got = double_entropy_loss(entropy, masked_entropy, MASK, 0.03, masked_eta=0.05)
    torch.testing.assert_close(got, torch.tensor(0.03 * 2.5 + 0.05 * 3.0))


def test_papo_loss_terms_match_hand_computation():
    logprobs = torch.log(torch.tensor([[0.5, 0.25, 0.5], [0.5, 1.0, 1.0]]))
    masked = torch.log(torch.tensor([[0.25, 0.5, 0.5], [0.5, 1.0, 1.0]]))
    # per-token k3: [0.5 - 1 + log 2, 1 - log 2, 0], [0]; token mean over 4 tokens = 0.5 / 4.
    kl = (0.5 - 1 + math.log(2) + 1 - math.log(2)) / 4
    entropy = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])  # token mean 2.5
    masked_entropy = torch.tensor([[2.0, 2.0, 2.0], [6.0, 0.0, 0.0]])  # token mean 3
    out = papo_loss_terms(logprobs, masked, MASK, gamma=0.02, eta=0.03, entropy=entropy, masked_entropy=masked_entropy)
    torch.testing.assert_close(out.loss, torch.tensor(-0.02 * kl + 0.03 * (2.5 + 3.0)))
    torch.testing.assert_close(out.metrics["papo/kl"], torch.tensor(kl))
    torch.testing.assert_close(out.metrics["papo/entropy"], torch.tensor(2.5))
    torch.testing.assert_close(out.metrics["papo/masked_entropy"], torch.tensor(3.0))
    torch.testing.assert_close(out.metrics["papo/kl_at_bound"], torch.tensor(0.0))


def test_papo_loss_terms_default_to_the_sampled_entropy_estimate_and_report_the_raw_kl():
    logprobs = torch.log(torch.tensor([[0.5, 0.25, 0.5], [0.5, 1.0, 1.0]]))
    masked = torch.log(torch.tensor([[0.25, 0.5, 0.5], [0.5, 1.0, 1.0]]))
    out = papo_loss_terms(logprobs, masked, MASK, gamma=1.0, bound=0.1)
    k3 = torch.tensor([0.5 - 1 + math.log(2), 1 - math.log(2), 0.0, 0.0])  # ~0.193, ~0.307, 0, 0
    torch.testing.assert_close(out.loss, -k3.clamp(max=0.1).mean())  # eta = 0: KL term only
    torch.testing.assert_close(out.metrics["papo/kl"], k3.mean())  # before the bound
    torch.testing.assert_close(out.metrics["papo/kl_at_bound"], torch.tensor(0.5))  # 2 of 4 tokens
    # sampled entropy: -mean log pi over real tokens.
    torch.testing.assert_close(out.metrics["papo/entropy"], torch.tensor(-(math.log(0.5) * 3 + math.log(0.25)) / 4))
    assert all(not v.requires_grad for v in out.metrics.values())


def test_papo_pushes_real_logprobs_away_from_masked_ones():
    masked = torch.log(torch.tensor([[0.3, 0.3, 0.3]]))
    logprobs = torch.log(torch.tensor([[0.6, 0.1, 0.3]])).requires_grad_(True)  # above, below, equal
    mask = torch.ones(1, 3, dtype=torch.bool)
    papo_loss_terms(logprobs, masked, mask, gamma=0.02).loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0, 0] < 0  # descent raises the one already above the masked pass
    assert logprobs.grad[0, 1] > 0  # and lowers the one already below
    assert logprobs.grad[0, 2] == 0  # equal: KL is at its minimum, no direction


@pytest.mark.parametrize("detach_masked", [True, False])
def test_descent_on_the_papo_term_raises_the_perception_kl(detach_masked):
    gen = torch.Generator().manual_seed(0)
    real_logits = torch.randn(2, 3, 6, generator=gen).requires_grad_(True)  # [R, L, V]
    masked_logits = torch.randn(2, 3, 6, generator=gen).requires_grad_(not detach_masked)
    tokens = torch.randint(0, 6, (2, 3), generator=gen)
    params = [real_logits] if detach_masked else [real_logits, masked_logits]

    def terms():
        pick = lambda logits: logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # noqa: E731
        return papo_loss_terms(pick(real_logits), pick(masked_logits), MASK, gamma=1.0)

    kls = []
    for _ in range(5):
        out = terms()
        kls.append(float(out.metrics["papo/kl"]))
        grads = torch.autograd.grad(out.loss, params)
        with torch.no_grad():  # plain gradient descent, step 1
            for param, grad in zip(params, grads):
                param -= grad
    assert all(b > a for a, b in zip(kls, kls[1:]))


def test_tokens_past_the_bound_get_no_gradient():
    masked = torch.log(torch.tensor([[0.3, 0.3]]))
    logprobs = torch.log(torch.tensor([[0.9, 0.35]])).requires_grad_(True)  # far past the bound, inside it
    mask = torch.ones(1, 2, dtype=torch.bool)
    papo_loss_terms(logprobs, masked, mask, gamma=1.0, bound=0.05).loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0, 0] == 0 and logprobs.grad[0, 1] < 0


def test_double_entropy_descent_sharpens_both_passes():
    real_logits = torch.tensor([[[1.0, 0.0, 0.0]]], requires_grad=True)
    masked_logits = torch.tensor([[[0.0, 0.5, 0.0]]], requires_grad=True)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss = double_entropy_loss(entropy_from_logits(real_logits), entropy_from_logits(masked_logits), mask, 0.05)
    loss.backward()
    assert real_logits.grad is not None and masked_logits.grad is not None
    assert real_logits.grad[0, 0, 0] < 0  # descent raises each pass's leading logit
    assert masked_logits.grad[0, 0, 1] < 0


def test_papo_loss_terms_ignore_whatever_is_in_padding():
    gen = torch.Generator().manual_seed(1)
    logprobs, masked = -torch.rand(2, 3, generator=gen), -torch.rand(2, 3, generator=gen)
    entropy, masked_entropy = torch.rand(2, 3, generator=gen), torch.rand(2, 3, generator=gen)

    def run(junk):
        fill = lambda x: torch.where(MASK, x, torch.full_like(x, junk)).requires_grad_(True)  # noqa: E731
        lp, mlp, h, mh = fill(logprobs), fill(masked), fill(entropy), fill(masked_entropy)
        for entropies in ({}, {"entropy": h, "masked_entropy": mh}):
            out = papo_loss_terms(lp, mlp, MASK, gamma=0.02, eta=0.03, bound=0.2, **entropies)
            out.loss.backward()
        return out, lp.grad, mlp.grad

    clean, clean_grad, clean_masked_grad = run(0.0)
    for junk in (1e4, float("inf"), float("-inf"), float("nan")):
        dirty, dirty_grad, dirty_masked_grad = run(junk)
        torch.testing.assert_close(dirty.loss, clean.loss)
        torch.testing.assert_close(dirty_grad, clean_grad)
        torch.testing.assert_close(dirty_masked_grad, clean_masked_grad)
        for key, value in clean.metrics.items():
            torch.testing.assert_close(dirty.metrics[key], value)


# ---------------------------------------------------------------- masking


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_mask_patches_is_deterministic_given_the_generator_and_leaves_global_rng_alone():
    images = torch.randint(1, 256, (4, 56, 56, 3), dtype=torch.uint8, generator=seeded(0))
    state = torch.get_rng_state()
    a = mask_patches(images, ratio=0.6, patch_size=14, generator=seeded(1))
    b = mask_patches(images, ratio=0.6, patch_size=14, generator=seeded(1))
    c = mask_patches(images, ratio=0.6, patch_size=14, generator=seeded(2))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.dtype == torch.uint8 and a.shape == images.shape


def test_mask_patches_blackens_whole_patches_at_about_the_requested_rate():
    images = torch.randint(1, 256, (64, 56, 56, 3), dtype=torch.uint8, generator=seeded(0))  # 0 never occurs
    original = images.clone()
    out = mask_patches(images, ratio=0.6, patch_size=14, generator=seeded(3))
    assert torch.equal(images, original)  # a copy, not in place
    black = (out == 0).all(-1)  # [N, H, W]
    assert torch.equal(out[~black], images[~black])  # untouched pixels are unchanged
    cells = black.view(64, 4, 14, 4, 14)  # 16 cells of 14 x 14 per image
    assert (cells.all(dim=(2, 4)) == cells.any(dim=(2, 4))).all()  # each cell all-or-nothing
    fraction = cells.all(dim=(2, 4)).float().mean()  # over 1024 cells
    assert abs(fraction - 0.6) < 0.05


def test_mask_patches_includes_partial_border_cells():
    images = torch.full((1, 30, 16, 3), 200, dtype=torch.uint8)  # 3 x 2 cells of 14 px, the last ones partial
    out = mask_patches(images, ratio=1.0, patch_size=14, generator=seeded(0))
    assert (out == 0).all()
    assert torch.equal(mask_patches(images, ratio=0.0, patch_size=14, generator=seeded(0)), images)


def test_mask_patches_masks_whole_rows_of_pixel_values_with_the_fill():
    rows = torch.randn(2000, 3 * 2 * 14 * 14, generator=seeded(0))  # [sum_patches, C*T*p*p]
    fill = black_patch_row([0.5, 0.25, 0.0], [0.5, 0.25, 1.0])
    out = mask_patches(rows, ratio=0.6, generator=seeded(4), fill=fill)
    hit = (out == fill).all(-1)  # [sum_patches]
    assert torch.equal(out[~hit], rows[~hit])
    assert abs(hit.float().mean() - 0.6) < 0.04
    torch.testing.assert_close(mask_patches(rows, ratio=0.6, generator=seeded(4), fill=fill), out)


def test_black_patch_row_is_channel_major():
    # (0 - mean) / std per channel = [-1, -1, 0], each repeated T*p*p = 2*14*14 = 392 times ([C, T, p, p] layout).
    row = black_patch_row([0.5, 0.25, 0.0], [0.5, 0.25, 1.0])
    expected = torch.tensor([-1.0, -1.0, 0.0]).repeat_interleave(392)
    torch.testing.assert_close(row, expected)


def test_mask_pixels_is_deterministic_and_masks_about_the_requested_fraction():
    pixel_values = torch.rand(100, 1000, generator=seeded(0)) + 1.0  # no zeros before masking
    a = mask_pixels(pixel_values, ratio=0.3, generator=seeded(5))
    b = mask_pixels(pixel_values, ratio=0.3, generator=seeded(5))
    assert torch.equal(a, b) and not torch.equal(a, mask_pixels(pixel_values, ratio=0.3, generator=seeded(6)))
    hit = a == 0
    assert abs(hit.float().mean() - 0.3) < 0.01  # 1e5 draws
    assert torch.equal(a[~hit], pixel_values[~hit])
    images = torch.full((2, 8, 8, 3), 9, dtype=torch.uint8)
    assert mask_pixels(images, ratio=0.5, generator=seeded(0)).dtype == torch.uint8


@pytest.mark.parametrize("fn", [mask_patches, mask_pixels])
def test_masking_rejects_ratios_outside_the_unit_interval(fn):
    with pytest.raises(ValueError, match="ratio"):
        fn(torch.zeros(2, 4, 4, 3), ratio=1.5, generator=seeded(0))
