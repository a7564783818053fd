"""Rewards that compare boxes and points: tensor kernels, and the text-level rewards registered in `REWARDS`.

Kernels (`box_iou`, `box_giou`, `matched_iou`, `detection_f1`, `point_in_box`, `box_size_similarity`,
`box_size_factor`) take tensors and return `[R]` scores; a row with an unparsed (NaN) prediction scores the minimum,
never NaN. The registered rewards (`box_iou_reward` under "box_iou", ...) parse completions, map coordinates, call a
kernel and write NaN where the row has no target (see `rewards/__init__.py` for the convention).
"""

from __future__ import annotations

from typing import Literal

import torch

from rewards.catalog import REWARDS
from rewards.parse import (
    parse_box,
    parse_box_lists,
    parse_boxes,
    parse_point,
    rescale_boxes,
    rescale_points,
)

# --------------------------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------------------------


def _check_pair(name: str, pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if pred.shape != target.shape or pred.shape[-1:] != (4,):
        raise ValueError(f"{name} needs two [R, 4] tensors, got {tuple(pred.shape)} and {tuple(target.shape)}")
    dtype = torch.promote_types(torch.promote_types(pred.dtype, target.dtype), torch.float32)
    return pred.to(dtype), target.to(dtype)


def _overlap(pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Intersection `[R]`, union `[R]` and validity `[R]` (finite boxes, union > 0) of paired xyxy boxes."""
    top_left = torch.maximum(pred[..., :2], target[..., :2])  # [R, 2]
    bottom_right = torch.minimum(pred[..., 2:], target[..., 2:])  # [R, 2]
    overlap = (bottom_right - top_left).clamp(min=0)  # [R, 2]
    inter = overlap[..., 0] * overlap[..., 1]  # [R]
    pred_wh = (pred[..., 2:] - pred[..., :2]).clamp(min=0)  # [R, 2]
    target_wh = (target[..., 2:] - target[..., :2]).clamp(min=0)  # [R, 2]
    union = pred_wh[..., 0] * pred_wh[..., 1] + target_wh[..., 0] * target_wh[..., 1] - inter  # [R]
    valid = torch.isfinite(pred).all(-1) & torch.isfinite(target).all(-1) & (union > 0)  # [R]
    return inter, union, valid


def _safe_ratio(num: torch.Tensor, den: torch.Tensor, valid: torch.Tensor, fill: float) -> torch.Tensor:
    """`num / den` where valid, else `fill`. The division runs on every row; `where` drops its NaN and inf."""
    return torch.where(valid, num / torch.where(valid, den, torch.ones_like(den)), torch.full_like(num, fill))


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
    pred, target = _check_pair("box_iou", pred, target)
    inter, union, valid = _overlap(pred, target)
    return _safe_ratio(inter, union, valid, 0.0).clamp(0.0, 1.0)  # [R]


def box_giou(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Paired generalized IoU (https://arxiv.org/abs/1902.09630): `IoU - (C - U) / C`, C the enclosing box's area.

    Unlike IoU it still ranks disjoint boxes: the farther apart, the closer to -1, so a wrong guess near the target
    beats one across the image. A row scores -1.0 (the minimum) when either box has a non-finite coordinate or both
    have zero area.

    Args:
        pred: `[R, 4]` predicted boxes `(x1, y1, x2, y2)`.
        target: `[R, 4]` target boxes.

    Returns:
        `[R]` GIoU in [-1, 1], float32 or wider.
    """
    pred, target = _check_pair("box_giou", pred, target)
    inter, union, valid = _overlap(pred, target)
    enclosing_wh = (
        torch.maximum(pred[..., 2:], target[..., 2:]) - torch.minimum(pred[..., :2], target[..., :2])
    ).clamp(min=0)  # [R, 2]
    enclosing = enclosing_wh[..., 0] * enclosing_wh[..., 1]  # [R], >= union > 0 on valid rows
    iou = _safe_ratio(inter, union, valid, 0.0)
    gap = _safe_ratio(enclosing - union, enclosing, valid, 1.0)
    return (iou - gap).clamp(-1.0, 1.0)  # [R]


def pairwise_box_iou(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """IoU of every predicted box with every target box, by `box_iou`'s rules.

    Args:
        pred: `[..., P, 4]` boxes.
        target: `[..., T, 4]` boxes (same leading dimensions).

    Returns:
        `[..., P, T]` IoU.
    """
    p, t = pred.shape[-2], target.shape[-2]
    a = pred.unsqueeze(-2).expand(*pred.shape[:-1], t, 4)  # [..., P, T, 4]
    b = target.unsqueeze(-3).expand(*target.shape[:-2], p, t, 4)  # [..., P, T, 4]
    return box_iou(a.reshape(-1, 4), b.reshape(-1, 4)).view(*a.shape[:-1])


def _padded_pairwise_iou(pred_boxes: list[torch.Tensor], target_boxes: list[torch.Tensor]) -> torch.Tensor:
    """`[R, Pmax, Tmax]` IoU of each row's boxes in one kernel call; padding boxes are NaN, so they score 0."""
    if len(pred_boxes) != len(target_boxes):
        raise ValueError(f"got {len(pred_boxes)} predicted and {len(target_boxes)} target box lists")
    rows = len(pred_boxes)
    p_max = max((b.shape[0] for b in pred_boxes), default=0)
    t_max = max((b.shape[0] for b in target_boxes), default=0)
    pred = torch.full((rows, p_max, 4), float("nan"))  # [R, Pmax, 4]
    target = torch.full((rows, t_max, 4), float("nan"))  # [R, Tmax, 4]
    for i, (p, t) in enumerate(zip(pred_boxes, target_boxes)):
        if p.ndim != 2 or p.shape[-1] != 4 or t.ndim != 2 or t.shape[-1] != 4:
            raise ValueError(f"row {i}: boxes must be [P, 4] and [T, 4], got {tuple(p.shape)} and {tuple(t.shape)}")
        pred[i, : p.shape[0]] = p.detach().float().cpu()
        target[i, : t.shape[0]] = t.detach().float().cpu()
    return pairwise_box_iou(pred, target)  # [R, Pmax, Tmax]


def matched_iou(pred_boxes: list[torch.Tensor], target_boxes: list[torch.Tensor]) -> torch.Tensor:
    """Mean IoU of a one-to-one matching of predicted to target boxes, per row (detection, multi-object grounding).

    The matching maximises the summed IoU (Hungarian algorithm, `scipy.optimize.linear_sum_assignment`), and the sum
    is divided by `max(P, T)`, so every extra and every missing box counts as an IoU of 0: listing many boxes does not
    pay. A row with no predicted and no target box scores 1.0 (nothing to find, nothing claimed).

    Args:
        pred_boxes: R tensors `[P_i, 4]` of predicted xyxy boxes.
        target_boxes: R tensors `[T_i, 4]` of target boxes.

    Returns:
        `[R]` float32 in [0, 1], on CPU.
    """
    from scipy.optimize import linear_sum_assignment  # optional dependency: the `render` extra

    iou = _padded_pairwise_iou(pred_boxes, target_boxes).numpy()  # [R, Pmax, Tmax]
    scores = []
    for i, (p, t) in enumerate(zip(pred_boxes, target_boxes)):
        n_pred, n_target = p.shape[0], t.shape[0]
        if n_pred == 0 or n_target == 0:
            scores.append(1.0 if n_pred == n_target else 0.0)
            continue
        row = iou[i, :n_pred, :n_target]
        rows, cols = linear_sum_assignment(row, maximize=True)
        scores.append(float(row[rows, cols].sum()) / max(n_pred, n_target))
    return torch.tensor(scores, dtype=torch.float32)  # [R]


def detection_f1(
    pred_boxes: list[torch.Tensor], target_boxes: list[torch.Tensor], iou_threshold: float = 0.5
) -> torch.Tensor:
    """F1 of predicted against target boxes, per row, a match being a one-to-one pair with IoU >= `iou_threshold`.

    The matching maximises the number of matches (then their summed IoU), so `TP` is the most pairs any one-to-one
    assignment could count; `F1 = 2 TP / (P + T)`. A row with no predicted and no target box scores 1.0.

    Args:
        pred_boxes: R tensors `[P_i, 4]` of predicted xyxy boxes.
        target_boxes: R tensors `[T_i, 4]` of target boxes.
        iou_threshold: the IoU a pair needs to count as a true positive (COCO's AP50 uses 0.5).

    Returns:
        `[R]` float32 in [0, 1], on CPU.
    """
    from scipy.optimize import linear_sum_assignment  # optional dependency: the `render` extra

    iou = _padded_pairwise_iou(pred_boxes, target_boxes).numpy()  # [R, Pmax, Tmax]
    scores = []
    for i, (p, t) in enumerate(zip(pred_boxes, target_boxes)):
        n_pred, n_target = p.shape[0], t.shape[0]
        if n_pred == 0 or n_target == 0:
            scores.append(1.0 if n_pred == n_target else 0.0)
            continue
        row = iou[i, :n_pred, :n_target]
        hit = row >= iou_threshold
        # Each hit is worth more than any set of fewer hits can make up in IoU: k+1 hits score over (k+1) * big,
        # k hits under k * (big + 1), and big = min(P, T) + 1 > k.
        weight = hit * (min(n_pred, n_target) + 1 + row)
        rows, cols = linear_sum_assignment(weight, maximize=True)
        true_pos = int(hit[rows, cols].sum())
        scores.append(2 * true_pos / (n_pred + n_target))
    return torch.tensor(scores, dtype=torch.float32)  # [R]


def point_in_box(points: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """1.0 where a point lies inside its row's box (edges included), else 0.0; a NaN point or box scores 0.0.

    Args:
        points: `[R, 2]` `(x, y)`.
        boxes: `[R, 4]` xyxy.

    Returns:
        `[R]` float32 of 0.0 and 1.0.
    """
    if points.shape[-1:] != (2,) or boxes.shape[-1:] != (4,) or points.shape[:-1] != boxes.shape[:-1]:
        raise ValueError(f"point_in_box needs [R, 2] and [R, 4], got {tuple(points.shape)} and {tuple(boxes.shape)}")
    x, y = points[..., 0], points[..., 1]
    # Comparisons with NaN are False, so NaN rows fall out as misses with no special case.
    inside = (x >= boxes[..., 0]) & (x <= boxes[..., 2]) & (y >= boxes[..., 1]) & (y <= boxes[..., 3])  # [R]
    return inside.to(torch.float32)


def _box_wh(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[..., 2:] - boxes[..., :2]).clamp(min=0)  # [R, 2]


def box_size_similarity(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """How close the predicted box's size is to the target's, wherever it sits: `min/max` of widths times of heights.

    GUI-G1 (https://arxiv.org/abs/2505.15810, section 4.2) found that box size is a free variable that hit and IoU
    rewards each push their own way (hit-trained models drift to small boxes, IoU-trained ones to large boxes), and
    adds a term that pulls the predicted size to the target's. This is such a term, not their exact formula:
    1.0 for a box of exactly the target's width and height, falling as either side grows or shrinks.

    Args:
        pred: `[R, 4]` predicted xyxy boxes.
        target: `[R, 4]` target boxes.

    Returns:
        `[R]` in [0, 1]; 0.0 where either box is non-finite or has zero width or height.
    """
    pred, target = _check_pair("box_size_similarity", pred, target)
    pred_wh, target_wh = _box_wh(pred), _box_wh(target)  # [R, 2]
    small, large = torch.minimum(pred_wh, target_wh), torch.maximum(pred_wh, target_wh)
    valid = torch.isfinite(pred).all(-1) & torch.isfinite(target).all(-1) & (small > 0).all(-1)  # [R]
    ratio = _safe_ratio(small, large, valid.unsqueeze(-1).expand_as(small), 0.0)  # [R, 2]
    return ratio[..., 0] * ratio[..., 1]  # [R]


def box_size_factor(
    pred: torch.Tensor, target: torch.Tensor, max_ratio: float = 4.0, mode: Literal["scale", "zero"] = "scale"
) -> torch.Tensor:
    """A multiplier in [0, 1] that takes reward away from predicted boxes much larger than the target.

    Why: a "hit" reward (the target's point inside the predicted box, or the predicted box's centre inside the
    target) says nothing about size, so a box that covers half the screen hits as well as a tight one, and the policy
    learns to spread its boxes (GUI-G1, https://arxiv.org/abs/2505.15810, on box-size reward hacking). Multiplying
    the hit by this factor keeps the credit for tight boxes and removes it for huge ones.

    With `ratio = area(pred) / area(target)`: 1.0 while `ratio <= max_ratio`; beyond it `max_ratio / ratio`
    (`mode="scale"`, a smooth fall) or 0.0 (`mode="zero"`, a hard cut).

    Args:
        pred: `[R, 4]` predicted xyxy boxes.
        target: `[R, 4]` target boxes.
        max_ratio: the largest area ratio that keeps the full reward, >= 1.
        mode: "scale" or "zero", as above.

    Returns:
        `[R]` in [0, 1]; 0.0 where either box is non-finite or the target has zero area.
    """
    if max_ratio < 1:
        raise ValueError(f"max_ratio must be >= 1, got {max_ratio}")
    if mode not in ("scale", "zero"):
        raise ValueError(f"mode must be 'scale' or 'zero', got {mode!r}")
    pred, target = _check_pair("box_size_factor", pred, target)
    pred_wh, target_wh = _box_wh(pred), _box_wh(target)
    pred_area, target_area = pred_wh[..., 0] * pred_wh[..., 1], target_wh[..., 0] * target_wh[..., 1]  # [R]
    valid = torch.isfinite(pred).all(-1) & torch.isfinite(target).all(-1) & (target_area > 0)  # [R]
    ratio = _safe_ratio(pred_area, target_area, valid, float("inf"))  # [R]
    over = max_ratio / ratio.clamp(min=max_ratio) if mode == "scale" else torch.zeros_like(ratio)
    factor = torch.where(ratio <= max_ratio, torch.ones_like(ratio), over)
    return torch.where(valid, factor, torch.zeros_like(factor))  # [R]


# --------------------------------------------------------------------------------------------------------------------
# Registered rewards: completions in, [R] out, NaN where the row has no target
# --------------------------------------------------------------------------------------------------------------------


def _map_to_target(
    coords: torch.Tensor,
    *,
    normalized_1000: bool,
    input_size: torch.Tensor | None,
    image_size: torch.Tensor | None,
    rescale=rescale_boxes,
) -> torch.Tensor:
    """Maps parsed coordinates into the target's frame: from the 0-1000 grid or from the model's input size."""
    if normalized_1000:
        return coords if image_size is None else rescale(coords, (1000.0, 1000.0), image_size)
    if input_size is None:
        return coords
    if image_size is None:
        raise ValueError("input_size needs image_size: the size the targets are in")
    return rescale(coords, input_size, image_size)


def _nan_where_no_target(scores: torch.Tensor, applicable: torch.Tensor) -> torch.Tensor:
    return torch.where(applicable, scores, torch.full_like(scores, float("nan")))


def _predicted_boxes(completions, target_box, normalized_1000, input_size, image_size) -> torch.Tensor:
    pred, _ = parse_boxes(list(completions), normalized_1000=normalized_1000)
    pred = pred.to(target_box.device)  # [R, 4], NaN rows where unparsed
    return _map_to_target(pred, normalized_1000=normalized_1000, input_size=input_size, image_size=image_size)


@REWARDS.register("box_iou")
def box_iou_reward(
    completions: list[str],
    target_box: torch.Tensor,
    *,
    normalized_1000: bool = False,
    input_size: torch.Tensor | None = None,
    image_size: torch.Tensor | None = None,
) -> torch.Tensor:
    """`box_iou` of the box `parse_box` reads from each completion with the target box.

    Args:
        completions: R completions.
        target_box: `[R, 4]` target xyxy boxes; a NaN row has no target and scores NaN.
        normalized_1000: the model answers on Qwen2-VL's 0-1000 grid; with `image_size`, mapped to that size.
        input_size: `[R, 2]` `(W, H)` of the image the model saw; with `image_size`, pixel answers are mapped from it.
        image_size: `[R, 2]` `(W, H)` of the image the targets are in.

    Returns:
        `[R]` IoU in [0, 1] (0.0 where nothing parsed), NaN where there is no target.
    """
    pred = _predicted_boxes(completions, target_box, normalized_1000, input_size, image_size)
    return _nan_where_no_target(box_iou(pred, target_box), torch.isfinite(target_box).all(-1))


@REWARDS.register("box_giou")
def box_giou_reward(
    completions: list[str],
    target_box: torch.Tensor,
    *,
    normalized_1000: bool = False,
    input_size: torch.Tensor | None = None,
    image_size: torch.Tensor | None = None,
) -> torch.Tensor:
    """`box_giou` of the parsed box with the target box; arguments as `box_iou_reward`.

    Returns:
        `[R]` GIoU in [-1, 1] (-1.0 where nothing parsed), NaN where there is no target.
    """
    pred = _predicted_boxes(completions, target_box, normalized_1000, input_size, image_size)
    return _nan_where_no_target(box_giou(pred, target_box), torch.isfinite(target_box).all(-1))


@REWARDS.register("box_size")
def box_size_reward(
    completions: list[str],
    target_box: torch.Tensor,
    *,
    normalized_1000: bool = False,
    input_size: torch.Tensor | None = None,
    image_size: torch.Tensor | None = None,
) -> torch.Tensor:
    """`box_size_similarity` of the parsed box with the target box (a GUI-G1-style size term to add to a hit reward).

    Returns:
        `[R]` in [0, 1] (0.0 where nothing parsed), NaN where there is no target.
    """
    pred = _predicted_boxes(completions, target_box, normalized_1000, input_size, image_size)
    return _nan_where_no_target(box_size_similarity(pred, target_box), torch.isfinite(target_box).all(-1))


@REWARDS.register("point_in_box")
def point_in_box_reward(
    completions: list[str],
    target_box: torch.Tensor,
    *,
    normalized_1000: bool = False,
    max_area_ratio: float | None = None,
    size_mode: Literal["scale", "zero"] = "scale",
    input_size: torch.Tensor | None = None,
    image_size: torch.Tensor | None = None,
) -> torch.Tensor:
    """The "hit" reward of GUI grounding: 1.0 where the answered point lies in the target box.

    The point is what `parse_point` reads; a completion that answers with a box instead counts with the box's
    centre (GUI-G1's `R_Hit`). With `max_area_ratio`, a box answer's hit is multiplied by `box_size_factor`, so boxes
    far larger than the target stop paying (see there); point answers are unaffected.

    Args:
        completions: R completions.
        target_box: `[R, 4]` target xyxy boxes; a NaN row has no target and scores NaN.
        normalized_1000: the model answers on Qwen2-VL's 0-1000 grid.
        max_area_ratio: None for a plain hit; else the `max_ratio` of `box_size_factor`.
        size_mode: the `mode` of `box_size_factor`.
        input_size: as in `box_iou_reward`.
        image_size: as in `box_iou_reward`.

    Returns:
        `[R]` in [0, 1], NaN where there is no target.
    """
    nan4 = (float("nan"),) * 4
    points, boxes = [], []
    for text in completions:
        point = parse_point(text, normalized_1000=normalized_1000).point
        box = parse_box(text, normalized_1000=normalized_1000).box if point is None else None
        if box is not None:
            point = ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
        points.append(point if point is not None else (float("nan"),) * 2)
        boxes.append(box if box is not None else nan4)
    device = target_box.device
    point_t = torch.tensor(points, dtype=torch.float32, device=device).reshape(-1, 2)  # [R, 2]
    box_t = torch.tensor(boxes, dtype=torch.float32, device=device).reshape(-1, 4)  # [R, 4], NaN for point answers
    point_t = _map_to_target(
        point_t, normalized_1000=normalized_1000, input_size=input_size, image_size=image_size, rescale=rescale_points
    )
    box_t = _map_to_target(box_t, normalized_1000=normalized_1000, input_size=input_size, image_size=image_size)
    hit = point_in_box(point_t, target_box)  # [R]
    if max_area_ratio is not None:
        answered_box = torch.isfinite(box_t).all(-1)  # [R]
        factor = box_size_factor(box_t, target_box, max_area_ratio, size_mode)
        hit = torch.where(answered_box, hit * factor, hit)
    return _nan_where_no_target(hit, torch.isfinite(target_box).all(-1))


def _parsed_box_lists(completions, normalized_1000, input_size, image_size) -> list[torch.Tensor | None]:
    pred, _ = parse_box_lists(list(completions), normalized_1000=normalized_1000)
    mapped = []
    for i, boxes in enumerate(pred):
        if boxes is not None:
            row_input = None if input_size is None else input_size[i]
            row_image = None if image_size is None else image_size[i]
            boxes = _map_to_target(boxes, normalized_1000=normalized_1000, input_size=row_input, image_size=row_image)
        mapped.append(boxes)
    return mapped


def _box_list_reward(kernel, completions, target_boxes, normalized_1000, input_size, image_size) -> torch.Tensor:
    """Runs a box-list kernel on the rows that have a target and a parsed list; 0.0 unparsed, NaN without target."""
    if len(target_boxes) != len(completions):
        raise ValueError(f"got {len(completions)} completions and {len(target_boxes)} target box lists")
    pred = _parsed_box_lists(completions, normalized_1000, input_size, image_size)
    scores = torch.full((len(completions),), float("nan"))
    rows = [i for i, t in enumerate(target_boxes) if t is not None]
    scored = [i for i in rows if pred[i] is not None]
    scores[rows] = 0.0
    if scored:
        got = kernel([pred[i] for i in scored], [torch.as_tensor(target_boxes[i]).reshape(-1, 4) for i in scored])
        scores[scored] = got
    return scores  # [R]


@REWARDS.register("matched_iou")
def matched_iou_reward(
    completions: list[str],
    target_boxes: list[torch.Tensor | None],
    *,
    normalized_1000: bool = False,
    input_size: torch.Tensor | None = None,
    image_size: torch.Tensor | None = None,
) -> torch.Tensor:
    """`matched_iou` of the boxes `parse_box_list` reads from each completion with the row's target boxes.

    Args:
        completions: R completions.
        target_boxes: R entries `[T_i, 4]` (T_i may be 0: nothing to detect), or None for no target (NaN).
        normalized_1000: as in `box_iou_reward`.
        input_size: as in `box_iou_reward`.
        image_size: as in `box_iou_reward`.

    Returns:
        `[R]` float32 in [0, 1] (0.0 where no box list parsed), NaN where there is no target; on CPU.
    """
    return _box_list_reward(matched_iou, completions, target_boxes, normalized_1000, input_size, image_size)


@REWARDS.register("detection_f1")
def detection_f1_reward(
    completions: list[str],
    target_boxes: list[torch.Tensor | None],
    *,
    iou_threshold: float = 0.5,
    normalized_1000: bool = False,
    input_size: torch.Tensor | None = None,
    image_size: torch.Tensor | None = None,
) -> torch.Tensor:
    """`detection_f1` of the parsed box list with the row's target boxes; arguments as `matched_iou_reward`.

    Returns:
        `[R]` float32 in [0, 1] (0.0 where no box list parsed), NaN where there is no target; on CPU.
    """

    def kernel(pred, target):
        return detection_f1(pred, target, iou_threshold=iou_threshold)

    return _box_list_reward(kernel, completions, target_boxes, normalized_1000, input_size, image_size)
