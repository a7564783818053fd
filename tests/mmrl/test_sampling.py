"""The lean loop's sampler: the same filters as transformers' warpers, and exact categorical draws."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from mmrl.policy.sampling import filter_top_k_top_p, sample_categorical


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (5, 1.0), (0, 0.9), (0, 0.3), (20, 0.7), (1, 0.5), (500, 1.0)])
def test_filters_keep_what_transformers_warpers_keep(top_k, top_p):
    torch.manual_seed(0)
    scores = torch.randn(16, 300) * 3
    scores[:, :4] = scores[:, 4:8]  # ties at the top-k boundary are possible
    want = scores.clone()
    if top_k:
        want = TopKLogitsWarper(top_k)(None, want)
    if top_p < 1:
        want = TopPLogitsWarper(top_p)(None, want)
    got = filter_top_k_top_p(scores, top_k, top_p)
    torch.testing.assert_close(torch.isinf(got), torch.isinf(want), rtol=0, atol=0)
    torch.testing.assert_close(got[~torch.isinf(got)], scores[~torch.isinf(got)], rtol=0, atol=0)
    # Shifting a row (the log-softmax the loop filters) keeps the same tokens.
    shifted = filter_top_k_top_p(torch.log_softmax(scores, -1), top_k, top_p)
    torch.testing.assert_close(torch.isinf(shifted), torch.isinf(got), rtol=0, atol=0)


@pytest.mark.parametrize("method", ["cdf", "race"])
def test_sampler_draws_the_categorical_distribution(method):
    probs = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.05, 0.0])
    scores = probs.log().expand(20000, -1).contiguous()  # -inf where the probability is 0
    torch.manual_seed(0)
    draws = sample_categorical(scores, method)
    counts = torch.bincount(draws, minlength=6).float()
    assert counts[1] == 0 and counts[5] == 0  # impossible tokens never come out (one of them is the last)
    expected = probs * len(draws)
    keep = probs > 0
    chi2 = (((counts - expected)[keep]) ** 2 / expected[keep]).sum()
    assert chi2 < 16.3  # chi-square, 3 degrees of freedom: p = 0.001; a biased sampler fails this
    # A one-hot row always gives its token, and so does a row whose last entries are impossible.
    one_hot = torch.full((50, 6), float("-inf"))
    one_hot[:, 2] = 0.0
    assert (sample_categorical(one_hot, method) == 2).all()


def test_sampler_rejects_unknown_methods():
    with pytest.raises(ValueError, match="cdf or race"):
        sample_categorical(torch.zeros(1, 3), "gumbel")
