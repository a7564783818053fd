"""The dataset env's records: JSON lines or a saved Hugging Face `datasets` folder -> validated `Record`s.

The format is described in `sim.tasks.dataset`'s docstring. Every bad record raises `ValueError` naming the line (or
row) and the field; images are opened only when a world shows them (`open_image`).
"""

from __future__ import annotations

import inspect
import io
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from rewards import REWARDS, parse_choice, parse_number

_NUMBER = re.compile(r"[-+]?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?|[-+]?\.\d+%?")


@dataclass(frozen=True)
class Record:
    """One validated record. Coordinates are in pixels of the original image."""

    where: str  # "data.jsonl line 3" or "row 3", for error messages
    image: str | int  # the image file's path, or the row of a saved `datasets` dataset whose Image column holds it
    question: str
    box: tuple[float, float, float, float] | None
    point: tuple[float, float] | None
    answer: str | tuple[str, ...] | None
    reward: str  # the registered reward that scores it
    boxes: tuple[tuple[float, float, float, float], ...] | None = None  # every object to find (may be none)


def read_records(path: Path, reward: str | None, hf_split: str) -> tuple[list[Record], Any]:
    """Validated records, and the `datasets.Dataset` they came from (None for JSON lines).

    Raises:
        ValueError: The path does not exist, holds no records, or a record is bad (the message names it).
    """
    if path.is_dir() and (path / "data.jsonl").is_file():
        path = path / "data.jsonl"
    if not path.exists():
        raise ValueError(f"dataset path {path} does not exist")
    if path.is_dir():
        records, rows = _read_hf(path, reward, hf_split)
    else:
        records, rows = _read_jsonl(path, reward), None
    if not records:
        raise ValueError(f"dataset {path} holds no records")
    return records, rows


def _read_jsonl(path: Path, reward: str | None) -> list[Record]:
    records = []
    base = path.parent
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            where = f"{path.name} line {number}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
            if not isinstance(raw, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(raw).__name__}")
            image = raw.get("image")
            if not isinstance(image, str) or not image:
                raise ValueError(f"{where}: field 'image' must be a path (a non-empty string), got {image!r}")
            file_path = Path(image) if os.path.isabs(image) else base / image
            if not file_path.is_file():
                raise ValueError(f"{where}: field 'image': file {file_path} not found")
            records.append(_record(where, raw, str(file_path), reward))
    return records


def _read_hf(path: Path, reward: str | None, hf_split: str) -> tuple[list[Record], Any]:
    try:
        import datasets
    except ImportError as error:
        raise ImportError(
            f"reading a saved Hugging Face dataset needs `datasets` (pip install 'mmrl[data]'): {error}"
        ) from error
    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as error:
        raise ValueError(f"{path} is neither a JSON-lines file nor a folder saved by datasets: {error}") from None
    if isinstance(loaded, datasets.DatasetDict):
        if hf_split not in loaded:
            raise ValueError(f"{path} has splits {', '.join(loaded)}; choose one with hf_split (got {hf_split!r})")
        loaded = loaded[hf_split]
    if "image" not in loaded.column_names:
        raise ValueError(f"{path}: no 'image' column (columns: {', '.join(loaded.column_names)})")
    # Validate from the other columns only: decoding (or even loading) every image here would cost a full pass.
    metadata = loaded.remove_columns(["image"]).to_list()
    embedded = isinstance(loaded.features["image"], datasets.Image)
    if embedded:
        import pyarrow.compute as pc

        missing = pc.is_null(loaded.data.column("image"))
        if pc.any(missing).as_py():
            row = pc.index(missing, True).as_py()
            raise ValueError(f"{path.name} row {row}: field 'image' is empty")
        images: list[Any] = list(range(len(metadata)))  # rows of `loaded`, decoded when first shown
    else:
        images = loaded["image"]
    records = []
    for index, (raw, image) in enumerate(zip(metadata, images)):
        where = f"{path.name} row {index}"
        if not embedded:
            if not isinstance(image, str) or not image:
                raise ValueError(f"{where}: field 'image' must be an Image feature or a path, got {image!r}")
            file_path = Path(image) if os.path.isabs(image) else path / image
            if not file_path.is_file():
                raise ValueError(f"{where}: field 'image': file {file_path} not found")
            image = str(file_path)
        records.append(_record(where, raw, image, reward))
    return records, loaded if embedded else None


def _record(where: str, raw: Mapping[str, Any], image: Any, reward: str | None) -> Record:
    """One validated `Record` from a raw mapping (a JSON object or a dataset row)."""
    question = raw.get("question", raw.get("instruction"))
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: field 'question' (or 'instruction') must be a non-empty string, got {question!r}")
    box = _box(where, "box", raw.get("box"))
    boxes = _box_list(where, raw.get("boxes"))
    if box is not None and boxes is not None:
        raise ValueError(f"{where}: give one of the fields 'box' (one object) and 'boxes' (several), not both")
    point = _numbers(where, "point", raw.get("point"), 2)
    answer = _answer(where, raw.get("answer"))
    if box is None and boxes is None and point is None and answer is None:
        raise ValueError(f"{where}: needs a target: one of the fields 'answer', 'box', 'boxes' or 'point'")
    if reward is None:
        if box is not None:
            name = "box_iou"
        elif boxes is not None:
            name = "matched_iou"
        elif point is not None:
            name = "point_in_box"
        else:
            name = "numeric_match" if isinstance(answer, str) and _NUMBER.fullmatch(answer.strip()) else "exact_match"
    else:
        name = reward
        params = inspect.signature(REWARDS.get(name)).parameters
        if "target_boxes" in params and boxes is None:
            raise ValueError(f"{where}: reward {name!r} needs a field 'boxes' (a list of [x1, y1, x2, y2])")
        if "target_box" in params and box is None and point is None:
            raise ValueError(f"{where}: reward {name!r} needs a field 'box' or 'point'")
        if "answer" in params and "target_box" not in params and answer is None:
            raise ValueError(f"{where}: reward {name!r} needs a field 'answer'")
        if not {"answer", "target_box", "target_boxes"} & set(params):
            raise ValueError(
                f"reward {name!r} reads none of 'target_box', 'target_boxes' and 'answer'; the dataset env cannot "
                "feed it"
            )
        if name == "numeric_match" and not isinstance(answer, str):
            raise ValueError(f"{where}: reward 'numeric_match' needs one answer, got a list")
        if name == "numeric_match" and parse_number(answer).value is None:
            raise ValueError(f"{where}: field 'answer' = {answer!r} holds no number for reward 'numeric_match'")
        if name == "multiple_choice" and (not isinstance(answer, str) or parse_choice(answer).letter is None):
            raise ValueError(f"{where}: field 'answer' = {answer!r} is no choice letter for reward 'multiple_choice'")
    return Record(where, image, question.strip(), box, point, answer, name, boxes)


def _box(where: str, field: str, value: Any) -> tuple[float, float, float, float] | None:
    box = _numbers(where, field, value, 4)
    if box is not None and not (box[0] < box[2] and box[1] < box[3]):
        raise ValueError(
            f"{where}: field {field!r} must be [x1, y1, x2, y2] with x1 < x2 and y1 < y2, got {list(box)}"
        )
    return box  # type: ignore[return-value]


def _box_list(where: str, value: Any) -> tuple[tuple[float, float, float, float], ...] | None:
    """The field 'boxes': a list of [x1, y1, x2, y2] boxes; an empty list means there is nothing to find."""
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        raise ValueError(f"{where}: field 'boxes' must be a list of [x1, y1, x2, y2] boxes, got {value!r}")
    return tuple(_box(where, f"boxes[{i}]", box) for i, box in enumerate(value))  # type: ignore[misc]


def _numbers(where: str, field: str, value: Any, count: int) -> tuple[float, ...] | None:
    if value is None:
        return None
    ok = isinstance(value, list | tuple) and len(value) == count
    ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    if not ok:
        raise ValueError(f"{where}: field {field!r} must be a list of {count} finite numbers, got {value!r}")
    return tuple(float(v) for v in value)


def _answer(where: str, value: Any) -> str | tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{where}: field 'answer' must be text, a number or a list of texts, got {value!r}")
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value):
        return tuple(v.strip() for v in value)
    raise ValueError(f"{where}: field 'answer' must be text, a number or a list of texts, got {value!r}")


def open_image(value: Any, rows: Any) -> Image.Image:
    """A record's image as RGB: from a path, a `datasets` row index (its Image column), bytes or a PIL image."""
    if isinstance(value, int) and rows is not None:
        value = rows[value]["image"]
    if isinstance(value, dict):
        value = io.BytesIO(value["bytes"]) if value.get("bytes") is not None else value.get("path")
    if isinstance(value, Image.Image):
        return value.convert("RGB")
    with Image.open(value) as image:
        return image.convert("RGB")
