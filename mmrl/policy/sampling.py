"""Token sampling for the lean decoding loop (`mmrl.policy.engines.backends.LeanBackend`): filters and an exact sampler.

`filter_top_k_top_p` keeps the tokens transformers' `TopKLogitsWarper` then `TopPLogitsWarper` keep (the same
masks, tested against them), so the lean loop samples the distribution `generate` samples.

`sample_categorical` draws one token per row from `softmax(scores)`, exactly (no approximation of the
distribution). `torch.multinomial` is slow on CPU (about 5 ms for 64 rows of a 2k vocabulary, over 10% of a
tiny model's decoding, measured with bench/grpo_step.py's profile); the two samplers here are exact too:

* CPU: inverse CDF. A float64 cumulative sum per row and one `searchsorted` of a uniform draw scaled to the row's
  total. The draw is kept strictly below the total, so the token found always has positive probability: a
  token whose probability is 0 adds nothing to the cumulative sum and cannot be the first entry above the draw.
* CUDA: the exponential race (`argmax(p / E)`, E ~ Exp(1) per token, as vLLM samples): one elementwise pass and an
  argmax, no cumulative sum; a token of probability 0 scores 0 and never wins against a positive one.
"""

from __future__ import annotations

import torch


def filter_top_k_top_p(scores: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """`scores` `[R, V]` with the tokens outside the top-k, then outside the top-p nucleus, set to -inf.

    The semantics of transformers' warpers (top-k first, then top-p; ties at the k-th score kept; the nucleus is the
    smallest set whose probability exceeds `1 - top_p` counted from the least likely, at least one token kept).
    `top_k=0` and `top_p=1` are off.
    """
    if top_k > 0 and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]  # [R, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(scores, dim=-1, descending=False)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - top_p)
        remove[..., -1:] = False  # the most likely token always stays
        scores = scores.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return scores


def sample_categorical(scores: torch.Tensor, method: str | None = None) -> torch.Tensor:
    """One index per row `[R]` drawn from `softmax(scores)` (`scores` `[R, V]`, -inf for impossible tokens).

    `method`: "cdf" (inverse CDF) or "race" (exponential race); by default "race" on CUDA and "cdf" elsewhere.
    """
    method = method or ("race" if scores.device.type == "cuda" else "cdf")
    if method not in ("cdf", "race"):
        raise ValueError(f"unknown sampling method {method!r}; choose cdf or race")
    probs = torch.softmax(scores.float(), dim=-1)
    if method == "race":
        race = probs / torch.empty_like(probs).exponential_(1.0)
        return race.argmax(dim=-1)
    cumulative = probs.double().cumsum(dim=-1)  # [R, V]
    total = cumulative[:, -1:]
    below = torch.nextafter(total, torch.zeros_like(total))  # the largest float64 under the total
    draw = torch.minimum(torch.rand_like(total) * total, below)
    return torch.searchsorted(cumulative, draw, right=True).squeeze(-1)
