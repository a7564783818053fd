"""The policy's learning-rate schedule (`trainer.lr_schedule`): a linear warm-up, then constant, linear or cosine
decay to a floor.

The multiplier of the lr at the policy's `update`-th optimiser step (1-based) is transformers'
`get_{constant,linear,cosine}_schedule_with_warmup` multiplier at that step, with verl's and EasyR1's floor
(`min_lr_ratio`) under the decay:

    warm-up  (update <= W):  update / W
    decay    (update >= W):  p = (update - W) / (N - W),   N = the policy's updates in the run
        constant:  1
        linear:    r + (1 - r) * (1 - p)
        cosine:    r + (1 - r) * (1 + cos(pi * p)) / 2

Counting from 1 runs the first update at lr / W and the W-th at lr, and lands the last update on the floor
`r * lr`; transformers counts from 0, so its first update runs at lr 0 and its last above the floor. Past N
(a finished run resumed with more steps) the lr stays at the floor.

The multiplier is a function of the update count alone, which `LambdaLR` keeps in its state (`last_epoch`): the
checkpoint carries that count, so a resumed run continues the same curve. The function itself is a closure and is
not saved (LambdaLR saves only a callable object's attributes); the resumed run's config rebuilds it.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

LRSchedule = Literal["constant", "linear", "cosine"]
LR_SCHEDULES: tuple[str, ...] = ("constant", "linear", "cosine")


def lr_multiplier(update: int, schedule: str, warmup_steps: int, total_updates: int, min_lr_ratio: float) -> float:
    """The factor on the peak lr at the `update`-th optimiser step (1-based); see the module docstring.

    >>> lr_multiplier(1, "cosine", 0, 4, 0.0), lr_multiplier(4, "cosine", 0, 4, 0.0)
    (0.8535533905932737, 0.0)
    """
    if warmup_steps and update <= warmup_steps:
        return update / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (update - warmup_steps) / max(1, total_updates - warmup_steps))
    decay = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * decay


def lr_scheduler(
    optimizer: torch.optim.Optimizer, schedule: str, warmup_steps: int, total_updates: int, min_lr_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """A `LambdaLR` stepping `lr_multiplier`: its step count `s` (0 before the first update) is update `s + 1`."""

    def multiplier(step: int) -> float:
        return lr_multiplier(step + 1, schedule, warmup_steps, total_updates, min_lr_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
