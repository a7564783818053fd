"""Data-side options: which groups to train on, how to treat over-long completions, multi-turn returns.

These are not losses: they decide *what* the loss sees (a keep mask over groups, a completion mask, a shaped
reward), so the loss functions never grow special cases for them. All are pure functions of tensors returning
tensors. A `[B]` keep mask over groups selects rows with `keep.repeat_interleave(group_size)` (groups are
contiguous).
"""

from __future__ import annotations

import torch

from rewards.text import length_penalty


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size < 1 or rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    return rewards.view(-1, group_size)  # [B, G]


def dynamic_sampling_keep(rewards: torch.Tensor, group_size: int, *, atol: float = 0.0) -> torch.Tensor:
    """Groups whose rewards are not all equal (DAPO's dynamic sampling, https://arxiv.org/abs/2503.14476).

    A group whose G rewards are equal has zero advantage under every group baseline, so it contributes no
    gradient, only noise in the token-mean denominator. DAPO drops such groups and samples more prompts.

    Args:
        rewards: `[R]` with R = B*G, groups contiguous.
        group_size: G.
        atol: rewards within `atol` of each other count as equal (for continuous rewards such as IoU).

    Returns:
        `[B]` bool, True for groups to keep.
    """
    grouped = _grouped(rewards, group_size)  # [B, G]
    return (grouped.amax(dim=1) - grouped.amin(dim=1)) > atol


def difficulty_filter_keep(
    rewards: torch.Tensor, group_size: int, low: float = 0.0, high: float = 1.0
) -> torch.Tensor:
    """Prompts whose group accuracy lies strictly inside `(low, high)`: neither too easy nor too hard.

    Online difficulty filtering, a curriculum on the fly (the PAPO-D runs keep accuracy in (0.01, 0.99)).
    With 0/1 rewards and the default (0, 1) it keeps exactly the groups `dynamic_sampling_keep` keeps.

    Args:
        rewards: `[R]` per-completion correctness in [0, 1] (pass the accuracy component, not a shaped total).
        group_size: G.
        low: exclusive lower bound on the group mean.
        high: exclusive upper bound on the group mean.

    Returns:
        `[B]` bool, True for prompts to keep.
    """
    accuracy = _grouped(rewards, group_size).float().mean(dim=1)  # [B]
    return (accuracy > low) & (accuracy < high)


def overlong_mask(
    completion_mask: torch.Tensor, max_len: int, *, truncated: torch.Tensor | None = None
) -> torch.Tensor:
    """The completion mask with truncated completions masked out entirely (DAPO's overlong filtering).

    A completion cut off at the length limit gets a reward for an unfinished answer; training on it punishes
    reasoning that was merely long. Masking its tokens removes it from the loss (and from token-mean
    denominators) without touching the others.

    Args:
        completion_mask: `[R, L]` bool, True up to and including EOS.
        max_len: the generation limit; a row with `max_len` or more tokens counts as truncated.
        truncated: `[R]` bool, overrides the length test (e.g. "no EOS was generated"), which cannot tell a
            completion that ends with EOS exactly at the limit from one cut off there.

    Returns:
        `[R, L]` bool.
    """
    mask = completion_mask.bool()
    if truncated is None:
        truncated = mask.sum(-1) >= max_len  # [R]
    return mask & ~truncated.bool().unsqueeze(-1)


def soft_overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (https://arxiv.org/abs/2503.14476, "Overlong Reward Shaping"), to add to rewards.

    With `L_max = max_len` and `L_cache = cache_len`:

        0                                   if |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
        -1                                  if |y| > L_max

    times `factor`: a linear ramp from 0 to -factor over the last `cache_len` tokens before the limit.

    Args:
        lengths: `[R]` completion lengths in tokens (`completion_mask.sum(-1)`).
        max_len: L_max.
        cache_len: L_cache, the width of the ramp; 0 < cache_len <= max_len.
        factor: the penalty at (and past) the limit.

    Returns:
        `[R]` float, in [-factor, 0].
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    # One copy of the ramp, in the rewards library.
    return factor * length_penalty(lengths.float(), target_length=max_len - cache_len, max_length=max_len)


def discounted_returns(step_rewards: torch.Tensor, dones: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted return from every step to the end of its episode, `G_t = r_t + gamma * G_{t+1} * (1 - done_t)`.

    Credit for multi-turn episodes: a step's return sums the rewards that followed it in the same episode, so a
    final success credits every turn that led to it (discounted by distance). A `done` cuts the sum, so steps
    after it (a new episode, or padding) never leak into earlier ones.

    Args:
        step_rewards: `[N, T]` reward received after each step.
        dones: `[N, T]` bool, True at the last step of an episode (terminated or truncated).
        gamma: discount in [0, 1].

    Returns:
        `[N, T]` float returns.
    """
    rewards = step_rewards.float()
    ends = dones.bool()  # [N, T]
    returns = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[:, 0])  # [N]
    # A reverse scan over time (T steps), vectorised over the N envs; the recurrence is sequential in t.
    for t in range(rewards.shape[1] - 1, -1, -1):
        # `where`, not `* (1 - done)`: inf in a padded step after the end must not become inf * 0 = NaN.
        running = rewards[:, t] + torch.where(ends[:, t], torch.zeros_like(running), gamma * running)
        returns[:, t] = running
    return returns
