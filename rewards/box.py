"""Rewards that compare boxes."""

from __future__ import annotations

import torch

from rewards.catalog import REWARDS


@REWARDS.register("box_iou")
def box_iou(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Paired intersection over union of xyxy boxes.

    A row scores 0.0 rather than NaN when either box has a non-finite coordinate (the NaN rows `parse_boxes` writes
    for unparsed text) or when both boxes have zero area. Boxes are taken as written: a row with `x1 > x2` has zero
    area (`parse_box` already reorders corners).

    Args:
        pred: `[R, 4]` predicted boxes `(x1, y1, x2, y2)`.
        target: `[R, 4]` target boxes, paired row by row with `pred`.

    Returns:
        `[R]` IoU in [0, 1], float32 or wider.
    """
    if pred.shape != target.shape or pred.shape[-1:] != (4,):
        raise ValueError(f"box_iou needs two [R, 4] tensors, got {tuple(pred.shape)} and {tuple(target.shape)}")
    dtype = torch.promote_types(torch.promote_types(pred.dtype, target.dtype), torch.float32)
    pred, target = pred.to(dtype), target.to(dtype)
    top_left = torch.maximum(pred[..., :2], target[..., :2])  # [R, 2]
    bottom_right = torch.minimum(pred[..., 2:], target[..., 2:])  # [R, 2]
    overlap = (bottom_right - top_left).clamp(min=0)  # [R, 2]
    inter = overlap[..., 0] * overlap[..., 1]  # [R]
    pred_wh = (pred[..., 2:] - pred[..., :2]).clamp(min=0)  # [R, 2]
    target_wh = (target[..., 2:] - target[..., :2]).clamp(min=0)  # [R, 2]
    union = pred_wh[..., 0] * pred_wh[..., 1] + target_wh[..., 0] * target_wh[..., 1] - inter  # [R]
    valid = torch.isfinite(pred).all(-1) & torch.isfinite(target).all(-1) & (union > 0)  # [R]
    # The division runs on every row; `where` then drops the NaN and inf it gives on invalid rows.
    iou = torch.where(valid, inter / torch.where(valid, union, torch.ones_like(union)), torch.zeros_like(union))
    return iou.clamp(0.0, 1.0)  # [R]
