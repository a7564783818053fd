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


def test_the_validation_split_lies_between_the_warm_start_and_the_demonstration_worlds():
    from sim.seeds import VALIDATION_SEED_BASE, seed_split, split_seeds, validation_seeds

    assert SFT_SEED_BASE + 10**8 <= validation_seeds(1)[0] == VALIDATION_SEED_BASE
    assert validation_seeds(3, first=2) == [VALIDATION_SEED_BASE + i for i in (2, 3, 4)]
    assert validation_seeds(DEMO_SEED_BASE - VALIDATION_SEED_BASE)[-1] == DEMO_SEED_BASE - 1
    with pytest.raises(ValueError, match="demonstrations"):
        validation_seeds(DEMO_SEED_BASE - VALIDATION_SEED_BASE + 1)
    assert split_seeds("test", 4) == eval_seeds(4) and split_seeds("validation", 2) == validation_seeds(2)
    with pytest.raises(ValueError, match="split must be one of test, validation, got 'eval'"):
        split_seeds("eval", 1)
    # Each range's split: training (and the warm start's, the demonstrations') worlds train; the rest evaluate.
    last_train = train_seeds(TRAIN_SEED_STRIDE // 16 - 1, 16, 1, seed=TRAIN_SEEDS - 1)[-1]
    for seed, split in [(0, "train"), (last_train, "train"), (SFT_SEED_BASE, "train"), (DEMO_SEED_BASE, "train"),
                        (DEMO_SEED_BASE - 1, "validation"), (VALIDATION_SEED_BASE, "validation"),
                        (EVAL_SEED_BASE - 1, "train"), (EVAL_SEED_BASE, "test"), (EVAL_SEED_BASE + 10**6, "test")]:  # fmt: skip
        assert seed_split(seed) == split, seed


def test_libero_plays_validation_seeds_on_the_training_states_and_test_seeds_on_the_held_out_ones():
    from sim.robotics.libero import LiberoEnv
    from sim.seeds import validation_seeds

    held = LiberoEnv.__new__(LiberoEnv)  # the mapping only: no LIBERO, no worlds needed
    held.tasks, held._train_states, held._eval_states = [3, 5], list(range(40)), list(range(40, 50))
    assert [held.episode(s) for s in validation_seeds(5)] == [(3, 0), (5, 0), (3, 1), (5, 1), (3, 2)]
    assert {held.episode(s)[1] for s in validation_seeds(200)} == set(range(40))  # never a test state
    assert [held.episode(s) for s in eval_seeds(3)] == [(3, 40), (5, 40), (3, 41)]
