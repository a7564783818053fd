"""TTRV's vote rewards, GRPO-CARE's consistency bonus and EMA step, checked against values computed by hand."""

import math

import pytest
import torch

from mmrl.algos.advantages import grpo_advantages
from mmrl.algos.consistency import care_bonus, ema_update_, vote_rewards


def test_vote_rewards_match_hand_computation():
    # B=2 groups of G=4. Group 0: answers 0, 0, 0, 1. Group 1: 2, 3, -1 (unreadable), 2.
    answers = torch.tensor([0, 0, 0, 1, 2, 3, -1, 2])
    rewards, vote, certainty = vote_rewards(answers, group_size=4, entropy_coef=0.5)
    torch.testing.assert_close(vote, torch.tensor([0.75, 0.75, 0.75, 0.25, 0.5, 0.25, 0.0, 0.5]))
    c = lambda p: 1 + math.log(p) / math.log(4)  # noqa: E731
    expected_certainty = torch.tensor([c(0.75), c(0.75), c(0.75), 0.0, 0.5, 0.0, 0.0, 0.5])
    torch.testing.assert_close(certainty, expected_certainty)
    torch.testing.assert_close(rewards, vote + 0.5 * expected_certainty)


def test_certainty_averages_to_one_minus_the_normalised_entropy():
    # Every sample answers: the group mean of the certainty term is 1 - H(p) / log G (the paper's low-entropy bonus).
    answers = torch.tensor([0, 0, 1, 2, 2, 2])  # one group of G=6: p = 2/6, 1/6, 3/6
    _, _, certainty = vote_rewards(answers, group_size=6, entropy_coef=1.0)
    p = torch.tensor([2 / 6, 1 / 6, 3 / 6])
    entropy = -(p * p.log()).sum()
    torch.testing.assert_close(certainty.mean(), 1 - entropy / math.log(6))


def test_unanimous_group_has_full_vote_and_certainty_and_zero_advantage():
    rewards, vote, certainty = vote_rewards(torch.tensor([4, 4, 4]), group_size=3)
    torch.testing.assert_close(vote, torch.ones(3))
    torch.testing.assert_close(certainty, torch.ones(3))
    torch.testing.assert_close(grpo_advantages(rewards, group_size=3), torch.zeros(3))


def test_majority_answer_gets_the_positive_advantage():
    rewards, _, _ = vote_rewards(torch.tensor([7, 7, 7, 9]), group_size=4)
    advantages = grpo_advantages(rewards, group_size=4)
    assert (advantages[:3] > 0).all() and advantages[3] < 0


def test_answer_ids_only_compare_within_a_group_and_permuting_groups_permutes_rewards():
    gen = torch.Generator().manual_seed(0)
    answers = torch.randint(-1, 3, (5 * 4,), generator=gen)
    rewards, _, _ = vote_rewards(answers, group_size=4)
    perm = torch.randperm(5, generator=gen)
    permuted, _, _ = vote_rewards(answers.view(5, 4)[perm].reshape(-1), group_size=4)
    torch.testing.assert_close(permuted, rewards.view(5, 4)[perm].reshape(-1))


def test_vote_rewards_refuse_bad_arguments():
    with pytest.raises(ValueError, match="groups of 3"):
        vote_rewards(torch.zeros(4, dtype=torch.long), group_size=3)
    with pytest.raises(ValueError, match="entropy_coef"):
        vote_rewards(torch.zeros(3, dtype=torch.long), group_size=3, entropy_coef=-1.0)


def test_care_bonus_goes_to_correct_samples_above_their_correct_peers_mean():
    # Group 0: correct samples 0, 1, 3 with consistency 0.9, 0.3, 0.6 -> mean 0.6; only sample 0 beats it (sample 2 is
    # more consistent still, but wrong). Group 1: a single correct sample -> no peers, no bonus.
    consistency = torch.tensor([0.9, 0.3, 0.95, 0.6, 0.8, 0.1, 0.2, 0.3])
    correct = torch.tensor([True, True, False, True, True, False, False, False])
    bonus = care_bonus(consistency, correct, group_size=4, coef=0.5)
    torch.testing.assert_close(bonus, torch.tensor([0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]))


def test_care_bonus_ignores_float_noise_between_equal_completions():
    consistency = torch.tensor([0.5, 0.5 + 1e-7, 0.5 - 1e-7, 0.2])  # three copies of one completion, one worse
    correct = torch.tensor([True, True, True, False])
    torch.testing.assert_close(care_bonus(consistency, correct, group_size=4, coef=1.0), torch.zeros(4))
    torch.testing.assert_close(
        care_bonus(consistency, correct, group_size=4, coef=1.0, tol=0.0), torch.tensor([0.0, 1.0, 0.0, 0.0])
    )


def test_care_bonus_is_zero_when_off_and_refuses_negative_coef():
    consistency, correct = torch.tensor([0.9, 0.1]), torch.tensor([True, True])
    torch.testing.assert_close(care_bonus(consistency, correct, group_size=2, coef=0.0), torch.zeros(2))
    with pytest.raises(ValueError, match="coef"):
        care_bonus(consistency, correct, group_size=2, coef=-0.1)


def test_ema_update_moves_the_target_by_one_minus_decay():
    target, source = (
        [torch.tensor([1.0, 2.0]), torch.tensor([[0.0]])],
        [torch.tensor([3.0, 2.0]), torch.tensor([[4.0]])],
    )
    ema_update_(target, source, decay=0.75)
    torch.testing.assert_close(target[0], torch.tensor([1.5, 2.0]))
    torch.testing.assert_close(target[1], torch.tensor([[1.0]]))
    ema_update_(target, source, decay=0.0)  # decay 0 copies the source
    torch.testing.assert_close(target[0], source[0])
    with pytest.raises(ValueError, match="decay"):
        ema_update_(target, source, decay=1.5)
