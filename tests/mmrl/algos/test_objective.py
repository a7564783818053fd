"""`objective`: surrogate + KL + entropy + PAPO in one pure function, pinned by hand and against its parts."""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.algos import POLICY_LOSSES, aggregate, entropy_bonus_loss, kl_estimate, objective, ppo_clip_loss
from mmrl.algos.papo import papo_loss_terms

MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)  # [R=2, L=3], one padded position


def _batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(2, 3, generator=gen)
    return {
        "logprobs": logprobs,
        "old": logprobs + 0.05 * torch.randn(2, 3, generator=gen),
        "ref": logprobs + 0.3 * torch.randn(2, 3, generator=gen),
        "entropy": torch.rand(2, 3, generator=gen),
        "masked": logprobs - torch.rand(2, 3, generator=gen),
        "masked_entropy": torch.rand(2, 3, generator=gen),
        "advantages": torch.tensor([1.0, -0.5]),
    }


def test_the_surrogate_alone_is_the_registered_loss():
    b = _batch()
    want = ppo_clip_loss(b["logprobs"], b["old"], b["advantages"], MASK, clip_low=0.2, clip_high=0.28)
    got = objective(
        b["logprobs"], b["old"], b["advantages"], MASK, loss_fn=ppo_clip_loss, clip_low=0.2, clip_high=0.28
    )
    torch.testing.assert_close(got.loss, want.loss)
    assert got.metrics["loss/policy"] == want.loss
    assert got.metrics["loss/kl"] == 0  # logged as 0 without a reference, as before
    assert set(want.metrics) <= set(got.metrics)  # clip_fraction, approx_kl
    assert not any(k.startswith("papo/") for k in got.metrics) and "entropy" not in got.metrics


def test_kl_term_by_hand():
    # Advantages 0 and ratio 1: the surrogate is 0, so the loss is kl_coef * mean k1 = 0.1 * mean(logp - ref).
    logprobs = torch.tensor([[0.0, -1.0, -2.0]])
    ref = torch.tensor([[-1.0, -2.0, -2.0]])  # k1 per token: 1, 1, 0 -> token mean 2/3
    mask = torch.ones(1, 3, dtype=torch.bool)
    out = objective(
        logprobs,
        logprobs,
        torch.zeros(1),
        mask,
        loss_fn=ppo_clip_loss,
        ref_logprobs=ref,
        kl_coef=0.1,
        kl_estimator="k1",
    )
    torch.testing.assert_close(out.loss, torch.tensor(0.1 * 2 / 3))
    torch.testing.assert_close(out.metrics["loss/kl"], torch.tensor(2 / 3))
    # kl_coef 0 ignores a reference that is passed.
    off = objective(logprobs, logprobs, torch.zeros(1), mask, loss_fn=ppo_clip_loss, ref_logprobs=ref, kl_coef=0.0)
    assert off.loss == 0 and off.metrics["loss/kl"] == 0


def test_entropy_bonus_by_hand():
    logprobs = torch.zeros(1, 2)
    entropy = torch.tensor([[1.0, 3.0]])  # mean 2
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = objective(
        logprobs, logprobs, torch.zeros(1), mask, loss_fn=ppo_clip_loss, entropy=entropy, entropy_coef=0.01
    )
    torch.testing.assert_close(out.loss, torch.tensor(-0.02))
    torch.testing.assert_close(out.metrics["entropy"], torch.tensor(2.0))


def test_every_term_together_is_the_sum_of_its_parts():
    b, kw = _batch(1), {"aggregation": "seq_mean_token_sum_norm", "max_len": 3}
    for name in POLICY_LOSSES.names():
        loss_fn = POLICY_LOSSES.get(name)
        got = objective(
            b["logprobs"], b["old"], b["advantages"], MASK, loss_fn=loss_fn, clip_low=0.2, clip_high=0.28,
            ref_logprobs=b["ref"], kl_coef=0.05, kl_estimator="k3", entropy=b["entropy"], entropy_coef=0.01,
            masked_logprobs=b["masked"], masked_entropy=b["masked_entropy"], papo_gamma=0.02, papo_eta=0.03,
            papo_kl_bound=0.2, **kw,
        )  # fmt: skip
        surrogate = loss_fn(b["logprobs"], b["old"], b["advantages"], MASK, clip_low=0.2, clip_high=0.28, **kw)
        kl = aggregate(kl_estimate(b["logprobs"], b["ref"], "k3", mask=MASK), MASK, kw["aggregation"], max_len=3)
        bonus = entropy_bonus_loss(b["entropy"], MASK, coef=0.01, **kw)
        papo = papo_loss_terms(
            b["logprobs"], b["masked"], MASK, gamma=0.02, eta=0.03, entropy=b["entropy"],
            masked_entropy=b["masked_entropy"], bound=0.2, **kw,
        )  # fmt: skip
        torch.testing.assert_close(got.loss, surrogate.loss + 0.05 * kl + bonus.loss + papo.loss)
        for key, value in {**surrogate.metrics, **bonus.metrics, **papo.metrics, "loss/kl": kl}.items():
            torch.testing.assert_close(got.metrics[key], value, msg=f"{name}: {key}")
        assert all(not v.requires_grad for v in got.metrics.values())


def test_whatever_is_in_padding_changes_nothing():
    b = _batch(2)
    junk = {k: torch.where(MASK, v, torch.full_like(v, 1e4)) for k, v in b.items() if k != "advantages"}

    def loss(t):
        return objective(
            t["logprobs"], t["old"], b["advantages"], MASK, loss_fn=ppo_clip_loss, ref_logprobs=t["ref"], kl_coef=0.1,
            entropy=t["entropy"], entropy_coef=0.01, masked_logprobs=t["masked"], masked_entropy=t["masked_entropy"],
            papo_gamma=0.02, papo_eta=0.01,
        )  # fmt: skip

    clean, dirty = loss(b), loss(junk)
    torch.testing.assert_close(clean.loss, dirty.loss)
    assert math.isfinite(float(dirty.loss))


def test_positive_advantage_raises_the_chosen_tokens_and_kl_pulls_back_to_the_reference():
    logits = torch.zeros(2, 3, 5, requires_grad=True)  # [R, L, V]
    tokens = torch.tensor([[1, 2, 3], [4, 0, 1]])
    logprobs = logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    mask = torch.ones(2, 3, dtype=torch.bool)
    objective(logprobs, logprobs.detach(), torch.tensor([1.0, -1.0]), mask, loss_fn=ppo_clip_loss).loss.backward()
    chosen = logits.grad.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [R, L]
    assert (chosen[0] < 0).all() and (chosen[1] > 0).all()  # descent raises row 0's tokens, lowers row 1's
    # With zero advantages and a reference that likes the chosen tokens more, k1's gradient raises them.
    logits.grad = None
    logprobs = logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    objective(
        logprobs, logprobs.detach(), torch.zeros(2), mask, loss_fn=ppo_clip_loss,
        ref_logprobs=logprobs.detach() + 1.0, kl_coef=1.0, kl_estimator="k3",
    ).loss.backward()  # fmt: skip
    chosen = logits.grad.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert (chosen < 0).all()


def test_entropy_coef_without_entropy_is_an_error():
    b = _batch()
    with pytest.raises(ValueError, match="entropy"):
        objective(b["logprobs"], b["old"], b["advantages"], MASK, loss_fn=ppo_clip_loss, entropy_coef=0.1)
