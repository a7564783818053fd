import ast
import math
from pathlib import Path

import pytest
import torch

import rewards
from rewards import REWARDS, BoundReward, RewardSpec, build_reward_fns, combine

NAN = math.nan

# --------------------------------------------------------------------------------------------------------------------
# combine
# --------------------------------------------------------------------------------------------------------------------


def test_combine_is_the_weighted_sum_when_everything_applies():
    components = {"iou": torch.tensor([1.0, 0.5, 0.0]), "format": torch.tensor([1.0, 0.0, 1.0])}
    got = combine(components, {"iou": 1.0, "format": 0.1})
    torch.testing.assert_close(got, torch.tensor([1.1, 0.5, 0.1]))


def test_combine_renormalises_over_applicable_components_by_hand():
    components = {
        "iou": torch.tensor([0.5, NAN, 0.5, NAN]),  # weight 1
        "answer": torch.tensor([NAN, 1.0, 1.0, NAN]),  # weight 3
    }
    got = combine(components, {"iou": 1.0, "answer": 3.0})
    # Row 0: only iou applies: 1 * 0.5 scaled by (1 + 3) / 1 = 2.0.
    # Row 1: only answer applies: 3 * 1.0 scaled by 4 / 3 = 4.0.
    # Row 2: both: 1 * 0.5 + 3 * 1.0 = 3.5, no scaling.
    # Row 3: nothing applies: NaN.
    torch.testing.assert_close(got, torch.tensor([2.0, 4.0, 3.5, NAN]), equal_nan=True)


def test_combine_with_a_negative_weight_and_zero_weight():
    components = {"hit": torch.tensor([1.0, NAN, 1.0]), "long": torch.tensor([1.0, 1.0, NAN])}
    got = combine(components, {"hit": 1.0, "long": -0.5})
    # Row 0: 1 - 0.5 = 0.5. Row 1: -0.5 * 1.5 / 0.5 = -1.5. Row 2: 1 * 1.5 / 1 = 1.5.
    torch.testing.assert_close(got, torch.tensor([0.5, -1.5, 1.5]))
    only_zero = combine({"a": torch.tensor([1.0, NAN]), "b": torch.tensor([NAN, 1.0])}, {"a": 1.0, "b": 0.0})
    torch.testing.assert_close(only_zero, torch.tensor([1.0, NAN]), equal_nan=True)  # b carries no weight


def test_combine_keeps_wider_dtypes_and_refuses_bad_input():
    got = combine({"a": torch.tensor([1, 0])}, {"a": 2.0})  # integer scores
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor([2.0, 0.0]))
    assert combine({"a": torch.tensor([0.5], dtype=torch.float64)}, {"a": 1.0}).dtype == torch.float64
    with pytest.raises(ValueError, match="at least one"):
        combine({}, {})
    with pytest.raises(ValueError, match=r"components without weight: \['b'\]; weights without component: \['c'\]"):
        combine({"a": torch.zeros(2), "b": torch.zeros(2)}, {"a": 1.0, "c": 1.0})
    with pytest.raises(ValueError, match=r"must all be \[R\]"):
        combine({"a": torch.zeros(2), "b": torch.zeros(3)}, {"a": 1.0, "b": 1.0})


# --------------------------------------------------------------------------------------------------------------------
# Specs, registry, binding
# --------------------------------------------------------------------------------------------------------------------


def test_unknown_reward_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown reward 'box_iuo'; registered: ") as err:
        build_reward_fns([RewardSpec("box_iuo")])
    for name in ("box_iou", "format", "exact_match", "action_match", "detection_f1"):
        assert name in str(err.value)


def test_build_reward_fns_from_config_mappings_binds_options():
    fns = build_reward_fns(
        [{"name": "detection_f1", "weight": 2.0, "kwargs": {"iou_threshold": 0.3}}, {"name": "format"}]
    )
    assert list(fns) == ["detection_f1", "format"]
    completions = ["[[0, 0, 10, 4]]"]  # IoU 0.4 with the target: a match only below the default 0.5
    got = fns["detection_f1"](completions, target_boxes=[torch.tensor([[0.0, 0.0, 10.0, 10.0]])])
    torch.testing.assert_close(got, torch.tensor([1.0]))


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (
            [RewardSpec("box_iou", kwargs={"iou_threshold": 0.5})],
            r"reward 'box_iou' has no option\(s\) \['iou_threshold'\]",
        ),
        ([RewardSpec("format"), RewardSpec("format")], "reward 'format' is listed twice"),
        ([{"name": "format", "wieght": 1.0}], r"unknown key\(s\) \['wieght'\]"),
        ([{"weight": 1.0}], "has no name"),
    ],
)
def test_build_reward_fns_refuses_bad_specs(specs, message):
    with pytest.raises(ValueError, match=message):
        build_reward_fns(specs)


def test_bound_reward_hands_each_function_only_the_targets_it_names():
    fns = build_reward_fns([RewardSpec("box_iou"), RewardSpec("exact_match"), RewardSpec("format")])
    completions = ["<answer>[0, 0, 10, 10]</answer>", "<answer>cat</answer>"]
    targets = {
        "target_box": torch.tensor([[0.0, 0.0, 10.0, 10.0], [NAN, NAN, NAN, NAN]]),  # row 1 has no box target
        "answer": [None, "cat"],  # row 0 has no text target
        "image_id": ["a", "b"],  # a target no reward takes
    }
    components = {name: fn(completions, **targets) for name, fn in fns.items()}
    torch.testing.assert_close(components["box_iou"], torch.tensor([1.0, NAN]), equal_nan=True)
    torch.testing.assert_close(components["exact_match"], torch.tensor([NAN, 1.0]), equal_nan=True)
    torch.testing.assert_close(components["format"], torch.tensor([1.0, 0.0]))
    total = combine(components, {"box_iou": 1.0, "exact_match": 1.0, "format": 0.5})
    # Row 0: (1 * 1 + 0.5 * 1) * 2.5 / 1.5 = 2.5. Row 1: (1 * 1 + 0.5 * 0) * 2.5 / 1.5.
    torch.testing.assert_close(total, torch.tensor([2.5, 2.5 / 1.5]))


def test_bound_reward_names_a_missing_target_and_checks_the_shape():
    fn = build_reward_fns([RewardSpec("box_iou")])["box_iou"]
    with pytest.raises(ValueError, match=r"reward 'box_iou' needs \['target_box'\].*targets given: \['answer'\]"):
        fn(["[0, 0, 1, 1]"], answer=["x"])
    needs_option = build_reward_fns([RewardSpec("length_penalty", kwargs={"target_length": 5})])["length_penalty"]
    with pytest.raises(ValueError, match=r"needs \['max_length'\]"):
        needs_option(["abc"])
    bad = BoundReward("bad", lambda completions: torch.zeros(3), {})
    with pytest.raises(ValueError, match=r"returned \(3,\) for 2 completions"):
        bad(["a", "b"])


def test_bound_reward_passes_everything_by_name_to_functions_that_read_no_text():
    def similarity(images_a: torch.Tensor, images_b: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        return scale * (images_a == images_b).float().mean(-1)

    bound = BoundReward("similarity", similarity, {"scale": 2.0})
    assert not bound.reads_completions
    got = bound(["<svg/>", "<svg/>"], images_a=torch.tensor([[1, 2], [3, 4]]), images_b=torch.tensor([[1, 2], [3, 0]]))
    torch.testing.assert_close(got, torch.tensor([2.0, 1.0]))
    with pytest.raises(ValueError, match=r"needs \['images_b'\]"):
        bound(["a"], images_a=torch.zeros(1, 2))


TEXT_LEVEL_REWARDS = [
    "format", "box_iou", "box_giou", "box_size", "point_in_box", "matched_iou", "detection_f1", "exact_match",
    "multiple_choice", "numeric_match", "length_penalty", "action_type", "action_match",
]  # fmt: skip


@pytest.mark.parametrize("name", TEXT_LEVEL_REWARDS)
def test_text_level_rewards_follow_the_calling_convention(name):
    """Completions first; every other parameter is passed by name (a target or an option)."""
    import inspect

    params = list(inspect.signature(REWARDS.get(name)).parameters.values())
    assert params[0].name in ("completions", "texts")
    assert params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD)
    assert all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params[1:])
    assert BoundReward(name, REWARDS.get(name), {}).reads_completions


# --------------------------------------------------------------------------------------------------------------------
# Package boundaries
# --------------------------------------------------------------------------------------------------------------------

MODULES = (
    "parse/__init__.py",
    "parse/answer.py",
    "parse/geometry.py",
    "parse/scalars.py",
    "box.py",
    "text.py",
    "actions.py",
    "combine.py",
)
ALLOWED_AT_TOP = {"torch", "rewards", "__future__"}  # plus the standard library


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_only_torch_and_stdlib_at_top_level(module):
    import sys

    tree = ast.parse((Path(rewards.__file__).parent / module).read_text())
    for node in tree.body:  # top-level statements only: lazy imports inside functions are the point
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        for name in names:
            root = name.split(".")[0]
            assert root in ALLOWED_AT_TOP or root in sys.stdlib_module_names, f"{module} imports {name} at top level"
            assert root not in ("sim", "mmrl"), f"{module} imports {name}"
