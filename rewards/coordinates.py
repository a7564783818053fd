"""Coordinates as a model family writes them, brought to pixels of the image the reward compares against (and back).

Vision-language model families answer boxes and click points in different units (`mmrl.families` holds each
family's, with its source): absolute pixels of the image *as the model saw it* after its processor resized it
(Qwen2.5-VL), relative 0-1000 (Qwen2-VL, Qwen3-VL, Gemma 3 as prompted), relative 0-1 (SmolVLM). A reward that reads
a 0-1000 box as pixels scores a correct answer near zero, so envs convert first; an env's scripted expert writes its
answers in the same units with `from_pixels`.

Values are `[..., 2k]` tensors whose last dimension alternates x and y: a box `[x1, y1, x2, y2]`, a point `[x, y]`.
NaN rows (answers that did not parse) stay NaN.
"""

from __future__ import annotations

import torch

COORDINATES = {"pixels": None, "0-1000": 1000.0, "0-1": 1.0}  # name -> the full image side in those units
# What an instruction adds so a model is told the units (nothing for pixels: the image itself is the scale).
HINTS = {"pixels": "", "0-1000": " Coordinates are relative, 0 to 1000.", "0-1": " Coordinates are relative, 0 to 1."}


def check_coordinates(coordinates: str, input_size: int = 0) -> None:
    """Raise a ValueError naming the option (`coordinates`, `input_size`) when either is not valid."""
    if coordinates not in COORDINATES:
        raise ValueError(f"coordinates must be one of {', '.join(COORDINATES)}, got {coordinates!r}")
    if isinstance(input_size, bool) or not isinstance(input_size, int) or input_size < 0:
        raise ValueError(f"input_size must be an int >= 0 (0: the env's image size), got {input_size!r}")


def _scale(coordinates: str, width: int, height: int, input_size: int) -> torch.Tensor:
    """`[2]` the factors (x, y) that take values in `coordinates` units to pixels of a `width` x `height` image."""
    check_coordinates(coordinates, input_size)
    full = COORDINATES[coordinates]
    if full is None:  # pixels of the image the model saw: its side is input_size (square envs), or the image's own
        side_x, side_y = (input_size, input_size) if input_size else (width, height)
    else:
        side_x = side_y = full
    return torch.tensor([width / side_x, height / side_y], dtype=torch.float64)


def to_pixels(values: torch.Tensor, coordinates: str, width: int, height: int, input_size: int = 0) -> torch.Tensor:
    """`[..., 2k]` x/y values written in `coordinates` units as pixels of a `width` x `height` image.

    Args:
        values: `[..., 2k]` boxes `[x1, y1, x2, y2]` or points `[x, y]` (x and y alternating).
        coordinates: "pixels", "0-1000" or "0-1".
        width, height: the image the reward compares against, in pixels.
        input_size: with "pixels", the side of the (square) image the model saw after its processor resized it;
            0: the same as the image's.

    Raises:
        ValueError: naming the option that is not valid.
    """
    scale = _scale(coordinates, width, height, input_size).repeat(values.shape[-1] // 2)  # [2k]
    if bool((scale == 1).all()):
        return values
    return values * scale.to(values.dtype)


def from_pixels(values: torch.Tensor, coordinates: str, width: int, height: int, input_size: int = 0) -> torch.Tensor:
    """The inverse of `to_pixels`: pixels of a `width` x `height` image written in `coordinates` units."""
    scale = _scale(coordinates, width, height, input_size).repeat(values.shape[-1] // 2)  # [2k]
    return values / scale.to(values.dtype)


def boxes_to_pixels(
    boxes: torch.Tensor, coordinates: str, width: int, height: int, input_size: int = 0
) -> torch.Tensor:
    """`[N, 4]` boxes `[x1, y1, x2, y2]` in `coordinates` units as pixels (`to_pixels`)."""
    return to_pixels(boxes, coordinates, width, height, input_size)


def format_values(values: list[float], coordinates: str) -> str:
    """Values as an answer writes them: whole numbers in pixels and 0-1000, three decimals in 0-1."""
    if coordinates == "0-1":
        return ", ".join(f"{v:.3f}" for v in values)
    return ", ".join(str(round(v)) for v in values)
