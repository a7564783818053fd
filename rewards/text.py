"""Rewards that read only the completion text."""

from __future__ import annotations

import torch

from rewards.catalog import REWARDS
from rewards.parse import _ANSWER_TAG, _parse_region, parse_box, strip_think


@REWARDS.register("format")
def format_reward(texts: list[str], *, require_answer_tag: bool = True) -> torch.Tensor:
    """1.0 where a completion, after `strip_think`, is an answer in the expected shape, else 0.0.

    With `require_answer_tag`, the text must be exactly one `<answer>...</answer>` with nothing but whitespace around
    it, and its content must hold a box that `parse_box` accepts. Without it, `parse_box` must accept the text.

    Args:
        texts: R completions.
        require_answer_tag: whether the box has to sit in an answer tag.

    Returns:
        `[R]` float32 of 0.0 and 1.0.
    """
    if require_answer_tag:
        scores = [float(_is_tagged_box(text)) for text in texts]
    else:
        scores = [float(parse_box(text).box is not None) for text in texts]
    return torch.tensor(scores, dtype=torch.float32)  # [R]


def _is_tagged_box(text: str) -> bool:
    if not isinstance(text, str):
        return False
    body = strip_think(text).strip()
    tags = list(_ANSWER_TAG.finditer(body))
    if len(tags) != 2:
        return False
    open_tag, close_tag = tags
    if open_tag.group(1) or not close_tag.group(1) or open_tag.start() != 0 or close_tag.end() != len(body):
        return False
    return _parse_region(body[open_tag.end() : close_tag.start()]).box is not None
