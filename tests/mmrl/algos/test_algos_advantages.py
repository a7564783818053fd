"""Advantage estimators: hand-computed values, monotonicity in the own reward, group-permutation equivariance."""

import math

import pytest
import torch

from mmrl.algos import ADVANTAGES, dr_grpo_advantages, grpo_advantages, reinforce_pp_advantages, rloo_advantages

# B=2 groups of G=4: one mixed group, one where every reward is equal.
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
SIGNS = torch.tensor([1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 0.0, 0.0])

# Every estimator (and grpo's scale options) as a callable with the trainer's call shape.
ESTIMATORS = {
    **{name: ADVANTAGES.get(name) for name in ADVANTAGES.names()},
    "grpo[batch]": lambda r, **kw: grpo_advantages(r, scale="batch", **kw),
    "grpo[none]": lambda r, **kw: grpo_advantages(r, scale="none", **kw),
}


def test_every_estimator_is_covered_here():
    assert set(ADVANTAGES.names()) == {"grpo", "dr_grpo", "rloo", "reinforce_pp"}


def test_grpo_scales_by_the_groups_std():
    # group 1: mean 0.5, deviations +-0.5, unbiased var = 4 * 0.25 / 3 = 1/3; group 2: all equal -> 0.
    got = grpo_advantages(REWARDS, group_size=4, scale_by_std=True, eps=1e-6)
    torch.testing.assert_close(got, SIGNS * 0.5 / (math.sqrt(1 / 3) + 1e-6))


def test_grpo_without_std_is_the_centred_reward():
    got = grpo_advantages(REWARDS, group_size=4, scale_by_std=False)
    torch.testing.assert_close(got, SIGNS * 0.5)


def test_grpo_batch_scale_divides_by_the_std_of_all_raw_rewards():
    # batch mean 1.25; squared deviations 0.0625 + 1.5625 + 1.5625 + 0.0625 + 4 * 0.5625 = 5.5; unbiased: 5.5 / 7.
    got = grpo_advantages(REWARDS, group_size=4, scale="batch", eps=0.0)
    torch.testing.assert_close(got, SIGNS * 0.5 / math.sqrt(5.5 / 7))


def test_grpo_scale_overrides_scale_by_std():
    got = grpo_advantages(REWARDS, group_size=4, scale_by_std=True, scale="none")
    torch.testing.assert_close(got, SIGNS * 0.5)


def test_dr_grpo_never_scales():
    for scale_by_std in (True, False):
        got = dr_grpo_advantages(REWARDS, group_size=4, scale_by_std=scale_by_std)
        torch.testing.assert_close(got, SIGNS * 0.5)


def test_rloo_subtracts_the_mean_of_the_other_rewards():
    # r=1: 1 - mean(0, 0, 1) = 2/3; r=0: 0 - mean(1, 0, 1) = -2/3; equal group: 2 - 2 = 0.
    got = rloo_advantages(REWARDS, group_size=4)
    torch.testing.assert_close(got, SIGNS * 2 / 3)


def test_reinforce_pp_normalises_group_centred_rewards_by_the_batch_std():
    # centred: +-0.5 in group 1, 0 in group 2; batch mean 0; unbiased var = 4 * 0.25 / 7 = 1/7.
    got = reinforce_pp_advantages(REWARDS, group_size=4, eps=0.0)
    torch.testing.assert_close(got, SIGNS * 0.5 / math.sqrt(1 / 7))


@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize("scale_by_std", [True, False])
def test_equal_rewards_give_zero_advantage_not_nan(name, scale_by_std):
    got = ESTIMATORS[name](torch.full((6,), 3.0), group_size=3, scale_by_std=scale_by_std, eps=1e-6)
    torch.testing.assert_close(got, torch.zeros(6))


@pytest.mark.parametrize("name", ESTIMATORS)
def test_advantages_sum_to_zero_within_each_group(name):
    rewards = torch.randn(12, generator=torch.Generator().manual_seed(0))
    got = ESTIMATORS[name](rewards, group_size=4, scale_by_std=True, eps=1e-6)
    torch.testing.assert_close(got.view(3, 4).sum(1), torch.zeros(3), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_permuting_groups_permutes_advantages(name):
    gen = torch.Generator().manual_seed(1)
    b, g = 5, 3
    rewards = torch.randn(b * g, generator=gen)
    group_perm = torch.randperm(b, generator=gen)
    row_perm = (group_perm.unsqueeze(1) * g + torch.arange(g)).reshape(-1)  # whole groups move
    fn = ESTIMATORS[name]
    torch.testing.assert_close(
        fn(rewards[row_perm], group_size=g, scale_by_std=True), fn(rewards, group_size=g, scale_by_std=True)[row_perm]
    )


@pytest.mark.parametrize("name", ESTIMATORS)
def test_permuting_within_a_group_permutes_advantages(name):
    gen = torch.Generator().manual_seed(2)
    rewards = torch.randn(8, generator=gen)
    row_perm = torch.cat([torch.randperm(4, generator=gen), 4 + torch.randperm(4, generator=gen)])
    fn = ESTIMATORS[name]
    torch.testing.assert_close(
        fn(rewards[row_perm], group_size=4, scale_by_std=True), fn(rewards, group_size=4, scale_by_std=True)[row_perm]
    )


@pytest.mark.parametrize("name", ESTIMATORS)
def test_raising_a_reward_raises_its_own_advantage(name):
    rewards = torch.tensor([0.1, 0.7, 0.4, 1.0, 0.2, 0.9])  # distinct, so no std is 0
    jac = torch.autograd.functional.jacobian(
        lambda r: ESTIMATORS[name](r, group_size=3, scale_by_std=True, eps=1e-6), rewards
    )  # [R, R]: d advantage_i / d reward_j
    assert (jac.diagonal() > 0).all()
    if name not in ("reinforce_pp", "grpo[batch]"):  # batch-scaled estimators couple groups through the std
        assert jac[:3, 3:].abs().max() == 0 and jac[3:, :3].abs().max() == 0


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_rejects_rewards_that_do_not_split_into_groups(name):
    with pytest.raises(ValueError, match="groups of 3"):
        ADVANTAGES.get(name)(torch.zeros(7), group_size=3, scale_by_std=True)


def test_rloo_needs_two_samples_per_group():
    with pytest.raises(ValueError, match="group_size >= 2"):
        rloo_advantages(torch.zeros(4), group_size=1)


def test_step_credit_estimators_are_registered_under_the_episode_names():
    from mmrl.algos import ADVANTAGES, STEP_ADVANTAGES

    # algo.advantage names both kinds; GiGPO alone exists only as step credit (the config asks for algo.credit step).
    assert set(STEP_ADVANTAGES.names()) - {"gigpo"} <= set(ADVANTAGES.names())
    # Two groups of G=2 over T=2 turns; world 3 ended after turn 0.
    returns = torch.tensor([[1.0, 0.5], [0.0, 0.0], [2.0, 1.0], [0.0, 9.0]])
    active = torch.tensor([[True, True], [True, True], [True, True], [True, False]])
    dr = STEP_ADVANTAGES.get("dr_grpo")(returns, active, group_size=2)
    # Turn 0: (1, 0) -> +-0.5, (2, 0) -> +-1. Turn 1: (0.5, 0) -> +-0.25; the second group has one active world: 0.
    torch.testing.assert_close(dr, torch.tensor([[0.5, 0.25], [-0.5, -0.25], [1.0, 0.0], [-1.0, 0.0]]))
    # Dr. GRPO never scales, whatever scale_by_std says; GRPO's step credit does.
    torch.testing.assert_close(STEP_ADVANTAGES.get("dr_grpo")(returns, active, group_size=2, scale_by_std=True), dr)
    grpo = STEP_ADVANTAGES.get("grpo")(returns, active, group_size=2, scale_by_std=True)
    assert grpo[0, 0] == pytest.approx(0.5 / (0.5**0.5), rel=1e-4)  # unbiased std of (1, 0) is sqrt(0.5)


# ---------------------------------------------------------------------------------------------- GiGPO


def test_gigpo_by_hand_on_one_group_with_a_shared_anchor_state():
    """Two worlds of one group (G = 2), two turns. Both start from state 7; world 0 then sees state 8, world 1 state 7
    again (it came back). Returns-to-go: world 0 [1, 1], world 1 [0, 0]."""
    from mmrl.algos.advantages import gigpo_advantages

    returns = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    active = torch.ones(2, 2, dtype=torch.bool)
    keys = torch.tensor([[7, 8], [7, 7]])
    out = gigpo_advantages(returns, active, 2, scale_by_std=False, state_keys=keys, step_weight=0.5)
    # Episode part (GRPO over [1, 0], no scaling): +0.5, -0.5 on every turn.
    # Step groups: state 7 holds (w0,t0)=1, (w1,t0)=0, (w1,t1)=0 -> mean 1/3; state 8 holds one turn -> 0.
    step = torch.tensor([[1 - 1 / 3, 0.0], [-1 / 3, -1 / 3]])
    torch.testing.assert_close(out, torch.tensor([[0.5, 0.5], [-0.5, -0.5]]) + 0.5 * step)


def test_gigpo_scaled_step_part_and_padding():
    from mmrl.algos.advantages import gigpo_advantages, grpo_advantages

    g = torch.Generator().manual_seed(0)
    returns = torch.randn(4, 3, generator=g)
    active = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    keys = torch.tensor([[1, 2, 3], [1, 2, 9], [1, 5, 6], [1, 9, 9]])  # group 0: worlds 0-1; group 1: worlds 2-3
    out = gigpo_advantages(returns, active, 2, state_keys=keys, step_weight=1.0)
    episode = grpo_advantages(returns[:, 0], group_size=2)
    # World 0 turn 1 and world 1 turn 1 share state 2 in group 0: a two-member step group, scaled by its std.
    pair = returns[[0, 1], 1]
    want = (pair - pair.mean()) / (pair.std() + 1e-6)
    torch.testing.assert_close(out[[0, 1], 1], episode[[0, 1]] + want)
    # Turn 0's anchor (state 1 in each group) is its two worlds' first turns; state 1 in group 1 is another group.
    first = returns[[2, 3], 0]
    torch.testing.assert_close(out[[2, 3], 0], episode[[2, 3]] + (first - first.mean()) / (first.std() + 1e-6))
    assert out[~active].abs().sum() == 0
    torch.testing.assert_close(out[0, 2], episode[0])  # a lone state: the episode part only
    with pytest.raises(ValueError, match="state key"):
        gigpo_advantages(returns, active, 2)
