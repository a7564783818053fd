"""The unbiased pass@k estimator against counting subsets by hand."""

from __future__ import annotations

import itertools

import pytest

from mmrl.stages.evaluate import pass_at_k


@pytest.mark.parametrize("n", [1, 2, 4, 5, 8])
def test_pass_at_k_is_the_fraction_of_k_subsets_holding_a_correct_sample(n):
    for correct in range(n + 1):
        samples = [True] * correct + [False] * (n - correct)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(samples, k))
            want = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, correct, k) == pytest.approx(want, abs=1e-12), (n, correct, k)


def test_pass_at_k_stays_exact_for_large_n_and_refuses_nonsense():
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)
    assert pass_at_k(1000, 0, 500) == 0.0 and pass_at_k(1000, 600, 500) == 1.0
    with pytest.raises(ValueError, match="0 < k <= n"):
        pass_at_k(4, 1, 5)
