"""Rollout correction: truncated and masked importance weights on crafted ratios, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.algos import POLICY_LOSSES, objective
from mmrl.algos.correction import mismatch_metrics, rollout_correction

# Two rows of four tokens; row 1's last token is padding (its log-probs are junk).
MASK = torch.tensor([[True, True, True, True], [True, True, True, False]])
RHO = torch.tensor([[0.25, 0.8, 1.0, 3.0], [1.2, 1.5, 0.9, 1e9]])  # trainer / rollout, per token
ROLLOUT = -torch.rand(2, 4, generator=torch.Generator().manual_seed(0))
TRAINER = ROLLOUT + RHO.log()


def test_token_truncate_caps_each_ratio_at_the_cap():
    weights, metrics = rollout_correction(TRAINER, ROLLOUT, MASK, mode="token_truncate", cap=2.0)
    expected = torch.tensor([[0.25, 0.8, 1.0, 2.0], [1.2, 1.5, 0.9, 0.0]])
    torch.testing.assert_close(weights, expected)
    assert metrics["correction/cut_fraction"] == pytest.approx(1 / 7)
    assert metrics["correction/weight_mean"] == pytest.approx(expected.sum().item() / 7)


def test_token_mask_zeroes_ratios_outside_the_band():
    weights, metrics = rollout_correction(TRAINER, ROLLOUT, MASK, mode="token_mask", cap=2.0)
    expected = torch.tensor([[0.0, 0.8, 1.0, 0.0], [1.2, 1.5, 0.9, 0.0]])  # 0.25 < 1/2 and 3 > 2 are cut
    torch.testing.assert_close(weights, expected)
    assert metrics["correction/cut_fraction"] == pytest.approx(2 / 7)


def test_sequence_modes_use_the_product_of_a_rows_ratios():
    row_rho = [0.25 * 0.8 * 1.0 * 3.0, 1.2 * 1.5 * 0.9]  # 0.6 and 1.62 (the padding never counts)
    weights, _ = rollout_correction(TRAINER, ROLLOUT, MASK, mode="sequence_truncate", cap=1.5)
    torch.testing.assert_close(weights[0, :4], torch.full((4,), row_rho[0]))
    torch.testing.assert_close(weights[1, :3], torch.full((3,), 1.5))  # truncated
    assert weights[1, 3] == 0
    weights, metrics = rollout_correction(TRAINER, ROLLOUT, MASK, mode="sequence_mask", cap=1.65)
    assert weights[0].abs().max() == 0  # the whole row is out of [1/1.65, 1.65] = [0.606, 1.65]
    torch.testing.assert_close(weights[1, :3], torch.full((3,), row_rho[1]))
    assert metrics["correction/cut_fraction"] == pytest.approx(4 / 7)


def test_equal_log_probs_give_weight_one_and_no_mismatch():
    weights, metrics = rollout_correction(ROLLOUT, ROLLOUT, MASK, mode="token_truncate", cap=2.0)
    torch.testing.assert_close(weights, MASK.float())
    assert metrics["mismatch/kl"] == 0 and metrics["mismatch/abs_logprob_diff"] == 0
    assert metrics["mismatch/ratio_max"] == 1 and metrics["mismatch/ratio_min"] == 1


def test_mismatch_metrics_by_hand_and_blind_to_padding():
    metrics = mismatch_metrics(TRAINER, ROLLOUT, MASK)
    rho = RHO[MASK]
    assert metrics["mismatch/kl"] == pytest.approx((rho - 1 - rho.log()).mean().item(), rel=1e-5)
    assert metrics["mismatch/abs_logprob_diff"] == pytest.approx(rho.log().abs().mean().item(), rel=1e-5)
    assert metrics["mismatch/ratio_max"] == pytest.approx(3.0) and metrics["mismatch/ratio_min"] == pytest.approx(0.25)
    junk = torch.where(MASK, TRAINER, torch.full_like(TRAINER, float("nan")))
    assert {k: v.item() for k, v in mismatch_metrics(junk, ROLLOUT, MASK).items()} == pytest.approx(
        {k: v.item() for k, v in metrics.items()}
    )


def test_bad_mode_or_cap_is_an_error():
    with pytest.raises(ValueError, match="unknown rollout correction 'tis'"):
        rollout_correction(TRAINER, ROLLOUT, MASK, mode="tis")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cap must be > 1"):
        rollout_correction(TRAINER, ROLLOUT, MASK, cap=1.0)


def test_the_objective_applies_the_weights_to_the_surrogate_only():
    logprobs = TRAINER + 0.05 * torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    advantages = torch.tensor([1.0, -1.0])
    loss_fn = POLICY_LOSSES.get("ppo_clip")
    kw = dict(loss_fn=loss_fn, clip_low=0.2, clip_high=0.28)
    corrected = objective(logprobs, TRAINER, advantages, MASK, rollout_logprobs=ROLLOUT, correction="token_mask", **kw)
    weights, _ = rollout_correction(TRAINER, ROLLOUT, MASK, mode="token_mask", cap=2.0)
    by_hand = loss_fn(logprobs, TRAINER, advantages, MASK, clip_low=0.2, clip_high=0.28, token_weights=weights)
    torch.testing.assert_close(corrected.loss, by_hand.loss)
    assert corrected.metrics["correction/cut_fraction"] == pytest.approx(2 / 7)
    # Without a correction the mismatch is still measured, and the loss is the plain one.
    measured = objective(logprobs, TRAINER, advantages, MASK, rollout_logprobs=ROLLOUT, **kw)
    plain = objective(logprobs, TRAINER, advantages, MASK, **kw)
    torch.testing.assert_close(measured.loss, plain.loss)
    assert measured.metrics["mismatch/ratio_max"] == pytest.approx(3.0) and "mismatch/kl" not in plain.metrics
    assert not math.isclose(corrected.loss.item(), plain.loss.item())
    with pytest.raises(ValueError, match="rollout_logprobs"):
        objective(logprobs, TRAINER, advantages, MASK, correction="token_truncate", **kw)
