"""The dataset env's `Record` (one validated row), and what `sim.tasks.records` and `sim.tasks.bulk` both build it
with: the text bound, the numeric-answer pattern and the shared column-name tuples."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

# The longest question or answer, in characters (about 25k tokens: longer is no prompt a VLM is trained on here).
MAX_TEXT_CHARS = 100_000
# An answer that is a number ("42", "-3.5", "1,200", "45%", "$3"): scored by `numeric_match` when no reward is given.
NUMBER = re.compile(r"[-+]?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?|[-+]?\.\d+%?")


@dataclass(slots=True)
class Record:
    """One validated record. Coordinates are in pixels of the original image, or in `units` of its size where the
    data gave them normalised and the image's size is known only once it is decoded (`in_pixels` converts).

    Nothing changes a record once it is made (`dataclasses.replace` makes new ones); the class is not frozen because
    a large dataset builds one per row at load, and a frozen dataclass's `__init__` takes three times as long."""

    where: str  # "data.jsonl line 3" or "row 3", for error messages
    image: str | int  # the image file's path, or the row of a table (`rows`) that holds it
    question: str
    box: tuple[float, float, float, float] | None
    point: tuple[float, float] | None
    answer: str | tuple[str, ...] | None
    reward: str  # the registered reward that scores it
    boxes: tuple[tuple[float, float, float, float], ...] | None = None  # every object to find (may be none)
    size: tuple[int, int] | None = None  # (W, H) of an image file, from its header; None for an embedded image
    units: str = "pixels"  # "pixels", or "0-1" / "0-1000" of the image's size until `in_pixels` converts
    names: tuple[str, str, str] = ("box", "boxes", "point")  # the data's columns of the box, boxes and point


@functools.lru_cache(maxsize=64)
def record_names(box: str, boxes: str, point: str) -> tuple[str, str, str]:
    """One tuple per set of column names, shared by the records that use it (200k rows hold one)."""
    return (box, boxes, point)
