"""Reward functions that score model outputs, text and images, for RL on vision-language models.

Parsers read answers out of untrusted completions (malformed text scores zero with a reason, never raises), and
pure tensor rewards are registered in `REWARDS`. The package needs only torch and imports nothing from `sim` or
`mmrl`, so it is usable alone: `from rewards import box_iou`.
"""

from rewards.box import box_iou
from rewards.catalog import REWARDS
from rewards.parse import BoxParse, extract_answer, parse_box, parse_boxes, strip_think
from rewards.registry import Registry
from rewards.text import format_reward

__all__ = [
    "REWARDS",
    "BoxParse",
    "Registry",
    "box_iou",
    "extract_answer",
    "format_reward",
    "parse_box",
    "parse_boxes",
    "strip_think",
]
