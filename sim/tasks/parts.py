"""A dataset's records cut into training, validation and test parts, and the record each world seed shows.

The rules are the `dataset` env's ("Seeds and the held-out split" in `sim.tasks.dataset`): the last `eval_fraction`
of the records is the test part, the `val_fraction` before it the validation part, the rest trains; or, where the
data ships its own splits (`hf_validation_split`, `hf_test_split`), those splits' records are the parts
(`read_parts` reads them one after the other). A seed reads the part of its range in `sim.seeds` (or the part
`split` names), and within a part each epoch visits every record once, in an order drawn from
`(shuffle_seed, part, epoch)`.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import InputError
from sim.seeds import EVAL_SEED_BASE, VALIDATION_SEED_BASE, seed_split
from sim.tasks.columns import Layout
from sim.tasks.records import Record, read_records

SPLITS = ("auto", "train", "validation", "test", "all")
DEFAULT_EVAL_FRACTION = 0.1  # the dataset env's `eval_fraction` unless set
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
        named: (validation, test) record counts at the end of the records where they come from the data's own
            splits (`read_parts`; a part's fraction is then 0, the other's taken from the training split), else None.

    Raises:
        InputError: An unknown split, fractions that leave nothing to train on, or a named split with no records.
    """

    def __init__(
        self,
        count: int,
        split: str,
        eval_fraction: float,
        val_fraction: float,
        shuffle: bool,
        shuffle_seed: int,
        named: tuple[int, int] | None = None,
    ):
        if split not in SPLITS:
            raise InputError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        named_val, named_test = (0, 0) if named is None or split == "all" else named
        own = count - named_val - named_test  # the records of the data's training split (all of them, unnamed)
        held = math.ceil(eval_fraction * own) if split != "all" and eval_fraction > 0 else 0
        kept = math.ceil(val_fraction * own) if split != "all" and val_fraction > 0 else 0
        if held + kept >= own:
            raise InputError(f"eval_fraction={eval_fraction} and val_fraction={val_fraction} hold out all {own} "
                             "records; nothing left to train on")  # fmt: skip
        self.split, self.shuffle, self.shuffle_seed = split, shuffle, shuffle_seed
        # In record order: training, the fractions' validation and test, then the named splits' (one of each kind).
        self.train = list(range(own - held - kept))
        self.validation = list(range(own - held - kept, own - held)) or list(range(own, own + named_val))
        self.test = list(range(own - held, own)) or list(range(own + named_val, count))
        if split == "test" and not self.test:
            raise InputError("split='test' needs test records; set eval_fraction > 0 (or hf_test_split)")
        if split == "validation" and not self.validation:
            raise InputError(
                "split='validation' needs validation records; set val_fraction > 0 (or hf_validation_split)"
            )

    def record(self, seed: int) -> int:
        """The record a world reset with `seed` shows.

        Raises:
            InputError: A seed asking for a part that holds no record (a validation seed with `val_fraction` 0).
        """
        name = {"auto": seed_split(seed), "all": "train"}.get(self.split, self.split)  # "all": nothing held out
        part = getattr(self, name)
        if not part:  # a test seed with eval_fraction 0, a validation seed with val_fraction 0 (trainer.eval_every)
            fraction, option = (
                ("eval_fraction", "hf_test_split") if name == "test" else ("val_fraction", "hf_validation_split")
            )
            raise InputError(
                f"seed {seed} asks for a {name} record, but none is held out: set {fraction} > 0 (or {option})"
            )
        offset = seed - _BASE[name] if self.split == "auto" else seed
        epoch, position = divmod(int(offset), len(part))
        return part[int(self.order(name, epoch, len(part))[position])]

    def part_of(self, index: int) -> list[int]:
        """The part record `index` belongs to."""
        return next(p for p in (self.train, self.validation, self.test) if p and p[0] <= index <= p[-1])

    def order(self, part: str, epoch: int, size: int) -> np.ndarray:
        """The visiting order of a part in one epoch: a permutation of `range(size)`, each part's of its own stream."""
        if not self.shuffle:
            return np.arange(size)
        return _permutation(self.shuffle_seed % 2**63, _STREAM[part], epoch % 2**63, size)


@functools.lru_cache(maxsize=16)
def _permutation(seed: int, part: int, epoch: int, size: int) -> np.ndarray:
    return np.random.default_rng([seed, part, epoch]).permutation(size)


def check_named_splits(
    train: str, validation: str | None, test: str | None, eval_fraction: float, val_fraction: float
) -> float:
    """The test fraction to use (`eval_fraction`, or 0 when `hf_test_split` names the test part), after checking
    that each part is chosen once: a named split and a fraction for the same part are refused, naming both options
    (`eval_fraction` at its default, `DEFAULT_EVAL_FRACTION`, counts as not chosen), as are two options naming the
    same split.

    Raises:
        InputError: naming the options.
    """
    for option, value in (("hf_split", train), ("hf_validation_split", validation), ("hf_test_split", test)):
        if (value is not None or option == "hf_split") and (not isinstance(value, str) or not value):
            raise InputError(f"{option} must be a split's name (a non-empty string), got {value!r}")
    if validation is not None and val_fraction:
        raise InputError(
            f"hf_validation_split={validation!r} and val_fraction={val_fraction} both choose the validation records; "
            "give one of them"
        )
    if test is not None and eval_fraction not in (0, DEFAULT_EVAL_FRACTION):  # the default: not chosen
        raise InputError(
            f"hf_test_split={test!r} and eval_fraction={eval_fraction} both choose the test records; give one of them"
        )
    if validation is not None or test is not None:
        taken: dict[str, str] = {}  # split -> the option naming it
        for option, value in (("hf_split", train), ("hf_validation_split", validation), ("hf_test_split", test)):
            if value in taken:
                raise InputError(f"{taken[value]} and {option} both name the split {value!r}; each part is its own")
            if value is not None:
                taken[value] = option
    return 0.0 if test is not None else eval_fraction


def read_parts(
    path: Path,
    reward: str | None,
    splits: tuple[str, str | None, str | None],
    skipped: list[str] | None,
    layout: Layout,
    config: str | None,
) -> tuple[list[Record], Any, tuple[int, int] | None]:
    """The records of the data's training split, then of its validation and test splits where named, and the rows
    their embedded images are read from.

    Args:
        path: The data (`sim.tasks.records.read_records`).
        reward: The reward every record is scored by, or None to pick one per record.
        splits: The names of the training, validation and test splits (`hf_split`, `hf_validation_split`,
            `hf_test_split`; None: not read from the data's splits).
        skipped: The lenient reading's list of bad records' messages, or None (strict).
        layout: The columns, box format and units (each split read with the same).
        config: The README card's configuration (`hf_config`).

    Returns:
        The records, the rows (one table, or `StackedRows` of each split's), and (validation, test) record counts
        for `RecordParts` (None without named splits). Each row's name carries its split where splits are named.
    """
    train, validation, test = splits
    if validation is None and test is None:
        records, rows = read_records(path, reward, train, skipped, layout, config)
        return records, rows, None
    records: list[Record] = []
    tables: list[tuple[int, Any]] = []  # (first row, rows) of each split with embedded images
    offset, counts = 0, []
    for option, split in (("hf_split", train), ("hf_validation_split", validation), ("hf_test_split", test)):
        if split is None:
            counts.append(0)
            continue
        part, rows = read_records(path, reward, split, skipped, layout, config, option, label=split)
        if rows is not None:
            if offset:  # a row index into this split's table -> into the stacked tables
                part = [replace(r, image=r.image + offset) if isinstance(r.image, int) else r for r in part]
            tables.append((offset, rows))
            offset += len(rows)
        records += part
        counts.append(len(part))
    if not tables:
        rows = None
    else:  # one table from row 0 serves as it is
        rows = tables[0][1] if len(tables) == 1 and tables[0][0] == 0 else StackedRows(tables)
    return records, rows, (counts[1], counts[2])


class StackedRows:
    """Several splits' tables of embedded images as one, row `first + i` being row `i` of the table from `first`."""

    def __init__(self, tables: list[tuple[int, Any]]):
        self.tables = tables
        self._firsts = [first for first, _ in tables]

    def __len__(self) -> int:
        first, rows = self.tables[-1]
        return first + len(rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        first, rows = self.tables[bisect.bisect_right(self._firsts, index) - 1]
        return rows[index - first]
