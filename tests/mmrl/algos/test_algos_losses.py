"""Policy losses, aggregation, KL estimators and entropy: hand-computed values, gradient direction, padding invariance."""

import math

import pytest
import torch

from mmrl.algos import (
    POLICY_LOSSES,
    aggregate,
    dual_clip_loss,
    entropy_bonus_loss,
    entropy_from_logits,
    gspo_loss,
    kl_estimate,
    kl_penalized_rewards,
    ppo_clip_loss,
)

AGGREGATIONS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)  # [R=3, L=5]


def one_token(ratio: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logprobs, old_logprobs and mask of a single one-token completion with the given ratio."""
    old = torch.tensor([[math.log(0.5)]])
    return old + math.log(ratio), old, torch.ones(1, 1, dtype=torch.bool)


def test_every_policy_loss_is_covered_here():
    assert set(POLICY_LOSSES.names()) == {"ppo_clip", "dual_clip", "gspo"}


# ---------------------------------------------------------------- aggregation


@pytest.mark.parametrize(
    ("mode", "kwargs", "expected"),
    [
        ("token_mean", {}, (1 + 2 + 3 + 4) / 4),  # every real token counts once
        ("seq_mean_token_mean", {}, ((1 + 2 + 3) / 3 + 4 / 1) / 2),  # each row counts once
        ("seq_mean_token_sum_norm", {}, ((1 + 2 + 3) / 3 + 4 / 3) / 2),  # row sums over the width L=3
        ("seq_mean_token_sum_norm", {"max_len": 5}, ((1 + 2 + 3) / 5 + 4 / 5) / 2),  # over an explicit constant
    ],
)
def test_aggregate_matches_hand_computation(mode, kwargs, expected):
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("inf"), float("nan")]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(aggregate(values, mask, mode, **kwargs), torch.tensor(expected))


def test_aggregate_rejects_unknown_modes():
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "sum")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_wider_padding_changes_no_aggregation_given_the_same_max_len(mode):
    values = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    wide_values = torch.cat([values, torch.full((3, 4), 7.0)], dim=1)
    wide_mask = torch.cat([MASK, torch.zeros(3, 4, dtype=torch.bool)], dim=1)
    torch.testing.assert_close(
        aggregate(values, MASK, mode, max_len=8), aggregate(wide_values, wide_mask, mode, max_len=8)
    )


# ---------------------------------------------------------------- hand-computed losses


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected", "clipped"),
    [
        (1.5, 1.0, -1.28, True),  # A > 0, ratio above 1 + clip_high: clipped to 1.28, no gradient
        (1.5, -1.0, 1.5, False),  # A < 0, ratio above: the unclipped (larger) loss is kept
        (0.5, 1.0, -0.5, False),  # A > 0, ratio below 1 - clip_low: the unclipped (larger) loss is kept
        (0.5, -1.0, 0.8, True),  # A < 0, ratio below: clipped to 0.8
        (1.1, 1.0, -1.1, False),  # inside the trust region
        (1.1, -2.0, 2.2, False),
    ],
)
def test_ppo_clip_matches_hand_computation(ratio, advantage, expected, clipped):
    logprobs, old, mask = one_token(ratio)
    out = ppo_clip_loss(logprobs, old, torch.tensor([advantage]), mask, clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(out.loss, torch.tensor(expected))
    assert out.metrics["clip_fraction"] == float(clipped)
    k3 = ratio - 1 - math.log(ratio)
    torch.testing.assert_close(out.metrics["approx_kl"], torch.tensor(k3))


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected", "cut"),
    [
        (5.0, -1.0, 3.0, True),  # PPO-clip would give 5.0; the dual clip caps it at clip_c * |A| = 3
        (5.0, -0.5, 1.5, True),
        (2.0, -1.0, 2.0, False),  # below the cap: plain PPO-clip
        (5.0, 1.0, -1.2, True),  # A > 0: the dual clip does not apply, ordinary clipping does
        (0.5, -1.0, 0.8, True),  # A < 0, ratio low: ordinary clipping
    ],
)
def test_dual_clip_matches_hand_computation(ratio, advantage, expected, cut):
    logprobs, old, mask = one_token(ratio)
    out = dual_clip_loss(logprobs, old, torch.tensor([advantage]), mask, clip_low=0.2, clip_high=0.2, clip_c=3.0)
    torch.testing.assert_close(out.loss, torch.tensor(expected))
    assert out.metrics["clip_fraction"] == float(cut)


def test_dual_clip_cuts_the_gradient_of_capped_tokens():
    logprobs, old, mask = one_token(5.0)
    logprobs.requires_grad_(True)
    dual_clip_loss(logprobs, old, torch.tensor([-1.0]), mask, clip_c=3.0).loss.backward()
    assert logprobs.grad is not None and logprobs.grad.abs().max() == 0


def test_dual_clip_needs_clip_c_above_one():
    logprobs, old, mask = one_token(1.0)
    with pytest.raises(ValueError, match="clip_c"):
        dual_clip_loss(logprobs, old, torch.tensor([1.0]), mask, clip_c=1.0)


def test_gspo_uses_the_length_normalised_sequence_ratio():
    # token log-ratios 0.1 and 0.3 -> sequence log-ratio 0.2 -> s = e^0.2 at both tokens.
    old = torch.log(torch.tensor([[0.5, 0.4]]))
    logprobs = (old + torch.tensor([[0.1, 0.3]])).requires_grad_(True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = gspo_loss(logprobs, old, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.28)
    s = math.exp(0.2)
    torch.testing.assert_close(out.loss, torch.tensor(-s))
    out.loss.backward()
    # GSPO-token: d(-A * s_t)/d logprob_t = -A * s, averaged over |y| = 2 tokens.
    torch.testing.assert_close(logprobs.grad, torch.full((1, 2), -s / 2))


def test_gspo_clips_whole_sequences():
    old = torch.log(torch.tensor([[0.5, 0.4]]))
    logprobs = (old + torch.tensor([[0.1, 0.3]])).requires_grad_(True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = gspo_loss(logprobs, old, torch.tensor([1.0]), mask)  # paper's clip range 3e-4 / 4e-4
    torch.testing.assert_close(out.loss, torch.tensor(-(1 + 4e-4)))
    assert out.metrics["clip_fraction"] == 1.0
    out.loss.backward()
    assert logprobs.grad is not None and logprobs.grad.abs().max() == 0  # the whole sequence is clipped


def test_gspo_gradient_equals_the_sequence_level_objective():
    """Reference: GSPO's sequence objective -A * exp(mean_t log-ratio), differentiated directly (unclipped)."""
    gen = torch.Generator().manual_seed(3)
    old = -torch.rand(3, 5, generator=gen) - 0.5
    logprobs = (old + 0.05 * torch.randn(3, 5, generator=gen)).requires_grad_(True)
    advantages = torch.tensor([1.0, -0.5, 2.0])
    gspo_loss(logprobs, old, advantages, MASK, clip_low=10.0, clip_high=10.0).loss.backward()
    got = logprobs.grad

    reference = logprobs.detach().clone().requires_grad_(True)
    n = MASK.sum(-1)
    seq_ratio = (((reference - old) * MASK).sum(-1) / n).exp()  # [R]
    (-(advantages * seq_ratio).mean()).backward()
    torch.testing.assert_close(got, reference.grad)


def test_gspo_equals_ppo_clip_on_policy():
    gen = torch.Generator().manual_seed(4)
    logprobs = (-torch.rand(3, 5, generator=gen)).requires_grad_(True)
    advantages = torch.tensor([1.0, -1.0, 0.5])
    grads = []
    for fn in (gspo_loss, ppo_clip_loss):
        logprobs.grad = None
        out = fn(logprobs, logprobs.detach(), advantages, MASK, aggregation="seq_mean_token_mean")
        out.loss.backward()
        grads.append(logprobs.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


# ---------------------------------------------------------------- every registered loss


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_positive_advantage_raises_chosen_token_logits(name):
    logits = torch.zeros(2, 3, 5, requires_grad=True)  # [R, L, V]
    tokens = torch.tensor([[1, 2, 3], [4, 0, 1]])
    logprobs = logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    mask = torch.ones(2, 3, dtype=torch.bool)
    POLICY_LOSSES.get(name)(logprobs, logprobs.detach(), torch.tensor([1.0, -1.0]), mask).loss.backward()
    assert logits.grad is not None
    chosen_grad = logits.grad.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [R, L]
    assert (chosen_grad[0] < 0).all()  # descent raises these logits
    assert (chosen_grad[1] > 0).all()  # descent lowers these logits


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_policy_losses_ignore_whatever_is_in_padding(name, aggregation):
    gen = torch.Generator().manual_seed(0)
    logprobs, old = -torch.rand(3, 5, generator=gen), -torch.rand(3, 5, generator=gen)
    advantages = torch.tensor([1.0, -1.0, 0.5])
    fn = POLICY_LOSSES.get(name)

    def run(lp, op):
        lp = lp.clone().requires_grad_(True)
        out = fn(lp, op, advantages, MASK, clip_low=0.2, clip_high=0.28, aggregation=aggregation)
        out.loss.backward()
        return out, lp.grad

    clean, clean_grad = run(logprobs, old)
    for junk in (1e4, float("inf"), float("-inf"), float("nan")):  # exp(1e4) = inf if it leaks
        dirty, dirty_grad = run(
            torch.where(MASK, logprobs, torch.full_like(logprobs, junk)),
            torch.where(MASK, old, torch.full_like(old, -junk)),
        )
        torch.testing.assert_close(dirty.loss, clean.loss)
        torch.testing.assert_close(dirty_grad, clean_grad)  # finite, and zero at padding
        for key, value in clean.metrics.items():
            torch.testing.assert_close(dirty.metrics[key], value)
    assert clean_grad[~MASK].abs().max() == 0


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_policy_losses_report_the_metrics_the_trainer_sums(name):
    logprobs = -torch.rand(3, 5, generator=torch.Generator().manual_seed(0))
    out = POLICY_LOSSES.get(name)(logprobs, logprobs, torch.ones(3), MASK, clip_low=0.2, clip_high=0.2)
    assert set(out.metrics) == {
        "clip_fraction", "clip_fraction_low", "clip_fraction_high", "approx_kl", "ratio/mean", "ratio/min", "ratio/max"
    }  # fmt: skip
    assert all(not v.requires_grad and v.ndim == 0 for v in out.metrics.values())


@pytest.mark.parametrize("name", ["ppo_clip", "dual_clip"])
def test_clip_fractions_split_by_side_on_crafted_ratios(name):
    # One row of 5 tokens (the last is padding): ratios 0.5, 0.9, 1.1, 1.5 under clip 0.2 / 0.28.
    ratios = torch.tensor([[0.5, 0.9, 1.1, 1.5, 99.0]])
    mask = torch.tensor([[True, True, True, True, False]])
    old = torch.zeros(1, 5)
    loss = POLICY_LOSSES.get(name)
    # A > 0: only ratios above 1 + clip_high lose their gradient (1.5), one token of four on the high side.
    up = loss(ratios.log(), old, torch.ones(1), mask, clip_low=0.2, clip_high=0.28).metrics
    assert up["clip_fraction_high"] == pytest.approx(0.25) and up["clip_fraction_low"] == 0
    assert up["clip_fraction"] == pytest.approx(0.25)
    # A < 0: only ratios below 1 - clip_low lose theirs (0.5), on the low side.
    down = loss(ratios.log(), old, -torch.ones(1), mask, clip_low=0.2, clip_high=0.28).metrics
    assert down["clip_fraction_low"] == pytest.approx(0.25) and down["clip_fraction_high"] == 0
    assert down["ratio/min"] == pytest.approx(0.5) and down["ratio/max"] == pytest.approx(1.5)  # padding unseen
    assert down["ratio/mean"] == pytest.approx((0.5 + 0.9 + 1.1 + 1.5) / 4)
    # Ratio 1 everywhere (one update per rollout, on-policy): no clip binds.
    flat = loss(old, old, torch.ones(1), mask, clip_low=0.2, clip_high=0.28).metrics
    assert flat["clip_fraction"] == 0 and flat["ratio/min"] == 1 and flat["ratio/max"] == 1


def test_gspo_clip_sides_follow_the_sequence_ratio():
    # Row 0's sequence ratio is exp(mean log r) = exp(0.1) > 1 + 4e-4; row 1's exp(-0.1) < 1 - 3e-4.
    logprobs = torch.tensor([[0.1, 0.1], [-0.1, -0.1]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    out = POLICY_LOSSES.get("gspo")(logprobs, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), mask)
    assert out.metrics["clip_fraction_high"] == pytest.approx(0.5) and out.metrics["clip_fraction_low"] == 0.5


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_token_weights_scale_each_tokens_loss_and_gradient(name):
    logprobs = -torch.rand(3, 5, generator=torch.Generator().manual_seed(1))
    old = logprobs + 0.01 * torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
    advantages = torch.tensor([1.0, -0.5, 2.0])
    weights = torch.rand(3, 5, generator=torch.Generator().manual_seed(3))

    def grad(w):
        lp = logprobs.clone().requires_grad_()
        POLICY_LOSSES.get(name)(lp, old, advantages, MASK, token_weights=w).loss.backward()
        return lp.grad

    torch.testing.assert_close(grad(weights), grad(None) * weights * MASK)
    torch.testing.assert_close(grad(torch.ones(3, 5)), grad(None))


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_permuting_rows_leaves_policy_losses_unchanged(name):
    gen = torch.Generator().manual_seed(5)
    logprobs, old = -torch.rand(3, 5, generator=gen), -torch.rand(3, 5, generator=gen)
    advantages = torch.tensor([1.0, -1.0, 0.5])
    perm = torch.tensor([2, 0, 1])
    fn = POLICY_LOSSES.get(name)
    for aggregation in AGGREGATIONS:
        a = fn(logprobs, old, advantages, MASK, aggregation=aggregation).loss
        b = fn(logprobs[perm], old[perm], advantages[perm], MASK[perm], aggregation=aggregation).loss
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------- KL


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [
        # pi = 0.5, pi_ref = 0.25: log r = log(pi_ref / pi) = -log 2.
        ("k1", math.log(2)),
        ("k2", 0.5 * math.log(2) ** 2),
        ("k3", 0.5 - 1 + math.log(2)),
    ],
)
def test_kl_estimators_match_hand_computation(estimator, expected):
    got = kl_estimate(torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]]), estimator)
    torch.testing.assert_close(got, torch.tensor([[expected]]))


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_kl_penalty_pulls_logprobs_toward_the_reference(estimator):
    ref = torch.tensor([[-1.0, -1.0]])
    logprobs = torch.tensor([[-0.5, -2.0]], requires_grad=True)  # one above the reference, one below
    kl_estimate(logprobs, ref, estimator).sum().backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0, 0] > 0  # descent lowers the one above
    assert logprobs.grad[0, 1] < 0  # and raises the one below


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimate_with_a_mask_ignores_padding_in_value_and_gradient(estimator):
    gen = torch.Generator().manual_seed(6)
    logprobs, ref = -torch.rand(3, 5, generator=gen), -torch.rand(3, 5, generator=gen)

    def run(lp, rp):
        lp = lp.clone().requires_grad_(True)
        kl = kl_estimate(lp, rp, estimator, mask=MASK)
        aggregate(kl, MASK).backward()
        return kl, lp.grad

    clean, clean_grad = run(logprobs, ref)
    dirty, dirty_grad = run(
        torch.where(MASK, logprobs, torch.full_like(logprobs, float("inf"))),
        torch.where(MASK, ref, torch.full_like(ref, float("-inf"))),
    )
    torch.testing.assert_close(dirty, clean)
    torch.testing.assert_close(dirty_grad, clean_grad)
    assert clean[~MASK].abs().max() == 0


def test_kl_penalized_rewards_subtract_the_summed_kl():
    rewards = torch.tensor([1.0, 0.0])
    logprobs = torch.tensor([[-1.0, -1.0], [-2.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -0.5], [-1.0, float("inf")]])  # padding holds inf
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    # k1 = logprob - ref_logprob: row 0: 0.5 - 0.5 = 0; row 1: -2 - (-1) = -1 (padding ignored).
    got = kl_penalized_rewards(rewards, logprobs, ref, mask, 0.1, "k1")
    torch.testing.assert_close(got, torch.tensor([1.0, 0.1]))
    assert not got.requires_grad  # a reward, not a loss
    # k3 on row 0: log r = +-0.5 -> (e^0.5 - 1.5) + (e^-0.5 - 0.5).
    k3_row0 = (math.exp(0.5) - 1.5) + (math.exp(-0.5) - 0.5)
    got = kl_penalized_rewards(rewards, logprobs, ref, mask, coef=2.0, estimator="k3")
    torch.testing.assert_close(got[0], torch.tensor(1.0 - 2.0 * k3_row0))


# ---------------------------------------------------------------- entropy


def test_entropy_matches_hand_computation():
    ninf = float("-inf")
    logits = torch.tensor(
        [
            [[0.0, 0.0, 0.0, 0.0], [0.0, ninf, ninf, ninf]],  # uniform over 4 -> log 4; one allowed token -> 0
            [[5.0, 5.0, ninf, ninf], [math.log(3), 0.0, ninf, ninf]],  # log 2; p = (3/4, 1/4)
        ]
    )
    p = torch.tensor([0.75, 0.25])
    expected = torch.tensor([[math.log(4), 0.0], [math.log(2), float(-(p * p.log()).sum())]])
    torch.testing.assert_close(entropy_from_logits(logits), expected)


def test_entropy_matches_a_float64_reference_and_is_stable_for_huge_logits():
    logits = 3 * torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(7))
    p = logits.double().softmax(-1)
    reference = -(p * p.log()).sum(-1)
    torch.testing.assert_close(entropy_from_logits(logits).double(), reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy_from_logits(logits + 1e4).double(), reference, rtol=1e-3, atol=1e-3)
    assert entropy_from_logits(logits.bfloat16()).dtype == torch.float32


def test_chunked_entropy_equals_unchunked_in_value_and_gradient():
    logits = torch.randn(3, 4, 11, generator=torch.Generator().manual_seed(8)).requires_grad_(True)
    whole = entropy_from_logits(logits)
    (grad_whole,) = torch.autograd.grad(whole.sum(), logits)
    chunked = entropy_from_logits(logits, chunk_size=5)  # 12 positions in chunks of 5, 5, 2
    (grad_chunked,) = torch.autograd.grad(chunked.sum(), logits)
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(grad_chunked, grad_whole)


def test_entropy_gradient_is_finite_with_banned_tokens():
    logits = torch.tensor([[[1.0, 2.0, float("-inf")]]], requires_grad=True)
    entropy_from_logits(logits).sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_entropy_bonus_matches_hand_computation_and_ignores_padding():
    entropy = torch.tensor([[1.0, 2.0], [3.0, float("nan")]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    out = entropy_bonus_loss(entropy, mask, coef=0.01)
    torch.testing.assert_close(out.loss, torch.tensor(-0.01 * 2.0))  # token mean (1 + 2 + 3) / 3 = 2
    torch.testing.assert_close(out.metrics["entropy"], torch.tensor(2.0))


def test_entropy_bonus_descent_flattens_the_distribution():
    logits = torch.tensor([[[3.0, 0.0, 0.0]]], requires_grad=True)
    mask = torch.ones(1, 1, dtype=torch.bool)
    entropy_bonus_loss(entropy_from_logits(logits), mask, coef=0.1).loss.backward()
    assert logits.grad is not None
    assert logits.grad[0, 0, 0] > 0  # descent lowers the dominant logit
    assert (logits.grad[0, 0, 1:] < 0).all()  # and raises the others
