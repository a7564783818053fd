"""A dataset's records cut into training, validation and test parts, and the record each world seed shows.

The rules are the `dataset` env's ("Seeds and the held-out split" in `sim.tasks.dataset`): the last `eval_fraction`
of the records is the test part, the `val_fraction` before it the validation part, the rest trains; a seed reads the
part of its range in `sim.seeds` (or the part `split` names), and within a part each epoch visits every record once,
in an order drawn from `(shuffle_seed, part, epoch)`.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from sim.errors import InputError
from sim.seeds import EVAL_SEED_BASE, VALIDATION_SEED_BASE, seed_split

SPLITS = ("auto", "train", "validation", "test", "all")
_BASE = {"train": 0, "validation": VALIDATION_SEED_BASE, "test": EVAL_SEED_BASE}
_STREAM = {"train": 0, "test": 1, "validation": 2}  # the training and test orders keep the streams they had alone


class RecordParts:
    """Record indices of each part, and `record(seed)`.

    Args:
        count: How many records there are.
        split: `"auto"` (a seed's range picks its part), a part's name (every seed reads it), or `"all"` (every record
            trains, none held out).
        eval_fraction: The fraction of records held out as the test part (at least one when > 0).
        val_fraction: The fraction held out as the validation part, just before the test part.
        shuffle: Visit each part in a shuffled order (a new one each epoch), or in file order.
        shuffle_seed: Seeds those orders.

    Raises:
        InputError: An unknown split, fractions that leave nothing to train on, or a named split with no records.
    """

    def __init__(
        self, count: int, split: str, eval_fraction: float, val_fraction: float, shuffle: bool, shuffle_seed: int
    ):
        if split not in SPLITS:
            raise InputError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        held = math.ceil(eval_fraction * count) if split != "all" and eval_fraction > 0 else 0
        kept = math.ceil(val_fraction * count) if split != "all" and val_fraction > 0 else 0
        if held + kept >= count:
            raise InputError(f"eval_fraction={eval_fraction} and val_fraction={val_fraction} hold out all {count} "
                             "records; nothing left to train on")  # fmt: skip
        self.split, self.shuffle, self.shuffle_seed = split, shuffle, shuffle_seed
        self.train = list(range(count - held - kept))
        self.validation = list(range(count - held - kept, count - held))
        self.test = list(range(count - held, count))
        if split == "test" and not self.test:
            raise InputError("split='test' needs test records; set eval_fraction > 0")
        if split == "validation" and not self.validation:
            raise InputError("split='validation' needs validation records; set val_fraction > 0")

    def record(self, seed: int) -> int:
        """The record a world reset with `seed` shows.

        Raises:
            InputError: A seed asking for a part that holds no record (a validation seed with `val_fraction` 0).
        """
        name = {"auto": seed_split(seed), "all": "train"}.get(self.split, self.split)  # "all": nothing held out
        part = getattr(self, name)
        if not part:  # a test seed with eval_fraction 0, a validation seed with val_fraction 0 (trainer.eval_every)
            fraction = "eval_fraction" if name == "test" else "val_fraction"
            raise InputError(f"seed {seed} asks for a {name} record, but none is held out: set {fraction} > 0")
        offset = seed - _BASE[name] if self.split == "auto" else seed
        epoch, position = divmod(int(offset), len(part))
        return part[int(self.order(name, epoch, len(part))[position])]

    def part_of(self, index: int) -> list[int]:
        """The part record `index` belongs to."""
        return next(p for p in (self.train, self.validation, self.test) if p and index <= p[-1])

    def order(self, part: str, epoch: int, size: int) -> np.ndarray:
        """The visiting order of a part in one epoch: a permutation of `range(size)`, each part's of its own stream."""
        if not self.shuffle:
            return np.arange(size)
        return _permutation(self.shuffle_seed % 2**63, _STREAM[part], epoch % 2**63, size)


@functools.lru_cache(maxsize=16)
def _permutation(seed: int, part: int, epoch: int, size: int) -> np.ndarray:
    return np.random.default_rng([seed, part, epoch]).permutation(size)
