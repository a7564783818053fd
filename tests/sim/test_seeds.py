"""Seed ranges: every run seed's training worlds are its own and stay clear of demonstrations and held-out worlds."""

import pytest

from sim.seeds import (
    DEMO_SEED_BASE,
    EVAL_SEED_BASE,
    SFT_SEED_BASE,
    TRAIN_SEED_STRIDE,
    TRAIN_SEEDS,
    demo_seed_base,
    eval_seeds,
    train_seeds,
)


def test_every_run_seed_trains_below_the_warm_start_demonstration_and_held_out_worlds():
    last_step = TRAIN_SEED_STRIDE // 16 - 1  # the last step a run of 16 prompts a step can take
    ranges = []
    for seed in range(TRAIN_SEEDS):
        first = train_seeds(0, 16, 2, seed=seed)
        last = train_seeds(last_step, 16, 2, seed=seed)
        assert first[0] == first[1] and len(first) == 32  # groups of G equal seeds
        ranges.append((first[0], last[-1]))
    assert ranges[-1][1] < SFT_SEED_BASE < DEMO_SEED_BASE < EVAL_SEED_BASE == eval_seeds(1)[0]
    for (_, end), (start, _) in zip(ranges, ranges[1:]):
        assert end < start  # disjoint, in order


@pytest.mark.parametrize("seed", [-1, TRAIN_SEEDS, 1234])
def test_a_run_seed_without_a_range_is_refused(seed):
    with pytest.raises(ValueError, match="trainer.seed"):
        train_seeds(0, 16, 2, seed=seed)


def test_a_run_that_would_use_up_its_range_is_refused():
    with pytest.raises(ValueError, match="beyond"):
        train_seeds(TRAIN_SEED_STRIDE // 16, 16, 2, seed=3)


def test_demonstrations_stay_below_the_held_out_worlds():
    assert demo_seed_base(3, 512, 16) == DEMO_SEED_BASE + 3 * 512
    last = demo_seed_base(TRAIN_SEEDS - 1, 2048, 64) + 2048 + 64  # the largest preset cold start (svg), last seed
    assert last <= EVAL_SEED_BASE
    with pytest.raises(ValueError, match="held-out"):
        demo_seed_base(1, (EVAL_SEED_BASE - DEMO_SEED_BASE) // 2, 16)


def test_no_two_random_streams_of_a_step_share_a_seed():
    from sim.seeds import critic_seed, image_mask_seed, mini_batch_seed, sampling_seed

    # Before each stream had a named function, the mini-batch order and PAPO's mask of step 0 were seeded with the
    # same integer as the step's completions (seed * 1_000_003 + step).
    for seed in (0, 3):
        for step in (0, 1, 7):
            drawn = [sampling_seed(seed, step), mini_batch_seed(seed, step), critic_seed(seed)] + [
                image_mask_seed(seed, step, rank) for rank in range(3)
            ]
            assert len(set(drawn)) == len(drawn)
    assert mini_batch_seed(0, 1) != mini_batch_seed(0, 2) and mini_batch_seed(0, 1) != mini_batch_seed(1, 1)
