"""The dataset env's answers: the hint that asks for one, the expert's, and why one scored low.

Coordinates in answers are in the units the env reads them in (`coordinates`, `rewards.coordinates`): pixels of the
image as the model sees it, or relative 0-1000 or 0-1. The hint names them; the expert writes them.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from rewards import REWARDS, answer_region, parse_box, parse_box_list, parse_choice, parse_number, parse_point
from rewards.coordinates import format_values

from .records import Record

BOX_ANSWER_REWARDS = ("box_iou", "box_giou", "box_size")  # answers parsed with parse_box
BOX_LIST_REWARDS = ("matched_iou", "detection_f1")  # answers parsed with parse_box_list, scored on `target_boxes`
# Rewards whose success is a threshold on their own score: name -> minimum score that counts.
_SUCCESS_AT = {"box_iou": 0.5, "exact_match": 1.0, "numeric_match": 1.0, "multiple_choice": 1.0}


def units_phrase(coordinates: str, width: int, height: int) -> str:
    """Where an answer's coordinates live, as the hint says it: "in pixels of the 64x64 image" (`width` x `height`,
    the image as the model sees it) or "in coordinates relative to the image, 0 to 1000"."""
    if coordinates == "pixels":
        return f"in pixels of the {width}x{height} image"
    return f"in coordinates relative to the image, 0 to {coordinates.split('-')[1]}"


def answer_hint(name: str, units: str) -> str:
    """One sentence saying how to answer a question scored by the reward `name`; `units` is `units_phrase`'s."""
    if name in BOX_ANSWER_REWARDS:
        return f"Answer with <answer>[x1, y1, x2, y2]</answer> {units}."
    if name in BOX_LIST_REWARDS:
        return f"Answer with <answer>[[x1, y1, x2, y2], ...]</answer>, one box per object ([] for none), {units}."
    if name == "point_in_box":
        return f"Answer with <answer>(x, y)</answer> {units}."
    if name == "numeric_match":
        return "Answer with a number in <answer></answer>."
    if name == "multiple_choice":
        return "Answer with the letter of your choice in <answer></answer>."
    return "Answer in a few words in <answer></answer>."


def format_answer(
    record: Record,
    box: torch.Tensor,
    box_list: torch.Tensor | None,
    number_offset: float = 0.0,
    coordinates: str = "pixels",
) -> str:
    """The record's target written as its reward parses it; `box` (`box_list`) is the target box (boxes) in the
    answer's `coordinates` units (whole numbers in pixels and 0-1000, three decimals in 0-1), and `number_offset` is
    added to a numeric answer (whole numbers stay whole, a `%` stays)."""
    name = record.reward
    if box_list is not None and name in BOX_LIST_REWARDS:
        listed = ", ".join(f"[{format_values(row, coordinates)}]" for row in box_list.tolist())
        return f"<answer>[{listed}]</answer>"
    if name == "point_in_box":  # the centre: the point itself for point targets, the box's centre for boxes
        x, y = ((box[0] + box[2]) / 2).item(), ((box[1] + box[3]) / 2).item()
        return f"<answer>({format_values([x, y], coordinates)})</answer>"
    if "target_box" in inspect.signature(REWARDS.get(name)).parameters:
        return f"<answer>[{format_values(box.tolist(), coordinates)}]</answer>"
    answer = record.answer if isinstance(record.answer, str) else record.answer[0]  # type: ignore[index]
    number = parse_number(answer) if name == "numeric_match" and number_offset else None
    if number is not None and number.value is not None:
        value = number.value + number_offset
        answer = (str(int(value)) if value.is_integer() else format(value, ".10g")) + ("%" if number.percent else "")
    return f"<answer>{answer}</answer>"


def low_score_reason(name: str, text: str, score: float, hit: bool | None) -> str:
    """Why an answer scored low: the parser's reason when nothing was read, else that it was wrong; "" if right."""
    if name in BOX_ANSWER_REWARDS:
        parsed = parse_box(text)
        unread = parsed.reason if parsed.box is None else ""
    elif name in BOX_LIST_REWARDS:
        listed = parse_box_list(text)
        unread = listed.reason if listed.boxes is None else ""
    elif name == "point_in_box":
        point = parse_point(text)
        unread = point.reason if point.point is None and parse_box(text).box is None else ""
    elif name == "numeric_match":
        number = parse_number(text)
        unread = number.reason if number.value is None else ""
    elif name == "multiple_choice":
        choice = parse_choice(text)
        unread = choice.reason if choice.letter is None else ""
    else:
        unread = "empty answer" if not answer_region(text).strip() else ""
    if unread:
        return unread
    if hit is True or (hit is None and score > 0):
        return ""
    return f"wrong answer ({name} = {score:.2f})"


def has_success(name: str) -> bool:
    """Whether the reward `name` has a natural notion of success (`successes` gives it)."""
    return name in _SUCCESS_AT or name in ("box_giou", "point_in_box", *BOX_LIST_REWARDS)


def successes(
    name: str, kwargs: Mapping[str, Any], scores: torch.Tensor, texts: list[str], targets: dict[str, Any]
) -> torch.Tensor | None:
    """`[K]` bool: which of K answers scored `scores` by the reward `name` (bound with `kwargs`) succeed (IoU >= 0.5
    for boxes, a hit for points, a match for text, every object found at IoU 0.5 for box lists); None for a reward
    without a notion of it."""
    if name in _SUCCESS_AT:
        return scores >= _SUCCESS_AT[name]
    if name == "point_in_box":
        return scores > 0
    options = {k: v for k, v in kwargs.items() if k != "iou_threshold"}
    if name == "box_giou":
        return REWARDS.get("box_iou")(texts, targets["target_box"], **options) >= 0.5
    if name in BOX_LIST_REWARDS:
        return REWARDS.get("detection_f1")(texts, targets["target_boxes"], iou_threshold=0.5, **options) >= 1.0
    return None
