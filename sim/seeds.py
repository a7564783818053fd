"""Seed ranges: which world seeds train, which demonstrate, which are held out. One place, for every package.

A world's seed decides everything random about its episode (scene, target, dataset record), so disjoint ranges
keep training, demonstrations and evaluation on disjoint worlds. `sim` owns the numbers because envs read them
(the dataset env serves held-out records to held-out seeds) and `sim` cannot import `mmrl`.

| range                                  | used by                                                    |
| -------------------------------------- | ---------------------------------------------------------- |
| `[s * TRAIN_SEED_STRIDE, +TRAIN_SEED_STRIDE)` | training prompts of a run with `trainer.seed = s`    |
| `[SFT_SEED_BASE, +10**8)`              | the warm-start asset's supervised worlds (scripts/)        |
| `[DEMO_SEED_BASE, EVAL_SEED_BASE)`     | cold-start demonstrations (`sft.episodes`), warm-start validation |
| `[EVAL_SEED_BASE, ...)`                | held-out evaluation                                        |
"""

from __future__ import annotations

import hashlib

TRAIN_SEED_STRIDE = 100_000_000  # trainer.seed s trains on seeds from s * TRAIN_SEED_STRIDE up
SFT_SEED_BASE = 500_000_000
DEMO_SEED_BASE = 900_000_000
EVAL_SEED_BASE = 1_000_000_000  # a run would need a billion prompts to reach it, and `train_seeds` refuses to

assert SFT_SEED_BASE + 10**8 <= DEMO_SEED_BASE < EVAL_SEED_BASE


def train_seeds(step: int, prompts_per_step: int, group_size: int, base: int = 0) -> list[int]:
    """Per-world seeds of one training step: B prompts, each repeated G times (contiguous groups)."""
    first = base + step * prompts_per_step
    if first + prompts_per_step > EVAL_SEED_BASE:
        raise ValueError("training seeds would reach the held-out range")
    return [first + b for b in range(prompts_per_step) for _ in range(group_size)]


def eval_seeds(episodes: int, first: int = 0) -> list[int]:
    """Held-out seeds `first .. first + episodes - 1` of the held-out range."""
    return [EVAL_SEED_BASE + first + i for i in range(episodes)]


def stream_seed(*parts: object) -> int:
    """The generator seed of one named random stream, e.g. `stream_seed("demonstration noise", seed, episode)`: the
    first 8 bytes of a SHA-256 of `"mmrl <part> <part> ..."`. Streams derived from one run seed this way draw
    unrelated numbers, where seeding each with the run seed itself would hand them the same ones."""
    text = " ".join(str(part) for part in ("mmrl", *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
