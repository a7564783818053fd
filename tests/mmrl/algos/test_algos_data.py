"""Data-side options: group filters, overlong handling, multi-turn returns, all checked against hand values."""

import pytest
import torch

from mmrl.algos.data import (
    difficulty_filter_keep,
    discounted_returns,
    dynamic_sampling_keep,
    overlong_mask,
    soft_overlong_penalty,
)

# B=4 groups of G=3: all right, mixed, all wrong, nearly equal continuous rewards.
REWARDS = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5001])


def test_dynamic_sampling_drops_groups_with_equal_rewards():
    torch.testing.assert_close(dynamic_sampling_keep(REWARDS, 3), torch.tensor([False, True, False, True]))
    torch.testing.assert_close(dynamic_sampling_keep(REWARDS, 3, atol=1e-3), torch.tensor([False, True, False, False]))


def test_difficulty_filter_keeps_prompts_inside_the_open_interval():
    # group accuracies: 1, 1/3, 0, 2/3.
    accuracy = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    torch.testing.assert_close(
        difficulty_filter_keep(accuracy, 3, 0.5, 1.0), torch.tensor([False, False, False, True])
    )
    torch.testing.assert_close(
        difficulty_filter_keep(accuracy, 3, 0.0, 0.5), torch.tensor([False, True, False, False])
    )
    # With 0/1 rewards and the default (0, 1), exactly the groups dynamic sampling keeps.
    torch.testing.assert_close(difficulty_filter_keep(accuracy, 3), dynamic_sampling_keep(accuracy, 3))


@pytest.mark.parametrize("keep_fn", [dynamic_sampling_keep, difficulty_filter_keep])
def test_permuting_groups_permutes_the_keep_mask(keep_fn):
    gen = torch.Generator().manual_seed(0)
    rewards = (torch.rand(6 * 4, generator=gen) > 0.5).float()
    group_perm = torch.randperm(6, generator=gen)
    row_perm = (group_perm.unsqueeze(1) * 4 + torch.arange(4)).reshape(-1)
    torch.testing.assert_close(keep_fn(rewards[row_perm], 4), keep_fn(rewards, 4)[group_perm])


def test_group_filters_reject_rewards_that_do_not_split_into_groups():
    with pytest.raises(ValueError, match="groups of 4"):
        dynamic_sampling_keep(torch.zeros(6), 4)


def test_soft_overlong_penalty_matches_the_dapo_formula():
    # L_max = 20, L_cache = 4: no penalty up to 16 tokens, then (16 - |y|) / 4, and -1 at or past 20.
    lengths = torch.tensor([10, 16, 17, 18, 19, 20, 21])
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0])
    torch.testing.assert_close(soft_overlong_penalty(lengths, max_len=20, cache_len=4), expected)
    torch.testing.assert_close(soft_overlong_penalty(lengths, max_len=20, cache_len=4, factor=0.5), 0.5 * expected)


def test_soft_overlong_penalty_never_rewards_and_never_decreases_with_shorter_outputs():
    lengths = torch.arange(0, 40)
    penalty = soft_overlong_penalty(lengths, max_len=32, cache_len=8)
    assert (penalty <= 0).all() and (penalty[1:] <= penalty[:-1]).all()


def test_soft_overlong_penalty_rejects_an_empty_or_oversized_cache():
    with pytest.raises(ValueError, match="cache_len"):
        soft_overlong_penalty(torch.tensor([1]), max_len=8, cache_len=0)
    with pytest.raises(ValueError, match="cache_len"):
        soft_overlong_penalty(torch.tensor([1]), max_len=8, cache_len=9)


def test_overlong_mask_removes_truncated_completions():
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    expected = mask.clone()
    expected[1] = False  # 5 tokens = the limit: truncated
    torch.testing.assert_close(overlong_mask(mask, max_len=5), expected)
    # An explicit flag wins over the length test (row 1 ended with EOS exactly at the limit; row 2 did not end).
    flagged = overlong_mask(mask, max_len=5, truncated=torch.tensor([False, False, True]))
    expected = mask.clone()
    expected[2] = False
    torch.testing.assert_close(flagged, expected)


def test_discounted_returns_match_hand_computation():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    dones = torch.tensor([[False, False, True], [False, True, False]])  # row 1: an episode ends at t=1
    # gamma 0.5. Row 0: [0.25, 0.5, 1]. Row 1: t=2 starts a new episode -> 1; t=1 ends -> 1; t=0: 1 + 0.5 * 1.
    got = discounted_returns(rewards, dones, gamma=0.5)
    torch.testing.assert_close(got, torch.tensor([[0.25, 0.5, 1.0], [1.5, 1.0, 1.0]]))


def test_discounted_returns_match_a_closed_form_reference():
    """Reference: G_t = sum_{s >= t, same episode} gamma^(s - t) r_s, built as an explicit [N, T, T] weight."""
    gen = torch.Generator().manual_seed(1)
    n, t, gamma = 4, 7, 0.9
    rewards = torch.randn(n, t, generator=gen)
    dones = torch.rand(n, t, generator=gen) < 0.3
    episode = torch.cat([torch.zeros(n, 1, dtype=torch.long), dones[:, :-1].long().cumsum(1)], dim=1)  # [N, T]
    steps = torch.arange(t)
    later = steps.view(1, t, 1) <= steps.view(1, 1, t)  # s >= t
    same = episode.unsqueeze(2) == episode.unsqueeze(1)  # [N, T, T]
    weight = torch.where(later & same, gamma ** (steps.view(1, 1, t) - steps.view(1, t, 1)).float(), 0.0)
    expected = (weight * rewards.unsqueeze(1)).sum(-1)
    torch.testing.assert_close(discounted_returns(rewards, dones, gamma), expected)


def test_padding_after_the_last_episode_changes_no_return():
    rewards = torch.tensor([[1.0, 2.0, 0.0, 0.0], [3.0, 0.0, 0.0, 0.0]])
    dones = torch.tensor([[False, True, False, False], [True, False, False, False]])
    valid = torch.tensor([[True, True, False, False], [True, False, False, False]])
    clean = discounted_returns(rewards, dones, gamma=0.9)
    for junk in (1e4, float("inf"), float("nan")):
        dirty = discounted_returns(torch.where(valid, rewards, torch.full_like(rewards, junk)), dones, gamma=0.9)
        torch.testing.assert_close(dirty[valid], clean[valid])
    torch.testing.assert_close(clean[valid], torch.tensor([1.0 + 0.9 * 2.0, 2.0, 3.0]))
