"""Box coordinates as a model family writes them, brought to pixels of the image the reward compares against.

Vision-language model families answer boxes in different units (`mmrl.policy.families` holds each family's, with
its source): absolute pixels (Qwen2.5-VL), relative 0-1000 (Qwen2-VL, Qwen3-VL), relative 0-1 (SmolVLM). A reward
that reads a 0-1000 box as pixels scores a correct answer near zero, so the env converts first.
"""

from __future__ import annotations

import torch

COORDINATES = {"pixels": None, "0-1000": 1000.0, "0-1": 1.0}  # name -> the full image side in those units


def boxes_to_pixels(boxes: torch.Tensor, coordinates: str, width: int, height: int) -> torch.Tensor:
    """`[N, 4]` boxes `[x1, y1, x2, y2]` in `coordinates` units as pixels of a `width` x `height` image (NaN rows,
    unparsed answers, stay NaN).

    Raises:
        ValueError: naming the valid conventions.
    """
    if coordinates not in COORDINATES:
        raise ValueError(f"unknown coordinates {coordinates!r}; choose one of {', '.join(COORDINATES)}")
    full = COORDINATES[coordinates]
    if full is None:
        return boxes
    scale = boxes.new_tensor([width, height, width, height]) / full
    return boxes * scale
