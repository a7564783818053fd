"""Answer keys, inline options and their shuffles, reasoning, and ACRE's consistency-verified reward."""

import pytest
import torch

from rewards.consistency import (
    answer_keys,
    consistency_verified_reward,
    reasoning_of,
    shuffled_question,
    split_options,
)


def test_answer_keys_read_letters_or_normalised_text():
    texts = ["<answer>B</answer>", "The answer is (b).", "no idea", "<think>A?</think><answer> c </answer>"]
    assert answer_keys(texts, "choice") == ["B", "B", None, "C"]
    texts = ["<answer>Red  Car</answer>", "<answer>red car</answer>", "<answer> </answer>", "<think>x</think>blue"]
    assert answer_keys(texts, "text") == ["red car", "red car", None, "blue"]
    with pytest.raises(ValueError, match="kind"):
        answer_keys(["x"], "number")  # type: ignore[arg-type]


def test_split_options_and_shuffle_round_trip():
    question = "Which shape is red? (A) circle (B) square (C) triangle"
    stem, options = split_options(question)
    assert (stem, options) == ("Which shape is red?", ["circle", "square", "triangle"])
    assert shuffled_question(stem, options, [0, 1, 2]) == question
    assert shuffled_question(stem, options, [2, 0, 1]) == "Which shape is red? (A) triangle (B) circle (C) square"
    with pytest.raises(ValueError, match="permutation"):
        shuffled_question(stem, options, [0, 0, 1])


@pytest.mark.parametrize("question", ["What colour is it?", "Pick (A) one", "Pick (B) x (A) y", "Pick (A) x (C) y"])
def test_split_options_refuses_questions_without_ordered_options(question):
    with pytest.raises(ValueError, match="options"):
        split_options(question)


def test_reasoning_is_the_think_block_or_the_text_before_the_answer():
    assert reasoning_of("<think> it is round </think><answer>A</answer>") == "it is round"
    assert reasoning_of("It is round, so A. <answer>A</answer>") == "It is round, so A."
    assert reasoning_of("<answer>A</answer>") == ""
    assert reasoning_of("just text") == "just text"


def test_consistency_verified_reward_matches_the_four_cases():
    first_correct = torch.tensor([True, True, False, False])
    consistent = torch.tensor([True, False, True, False])
    torch.testing.assert_close(
        consistency_verified_reward(first_correct, consistent, partial=0.25), torch.tensor([1.0, 0.25, 0.0, 0.0])
    )
    with pytest.raises(ValueError, match="partial"):
        consistency_verified_reward(first_correct, consistent, partial=1.5)
