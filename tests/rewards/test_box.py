import itertools
import math

import pytest
import torch

from rewards import (
    REWARDS,
    box_giou,
    box_giou_reward,
    box_iou,
    box_iou_reward,
    box_size_factor,
    box_size_reward,
    box_size_similarity,
    detection_f1,
    detection_f1_reward,
    matched_iou,
    matched_iou_reward,
    pairwise_box_iou,
    point_in_box,
    point_in_box_reward,
)

NAN = math.nan


def reference_iou(pred: list[float], target: list[float]) -> float:
    """Ten-line per-row IoU the vectorised kernel is checked against."""
    if not all(math.isfinite(v) for v in pred + target):
        return 0.0
    inter_w = max(0.0, min(pred[2], target[2]) - max(pred[0], target[0]))
    inter_h = max(0.0, min(pred[3], target[3]) - max(pred[1], target[1]))
    inter = inter_w * inter_h
    area_pred = max(0.0, pred[2] - pred[0]) * max(0.0, pred[3] - pred[1])
    area_target = max(0.0, target[2] - target[0]) * max(0.0, target[3] - target[1])
    union = area_pred + area_target - inter
    return inter / union if union > 0 else 0.0


@pytest.mark.parametrize(
    ("pred", "target", "expected"),
    [
        ([0, 0, 10, 10], [5, 5, 15, 15], 25 / 175),  # 5x5 overlap, union 100 + 100 - 25
        ([0, 0, 10, 10], [0, 0, 10, 10], 1.0),
        ([0, 0, 10, 10], [0, 0, 5, 5], 25 / 100),  # target inside pred
        ([0, 0, 10, 10], [20, 20, 30, 30], 0.0),  # disjoint
        ([0, 0, 10, 10], [10, 0, 20, 10], 0.0),  # sharing an edge only
        ([0, 0, 4, 2], [2, 0, 6, 2], 4 / 12),  # half overlap along x
    ],
)
def test_box_iou_matches_hand_computation(pred, target, expected):
    got = box_iou(torch.tensor([pred], dtype=torch.float32), torch.tensor([target], dtype=torch.float32))
    torch.testing.assert_close(got, torch.tensor([expected], dtype=torch.float32))


def test_box_iou_scores_non_finite_and_empty_rows_zero_not_nan():
    pred = torch.tensor(
        [
            [NAN, NAN, NAN, NAN],  # what parse_boxes writes for unparsed text
            [0.0, NAN, 10.0, 10.0],
            [0.0, 0.0, math.inf, 10.0],
            [0.0, 0.0, 10.0, 10.0],
            [5.0, 5.0, 5.0, 5.0],  # both boxes empty: union 0
        ]
    )
    target = torch.tensor(
        [
            [0.0, 0.0, 10.0, 10.0],
            [0.0, 0.0, 10.0, 10.0],
            [0.0, 0.0, 10.0, 10.0],
            [NAN, 0.0, 10.0, 10.0],
            [5.0, 5.0, 5.0, 5.0],
        ]
    )
    got = box_iou(pred, target)
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, torch.zeros(5))


def test_box_iou_batch_equals_per_row_reference():
    gen = torch.Generator().manual_seed(0)
    corners = torch.rand(256, 2, 4, generator=gen) * 100  # [R, 2, 4]
    # Sorted corners, so most pairs overlap partly; a few rows are made to coincide or to hold NaN.
    xy_min = torch.minimum(corners[..., :2], corners[..., 2:])
    xy_max = torch.maximum(corners[..., :2], corners[..., 2:])
    boxes = torch.cat([xy_min, xy_max], dim=-1)  # [R, 2, 4]
    pred, target = boxes[:, 0].clone(), boxes[:, 1].clone()  # [R, 4]
    pred[:8] = target[:8]
    pred[8:12, 1] = NAN
    got = box_iou(pred, target)
    expected = torch.tensor([reference_iou(p, t) for p, t in zip(pred.tolist(), target.tolist())])
    assert got.shape == (256,)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got[:8], torch.ones(8))
    assert ((got > 0) & (got < 1)).sum() > 50  # the random rows really exercise partial overlap
    assert got.min() >= 0 and got.max() <= 1


def test_box_iou_accepts_integer_boxes_and_empty_batches():
    got = box_iou(torch.tensor([[0, 0, 10, 10]]), torch.tensor([[5, 5, 15, 15]]))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor([25 / 175]))
    assert box_iou(torch.empty(0, 4), torch.empty(0, 4)).shape == (0,)


def test_box_iou_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"\[R, 4\]"):
        box_iou(torch.zeros(3, 4), torch.zeros(2, 4))
    with pytest.raises(ValueError):
        box_iou(torch.zeros(3, 5), torch.zeros(3, 5))


def test_box_rewards_are_registered_as_text_level_wrappers():
    assert REWARDS.get("box_iou") is box_iou_reward
    assert REWARDS.get("box_giou") is box_giou_reward
    assert REWARDS.get("box_size") is box_size_reward
    assert REWARDS.get("point_in_box") is point_in_box_reward
    assert REWARDS.get("matched_iou") is matched_iou_reward
    assert REWARDS.get("detection_f1") is detection_f1_reward


# --------------------------------------------------------------------------------------------------------------------
# GIoU
# --------------------------------------------------------------------------------------------------------------------


def reference_giou(pred: list[float], target: list[float]) -> float:
    """Per-row GIoU the vectorised kernel is checked against."""
    if not all(math.isfinite(v) for v in pred + target):
        return -1.0
    area = lambda b: max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])  # noqa: E731
    inter = area([max(pred[0], target[0]), max(pred[1], target[1]), min(pred[2], target[2]), min(pred[3], target[3])])
    union = area(pred) + area(target) - inter
    hull = area([min(pred[0], target[0]), min(pred[1], target[1]), max(pred[2], target[2]), max(pred[3], target[3])])
    return inter / union - (hull - union) / hull if union > 0 else -1.0


@pytest.mark.parametrize(
    ("pred", "target", "expected"),
    [
        ([0, 0, 1, 1], [2, 0, 3, 1], -1 / 3),  # disjoint: I=0, U=2, hull 3x1=3 -> 0 - (3-2)/3
        ([0, 0, 1, 1], [9, 0, 10, 1], -8 / 10),  # farther apart: hull 10 -> 0 - (10-2)/10
        ([0, 0, 2, 2], [1, 1, 3, 3], 1 / 7 - 2 / 9),  # I=1, U=7, hull 3x3=9
        ([0, 0, 10, 10], [0, 0, 10, 10], 1.0),
        ([0, 0, 10, 10], [0, 0, 5, 5], 0.25),  # nested: hull = union, so GIoU = IoU
        ([0, 0, 1, 1], [1, 0, 2, 1], 0.0),  # touching: hull = union = 2
    ],
)
def test_box_giou_matches_hand_computation(pred, target, expected):
    got = box_giou(torch.tensor([pred], dtype=torch.float32), torch.tensor([target], dtype=torch.float32))
    torch.testing.assert_close(got, torch.tensor([expected], dtype=torch.float32))


def test_box_giou_batch_equals_reference_and_scores_invalid_rows_minus_one():
    gen = torch.Generator().manual_seed(1)
    corners = torch.rand(200, 2, 4, generator=gen) * 100
    boxes = torch.cat([corners[..., :2].minimum(corners[..., 2:]), corners[..., :2].maximum(corners[..., 2:])], -1)
    pred, target = boxes[:, 0].clone(), boxes[:, 1].clone()
    pred[:4, 0] = NAN
    target[4, 2] = math.inf
    pred[5], target[5] = torch.tensor([3.0, 3.0, 3.0, 3.0]), torch.tensor([3.0, 3.0, 3.0, 3.0])  # both empty
    got = box_giou(pred, target)
    expected = torch.tensor([reference_giou(p, t) for p, t in zip(pred.tolist(), target.tolist())])
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got[:6], torch.full((6,), -1.0))
    assert (got < 0).sum() > 20 and (got > 0).sum() > 20  # both disjoint and overlapping rows are exercised
    assert bool((got <= box_iou(pred, target) + 1e-6).all())  # GIoU never exceeds IoU (equal when nested)


# --------------------------------------------------------------------------------------------------------------------
# Matching many boxes: matched_iou, detection_f1
# --------------------------------------------------------------------------------------------------------------------


def reference_matched_iou(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Brute force over all one-to-one assignments."""
    if len(pred) == 0 or len(target) == 0:
        return 1.0 if len(pred) == len(target) else 0.0
    iou = pairwise_box_iou(pred, target)
    small, large = sorted([len(pred), len(target)])
    pairs = (
        [[(i, j) for i, j in zip(rows, range(small))] for rows in itertools.permutations(range(len(pred)), small)]
        if len(pred) >= len(target)
        else [
            [(i, j) for i, j in zip(range(small), cols)] for cols in itertools.permutations(range(len(target)), small)
        ]
    )
    return max(sum(float(iou[i, j]) for i, j in pairing) for pairing in pairs) / large


def test_pairwise_box_iou_matches_box_iou():
    a = torch.tensor([[0.0, 0, 10, 10], [5, 5, 15, 15]])
    b = torch.tensor([[0.0, 0, 10, 10], [0, 0, 5, 5], [20, 20, 30, 30]])
    expected = torch.tensor([[1.0, 0.25, 0.0], [25 / 175, 0.0, 0.0]])
    torch.testing.assert_close(pairwise_box_iou(a, b), expected)


def test_matched_iou_hand_computed():
    pred = [
        torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30]]),  # both found, one exactly, one half
        torch.tensor([[0.0, 0, 10, 10], [40, 40, 50, 50], [60, 60, 70, 70]]),  # one perfect box, two extra
        torch.zeros(0, 4),  # nothing predicted
        torch.zeros(0, 4),  # nothing predicted, nothing there
        torch.tensor([[0.0, 0, 10, 10]]),  # a box where there is nothing
    ]
    target = [
        torch.tensor([[20.0, 20, 30, 30], [0, 0, 10, 5]]),  # order differs from the prediction's
        torch.tensor([[0.0, 0, 10, 10]]),
        torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30]]),
        torch.zeros(0, 4),
        torch.zeros(0, 4),
    ]
    # Row 0: (1.0 + 50/100) / 2; row 1: 1.0 / max(3, 1).
    torch.testing.assert_close(matched_iou(pred, target), torch.tensor([0.75, 1 / 3, 0.0, 1.0, 0.0]))


def test_matched_iou_beats_greedy_and_equals_brute_force():
    # Greedy takes the best pair first (p0-t0, 0.8) and is left with p1-t1 = 0; the optimum pairs p0-t1 + p1-t0.
    pred = [torch.tensor([[0.0, 0, 10, 10], [2, 0, 12, 10]])]
    target = [torch.tensor([[2.0, 0, 10, 10], [-8, 0, 2, 10]])]
    iou = pairwise_box_iou(pred[0], target[0])
    optimum = (float(iou[0, 1]) + float(iou[1, 0])) / 2
    assert optimum > (float(iou[0, 0]) + float(iou[1, 1])) / 2
    torch.testing.assert_close(matched_iou(pred, target), torch.tensor([optimum]))

    gen = torch.Generator().manual_seed(2)
    preds, targets = [], []
    for _ in range(40):
        n_pred, n_target = torch.randint(0, 5, (2,), generator=gen).tolist()
        for n, out in ((n_pred, preds), (n_target, targets)):
            xy = torch.rand(n, 2, generator=gen) * 40
            out.append(torch.cat([xy, xy + 5 + torch.rand(n, 2, generator=gen) * 20], -1))
    expected = torch.tensor([reference_matched_iou(p, t) for p, t in zip(preds, targets)])
    torch.testing.assert_close(matched_iou(preds, targets), expected)


def test_detection_f1_hand_computed():
    pred = [
        torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 4], [50, 50, 60, 60]]),
        torch.tensor([[0.0, 0, 10, 10]]),
        torch.zeros(0, 4),
        torch.tensor([[0.0, 0, 10, 4]]),
    ]
    target = [
        torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 5]]),
        torch.tensor([[0.0, 0, 10, 10], [30, 30, 40, 40]]),
        torch.zeros(0, 4),
        torch.tensor([[0.0, 0, 10, 10]]),
    ]
    # Row 0: p0-t0 (1.0) and p1-t1 (40/50 = 0.8) match, the far box does not: 2 * 2 / (3 + 2).
    # Row 1: one of two found: 2 * 1 / 3. Row 3: IoU 0.4 is below 0.5.
    torch.testing.assert_close(detection_f1(pred, target), torch.tensor([0.8, 2 / 3, 1.0, 0.0]))
    torch.testing.assert_close(detection_f1(pred[3:], target[3:], iou_threshold=0.4), torch.tensor([1.0]))


def test_detection_f1_counts_the_most_matches_not_the_largest_iou_sum():
    # 1-D boxes (full height) so IoUs are easy: p0 overlaps t0 almost fully and t1 by 0.5, p1 overlaps t0 by 0.5
    # and t1 not at all. The largest IoU sum pairs p0-t0 (0.9) with p1-t1 (0.0): one match. Two matches exist.
    pred = [torch.tensor([[0.0, 0, 10, 1], [-10, 0, 10, 1]])]
    target = [torch.tensor([[1.0, 0, 10, 1], [0, 0, 20, 1]])]
    iou = pairwise_box_iou(pred[0], target[0])
    torch.testing.assert_close(iou, torch.tensor([[0.9, 0.5], [0.45, 1 / 3]]))
    # Threshold 0.4: pairs p0-t1 (0.5) and p1-t0 (0.45) both pass; the max-sum pairing p0-t0 + p1-t1 has one.
    torch.testing.assert_close(detection_f1(pred, target, iou_threshold=0.4), torch.tensor([1.0]))


# --------------------------------------------------------------------------------------------------------------------
# Points and box size
# --------------------------------------------------------------------------------------------------------------------


def test_point_in_box_hand_computed():
    points = torch.tensor([[5.0, 5.0], [10.0, 10.0], [10.5, 5.0], [NAN, NAN], [5.0, 5.0]])
    boxes = torch.tensor([[0.0, 0, 10, 10]] * 4 + [[NAN, 0, 10, 10]])
    torch.testing.assert_close(point_in_box(points, boxes), torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match=r"\[R, 2\]"):
        point_in_box(torch.zeros(2, 2), torch.zeros(3, 4))


def test_box_size_similarity_hand_computed():
    pred = torch.tensor([[0.0, 0, 20, 5], [50, 50, 60, 60], [0, 0, 5, 10], [NAN, 0, 1, 1], [0, 0, 0, 10]])
    target = torch.tensor([[0.0, 0, 10, 10]] * 5)
    # Row 0: widths 10/20, heights 5/10; row 1: same size elsewhere; row 2: width 5/10; rows 3-4 invalid.
    torch.testing.assert_close(box_size_similarity(pred, target), torch.tensor([0.25, 1.0, 0.5, 0.0, 0.0]))


def test_box_size_factor_hand_computed():
    target = torch.tensor([[0.0, 0, 10, 10]] * 4)  # area 100
    pred = torch.tensor([[0.0, 0, 20, 20], [0, 0, 40, 20], [0, 0, 1, 1], [NAN, 0, 1, 1]])  # areas 400, 800, 1, NaN
    torch.testing.assert_close(box_size_factor(pred, target, max_ratio=4.0), torch.tensor([1.0, 0.5, 1.0, 0.0]))
    torch.testing.assert_close(
        box_size_factor(pred, target, max_ratio=4.0, mode="zero"), torch.tensor([1.0, 0.0, 1.0, 0.0])
    )
    with pytest.raises(ValueError, match="max_ratio"):
        box_size_factor(pred, target, max_ratio=0.5)


# --------------------------------------------------------------------------------------------------------------------
# Registered, text-level box rewards
# --------------------------------------------------------------------------------------------------------------------


def test_box_iou_reward_parses_and_writes_nan_where_there_is_no_target():
    completions = ["<answer>[0, 0, 10, 10]</answer>", "no box", "[5, 5, 15, 15]", "[0, 0, 10, 10]"]
    target = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10], [NAN, NAN, NAN, NAN]])
    torch.testing.assert_close(
        box_iou_reward(completions, target), torch.tensor([1.0, 0.0, 25 / 175, NAN]), equal_nan=True
    )
    torch.testing.assert_close(
        box_giou_reward(completions, target), torch.tensor([1.0, -1.0, 25 / 175 - 50 / 225, NAN]), equal_nan=True
    )
    torch.testing.assert_close(
        box_size_reward(completions, target), torch.tensor([1.0, 0.0, 1.0, NAN]), equal_nan=True
    )


def test_box_iou_reward_maps_coordinates_to_the_target_image():
    target = torch.tensor([[64.0, 48.0, 320.0, 240.0]])
    image_size = torch.tensor([[640.0, 480.0]])
    grid = ["<|box_start|>(100,100),(500,500)<|box_end|>"]  # Qwen2-VL 0-1000 grid
    torch.testing.assert_close(
        box_iou_reward(grid, target, normalized_1000=True, image_size=image_size), torch.tensor([1.0])
    )
    resized = ["[32, 24, 160, 120]"]  # pixels of the 320x240 image the model saw
    got = box_iou_reward(resized, target, input_size=torch.tensor([[320.0, 240.0]]), image_size=image_size)
    torch.testing.assert_close(got, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="image_size"):
        box_iou_reward(resized, target, input_size=torch.tensor([[320.0, 240.0]]))


def test_point_in_box_reward_points_boxes_and_the_size_constraint():
    completions = [
        "(5, 5)",  # a point inside
        '{"point_2d": [50, 50]}',  # a point outside
        "<answer>[2, 2, 8, 8]</answer>",  # a box: its centre (5, 5) counts
        "[0, 0, 100, 100]",  # a huge box whose centre (50, 50) misses
        "[-30, -30, 40, 40]",  # a huge box whose centre (5, 5) hits: 49x the target's area
        "nothing",
        "(5, 5)",
    ]
    target = torch.tensor([[0.0, 0, 10, 10]] * 6 + [[NAN] * 4])
    plain = point_in_box_reward(completions, target)
    torch.testing.assert_close(plain, torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, NAN]), equal_nan=True)
    # 70x70 = 4900 against 100: ratio 49, so the scaled hit is 4 / 49; the 6x6 box (ratio 0.36) keeps its hit.
    scaled = point_in_box_reward(completions, target, max_area_ratio=4.0)
    torch.testing.assert_close(scaled, torch.tensor([1.0, 0.0, 1.0, 0.0, 4 / 49, 0.0, NAN]), equal_nan=True)
    zeroed = point_in_box_reward(completions, target, max_area_ratio=4.0, size_mode="zero")
    torch.testing.assert_close(zeroed, torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, NAN]), equal_nan=True)


def test_point_in_box_reward_maps_grid_points():
    got = point_in_box_reward(
        ["<|box_start|>(500,500)<|box_end|>"],
        torch.tensor([[300.0, 200.0, 340.0, 280.0]]),
        normalized_1000=True,
        image_size=torch.tensor([[640.0, 480.0]]),
    )  # (500, 500) on the grid is (320, 240) in pixels
    torch.testing.assert_close(got, torch.tensor([1.0]))


def test_box_list_rewards_parse_lists_and_write_nan_where_there_is_no_target():
    completions = [
        '[{"bbox_2d": [20, 20, 30, 30], "label": "a"}, {"bbox_2d": [0, 0, 10, 10], "label": "b"}]',
        "[[0, 0, 10, 10], [40, 40, 50, 50]]",
        "I see nothing.",  # not a box list at all: 0
        "[]",  # correctly empty
        "[[0, 0, 10, 10]]",
    ]
    two = torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30]])
    targets = [two, torch.tensor([[0.0, 0, 10, 10]]), two, torch.zeros(0, 4), None]
    torch.testing.assert_close(
        matched_iou_reward(completions, targets), torch.tensor([1.0, 0.5, 0.0, 1.0, NAN]), equal_nan=True
    )
    torch.testing.assert_close(
        detection_f1_reward(completions, targets), torch.tensor([1.0, 2 / 3, 0.0, 1.0, NAN]), equal_nan=True
    )
    with pytest.raises(ValueError, match="target box lists"):
        matched_iou_reward(completions, targets[:2])
