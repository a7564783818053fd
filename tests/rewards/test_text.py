import pytest
import torch

from rewards import REWARDS, format_reward


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
