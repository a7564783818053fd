import math

import pytest
import torch

from rewards import REWARDS, box_iou

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


def test_box_iou_is_registered():
    assert REWARDS.get("box_iou") is box_iou
