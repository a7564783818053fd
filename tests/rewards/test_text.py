import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards import (
    REWARDS,
    exact_match,
    format_reward,
    length_penalty,
    length_penalty_reward,
    multiple_choice,
    normalize_answer,
    numeric_match,
)

NAN = math.nan


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>[1, 2, 3, 4]</answer>", 1.0),
        ("  \n<answer>[1, 2, 3, 4]</answer>\n", 1.0),  # whitespace around the tag is fine
        ("<think>the cat is left</think>\n<answer>[1, 2, 3, 4]</answer>", 1.0),
        ("I reasoned.</think><answer>[1, 2, 3, 4]</answer>", 1.0),  # think opened by the chat template
        ('<ANSWER>{"bbox_2d": [1, 2, 3, 4], "label": "cat"}</ANSWER>', 1.0),
        ("<answer>The box is [1, 2, 3, 4].</answer>", 1.0),  # a box inside the tag is enough
        ("Sure! <answer>[1, 2, 3, 4]</answer>", 0.0),  # text before the tag
        ("<answer>[1, 2, 3, 4]</answer> done", 0.0),  # text after the tag
        ("<answer>[1, 2, 3, 4]</answer><answer>[1, 2, 3, 4]</answer>", 0.0),  # two answers
        ("<answer>[1, 2, 3, 4]", 0.0),  # unterminated
        ("[1, 2, 3, 4]", 0.0),  # no tag
        ("<answer>[1, 2, 3]</answer>", 0.0),  # tag but no valid box
        ("<answer>[1, 2, 1, 4]</answer>", 0.0),  # degenerate box
        ("<answer></answer>", 0.0),
        ("<think>[1, 2, 3, 4] <answer>[1, 2, 3, 4]</answer>", 0.0),  # never stopped thinking
        ("<answer>[1, 2, 3, 4]</answer></think>", 0.0),  # everything before the first </think> is thinking
        ("<think>a</think><answer>[1, 2, 3, 4]</answer></think>", 0.0),  # stray tag left outside the answer
        ("", 0.0),
    ],
)
def test_format_reward_with_answer_tag(text, expected):
    torch.testing.assert_close(format_reward([text]), torch.tensor([expected]))


def test_format_reward_without_answer_tag_needs_only_a_parsable_box():
    texts = ["[1, 2, 3, 4]", "<think>hm</think>(1,2),(3,4)", "<answer>[1,2,3,4]</answer>", "[1, 2, 3]", "no box", ""]
    got = format_reward(texts, require_answer_tag=False)
    torch.testing.assert_close(got, torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]))


def test_format_reward_batches_and_handles_empty_input():
    got = format_reward(["<answer>[0,0,1,1]</answer>", "x", "<answer>[0,0,1,1]</answer>"])
    assert got.dtype == torch.float32 and got.shape == (3,)
    torch.testing.assert_close(got, torch.tensor([1.0, 0.0, 1.0]))
    assert format_reward([]).shape == (0,)


def test_format_reward_is_registered():
    assert REWARDS.get("format") is format_reward


def test_text_rewards_are_registered():
    assert REWARDS.get("exact_match") is exact_match
    assert REWARDS.get("multiple_choice") is multiple_choice
    assert REWARDS.get("numeric_match") is numeric_match
    assert REWARDS.get("length_penalty") is length_penalty_reward


# --------------------------------------------------------------------------------------------------------------------
# exact_match
# --------------------------------------------------------------------------------------------------------------------


def test_normalize_answer():
    assert normalize_answer("  The Eiffel-Tower! ") == "eiffeltower"
    assert normalize_answer("A  cat,\tan owl") == "cat owl"


def test_exact_match_by_hand():
    completions = [
        "<think>hmm</think><answer>The Eiffel Tower.</answer>",
        "eiffel tower",
        "Paris",
        "<answer>Paris</answer>",
        "anything",
        "NYC",
    ]
    answer = ["Eiffel Tower", "Eiffel Tower", "Eiffel Tower", ["paris", "Paris, France"], None, ["New York", "NYC"]]
    got = exact_match(completions, answer)
    torch.testing.assert_close(got, torch.tensor([1.0, 1.0, 0.0, 1.0, NAN, 1.0]), equal_nan=True)
    strict = exact_match(["The Eiffel Tower.", " Eiffel Tower "], ["Eiffel Tower", "Eiffel Tower"], normalize=False)
    torch.testing.assert_close(strict, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="2 completions and 1 answers"):
        exact_match(["a", "b"], ["a"])


# --------------------------------------------------------------------------------------------------------------------
# multiple_choice
# --------------------------------------------------------------------------------------------------------------------


def test_multiple_choice_by_hand():
    completions = ["(B)", "B.", "answer: b", "<answer>B</answer>", "The answer is C.", "no idea", "A"]
    answer = ["B", "B", "(b)", "B", "B", "B", None]
    got = multiple_choice(completions, answer)
    torch.testing.assert_close(got, torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, NAN]), equal_nan=True)
    with pytest.raises(ValueError, match=r"answer\[0\] = 'Z' is no choice"):
        multiple_choice(["A"], ["Z"])


# --------------------------------------------------------------------------------------------------------------------
# numeric_match
# --------------------------------------------------------------------------------------------------------------------


def test_numeric_match_by_hand():
    completions = [
        "The total is 1,234.",
        "<answer>-2.5e3</answer>",
        "45%",
        "0.45",
        "about 100",
        "seven",
        "3.0",
        "x",
    ]
    answer = ["1234", -2500.0, "0.45", "45%", "101", "7", 3, None]
    got = numeric_match(completions, answer)
    torch.testing.assert_close(got, torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, NAN]), equal_nan=True)


def test_numeric_match_tolerances():
    completions = ["104", "106", "0.0000001"]
    answer = ["100", "100", "0"]
    # ChartQA relaxed accuracy: 5% of the target.
    torch.testing.assert_close(numeric_match(completions, answer, rel_tol=0.05), torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(numeric_match(completions, answer, abs_tol=1e-6), torch.tensor([0.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="holds no number"):
        numeric_match(["1"], ["one"])


# --------------------------------------------------------------------------------------------------------------------
# length_penalty
# --------------------------------------------------------------------------------------------------------------------


def test_length_penalty_by_hand():
    lengths = torch.tensor([0, 100, 150, 200, 1000])
    got = length_penalty(lengths, target_length=100, max_length=200)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    with pytest.raises(ValueError, match="max_length > target_length"):
        length_penalty(lengths, target_length=10, max_length=10)


def test_length_penalty_reward_uses_token_lengths_when_given():
    completions = ["x" * 5, "x" * 15, "x" * 30]
    torch.testing.assert_close(
        length_penalty_reward(completions, target_length=10, max_length=20), torch.tensor([0.0, -0.5, -1.0])
    )
    tokens = torch.tensor([20, 10, 12])
    torch.testing.assert_close(
        length_penalty_reward(completions, target_length=10, max_length=20, completion_lengths=tokens),
        torch.tensor([-1.0, 0.0, -0.2]),
    )


# --------------------------------------------------------------------------------------------------------------------
# fuzz: rewards over arbitrary completions never raise and stay in {0, 1}
# --------------------------------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.text(max_size=60), min_size=1, max_size=4))
def test_fuzz_text_rewards_on_arbitrary_completions(completions):
    n = len(completions)
    for got in (
        multiple_choice(completions, ["B"] * n),
        numeric_match(completions, ["12.5"] * n),
        exact_match(completions, ["a cat"] * n),
    ):
        assert got.shape == (n,) and bool(((got == 0) | (got == 1)).all())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>the red one</think><answer>[1, 2, 3, 4]</answer>", 1.0),
        ("  <think>a\nb</think>\n\n<answer>B</answer>\n", 1.0),
        ("<answer>B</answer>", 0.0),  # no reasoning
        ("<think>a</think>", 0.0),  # no answer
        ("<think> </think><answer>B</answer>", 0.0),  # empty reasoning
        ("<think>a</think><answer>B</answer> and more", 0.0),  # text after the answer
        ("<answer>B</answer><think>a</think>", 0.0),  # wrong order
        ("<think>a</think><answer>B</answer><answer>C</answer>", 0.0),  # two answers
        ("<think>a<think>b</think><answer>C</answer>", 0.0),  # nested think
    ],
)
def test_think_answer_format_by_hand(text, expected):
    from rewards.text import think_answer_format_reward

    assert think_answer_format_reward([text]).tolist() == [expected]
