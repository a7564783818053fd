import math
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards import ACTION_KINDS, REWARDS, Action, action_match_reward, action_type_reward, parse_action, parse_actions

NAN = math.nan

# --------------------------------------------------------------------------------------------------------------------
# parse_action: accepted forms
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "args"),
    [
        ("click(120, 340)", "click", {"x": 120.0, "y": 340.0}),
        ("CLICK( 1.5 , 2 )", "click", {"x": 1.5, "y": 2.0}),
        ("click(x=10, y=20)", "click", {"x": 10.0, "y": 20.0}),
        ("click([10, 20])", "click", {"x": 10.0, "y": 20.0}),
        ("tap(point=(10, 20))", "click", {"x": 10.0, "y": 20.0}),
        ("click(start_box='<|box_start|>(235,512)<|box_end|>')", "click", {"x": 235.0, "y": 512.0}),  # UI-TARS
        ("click(start_box='(10,10,20,30)')", "click", {"x": 15.0, "y": 20.0}),  # a box: its centre
        ("long_press(3, 4)", "long_press", {"x": 3.0, "y": 4.0}),
        ('type("hello, world")', "type", {"text": "hello, world"}),
        ("type(text='it\\'s (fine)')", "type", {"text": "it's (fine)"}),
        ("type(content='abc')", "type", {"text": "abc"}),
        ("input_text(hello)", "type", {"text": "hello"}),
        ("scroll(down)", "scroll", {"direction": "down"}),
        ('scroll(direction="UP")', "scroll", {"direction": "up"}),
        ("scroll(500, 500, 'left')", "scroll", {"direction": "left"}),
        ("press(back)", "press", {"key": "back"}),
        ("press(key='Enter')", "press", {"key": "enter"}),
        ("press(return)", "press", {"key": "enter"}),
        ("press_home()", "press", {"key": "home"}),
        ("navigate_back()", "press", {"key": "back"}),
        ("finish()", "finish", {}),
        ('finish("42 apples")', "finish", {"answer": "42 apples"}),
        ("finish(answer='yes')", "finish", {"answer": "yes"}),
        # UI-R1 JSON style, and its Python-dict and single-object variants.
        ('[{"action": "click", "coordinate": [1, 2]}]', "click", {"x": 1.0, "y": 2.0}),
        ('{"action": "long_press", "x": 5, "y": 6}', "long_press", {"x": 5.0, "y": 6.0}),
        ("{'action_type': 'type', 'text': 'x'}", "type", {"text": "x"}),
        ('{"action": "type", "text": "click(1, 2) \\u00e9"}', "type", {"text": "click(1, 2) \u00e9"}),
        ('{"action": "scroll", "direction": "right"}', "scroll", {"direction": "right"}),
        ('{"action": "navigate_back"}', "press", {"key": "back"}),
        ('{"action": "press", "key": "home"}', "press", {"key": "home"}),
        ('{"action_type": "status", "goal_status": "successful"}', "finish", {}),
        ('{"action": "finish", "answer": "Paris"}', "finish", {"answer": "Paris"}),
        # Where the action sits in a longer completion.
        ("<think>I should click(1, 1)</think><answer>click(5, 6)</answer>", "click", {"x": 5.0, "y": 6.0}),
        ("Thought: type('a') first? No.\nAction: click(7, 8)", "click", {"x": 7.0, "y": 8.0}),
        ("I will click the OK button: click(9, 9)", "click", {"x": 9.0, "y": 9.0}),
    ],
)
def test_parse_action_accepts(text, kind, args):
    assert parse_action(text) == Action(kind, args, "")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no action found"),
        ("I would click the button.", "no action found"),  # prose without a call
        ("click(1", "unclosed parenthesis after click"),
        ("click(up)", "click has no valid point"),
        ("click(nan, 2)", "click has no valid point"),
        ("type()", "type has no text"),
        ("scroll(sideways)", "scroll has no direction among up, down, left, right"),
        ("press()", "press has no key"),
        ('{"action": "fly"}', "unknown action 'fly'"),
        ('{"action": "click"', "unclosed JSON object"),
        ("{not json at all}", "not a JSON action object"),
        ("<think>click(1, 2)</think>", "no action found"),  # only thought about it
    ],
)
def test_parse_action_rejects_with_reason(text, reason):
    assert parse_action(text) == Action(None, {}, reason)


def test_parse_action_non_string_and_batches():
    assert parse_action(None) == Action(None, {}, "input is not a string")  # type: ignore[arg-type]
    assert [a.kind for a in parse_actions(["click(1, 2)", "finish()", "?"])] == ["click", "finish", None]


FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None)
PIECES = [
    "click", "long_press", "type", "scroll", "press", "finish", "press_back", "(", ")", "[", "]", "{", "}", ",", "=",
    "'", '"', "\\", "x", "y", "1", "2.5", "-3", "nan", "up", "back", "text", ": ", '"action"', '"coordinate"',
    "<answer>", "</answer>", "<think>", "</think>", "Action:", "<|box_start|>", " ",
]  # fmt: skip


@FUZZ
@given(st.one_of(st.text(), st.lists(st.sampled_from(PIECES), max_size=40).map("".join)))
def test_fuzz_parse_action_never_raises(text):
    got = parse_action(text)
    assert isinstance(got, Action)
    if got.kind is None:
        assert got.reason and got.args == {}
    else:
        assert got.kind in ACTION_KINDS and got.reason == ""
        if got.kind in ("click", "long_press"):
            assert set(got.args) == {"x", "y"} and all(math.isfinite(v) for v in got.args.values())


@pytest.mark.parametrize(
    "text",
    [
        "click(" * 100_000,
        "(" * 200_000,
        "[{" * 100_000,
        "'" * 200_000,
        '{"action": "' + "a" * 200_000,
        "type(" + "\\" * 200_000,
    ],
)
def test_parse_action_stays_fast_on_adversarial_input(text):
    start = time.perf_counter()
    got = parse_action(text)
    assert got.kind is None or got.reason == ""
    assert time.perf_counter() - start < 2.0


# --------------------------------------------------------------------------------------------------------------------
# Rewards
# --------------------------------------------------------------------------------------------------------------------


def test_action_rewards_are_registered():
    assert REWARDS.get("action_type") is action_type_reward
    assert REWARDS.get("action_match") is action_match_reward


def test_action_type_reward_by_hand():
    completions = ["click(1, 2)", "type('a')", "nothing", "scroll(up)"]
    targets = ['{"action": "click", "coordinate": [9, 9]}', "click(1, 2)", "finish()", None]
    got = action_type_reward(completions, targets)
    torch.testing.assert_close(got, torch.tensor([1.0, 0.0, 0.0, NAN]), equal_nan=True)


def test_action_match_reward_by_hand():
    completions = [
        "click(100, 100)",  # 5 px from the target point: within the default 14 px
        "click(100, 130)",  # 25 px off
        "click(100, 130)",  # but inside this row's target box
        "type('Hello  World!')",  # same text after normalisation
        "type('hello')",
        "scroll(down)",
        "scroll(up)",
        "press(back)",
        "finish('Paris')",
        "finish('Lyon')",
        "finish()",
        "long_press(100, 105)",  # right point, wrong kind
        "click(1, 1)",
    ]
    targets = [
        "click(103, 104)",
        "click(100, 105)",
        "click(100, 105)",
        "type('hello world')",
        "type('goodbye')",
        "scroll(down)",
        "scroll(down)",
        "press_back()",
        "finish('paris')",
        "finish('Paris')",
        "finish()",
        "click(100, 105)",
        None,
    ]
    boxes = torch.full((13, 4), NAN)
    boxes[2] = torch.tensor([90.0, 90.0, 110.0, 140.0])
    got = action_match_reward(completions, targets, target_box=boxes)
    expected = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, NAN])
    torch.testing.assert_close(got, expected, equal_nan=True)
    # Without boxes, row 2 falls back to the radius; a wider radius lets row 1 hit.
    no_box = action_match_reward(completions, targets)
    assert no_box[2] == 0.0
    assert action_match_reward(completions, targets, click_radius=30.0)[1] == 1.0


def test_action_rewards_reject_bad_targets():
    with pytest.raises(ValueError, match=r"target_action\[0\] = 'fly\(\)' is no action"):
        action_type_reward(["click(1, 2)"], ["fly()"])
    with pytest.raises(ValueError, match="1 completions and 2 target actions"):
        action_match_reward(["click(1, 2)"], ["click(1, 2)", None])
