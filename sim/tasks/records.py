"""The dataset env's records: JSON lines or a saved Hugging Face `datasets` folder -> validated `Record`s.

The format is described in `sim.tasks.dataset`'s docstring. Every bad record raises `sim.errors.InputError` (a
`ValueError`) naming the line (or row) and the field. Image files are checked when the data loads, from their headers
(and, for PNG, their chunks' checksums; nothing is decoded): they must exist, be images, hold at most
`MAX_IMAGE_PIXELS` pixels, and every box and point must lie inside them as a viewer shows the image (EXIF orientation
applied). Images are decoded only when a world shows them (`open_image`, converted by `rewards.image_files.viewed_rgb`);
images embedded in a saved `datasets` folder are checked then. A JSON line is at most `MAX_LINE_BYTES` long and a
question or answer at most `MAX_TEXT_CHARS` characters.
"""

from __future__ import annotations

import inspect
import io
import json
import math
import os
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from struct import error as struct_error
from typing import Any, BinaryIO

from PIL import Image

from rewards import REWARDS, parse_choice, parse_number
from rewards.image_files import viewed_rgb, viewed_size
from sim.errors import InputError

# The most pixels an image may hold: PIL's default decompression-bomb bound (`Image.MAX_IMAGE_PIXELS`, 1 GiB / 4 / 3),
# stated here so that a program that changes PIL's global does not change what a dataset accepts. A larger image is
# refused from its header, before decoding (a 20000x20000 PNG decodes to 1.2 GB of RGB).
MAX_IMAGE_PIXELS = 89_478_485
# The longest JSON line a dataset may hold, in bytes (room for an image embedded as base64), and the longest question or
# answer, in characters (about 25k tokens: longer is no prompt a VLM is trained on here). Without them one line of a
# careless file (a document pasted into a question) costs gigabytes through its copies: decoded, parsed, tokenised. A
# line over the bound is refused without being read whole.
MAX_LINE_BYTES = 16 << 20
MAX_TEXT_CHARS = 100_000
# How far outside its image a box or point may reach, in pixels: rounding in an annotation tool, not a wrong box.
BORDER_SLACK = 0.5

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
    size: tuple[int, int] | None = None  # (W, H) of an image file, from its header; None for an embedded image


def read_records(
    path: Path, reward: str | None, hf_split: str, skipped: list[str] | None = None
) -> tuple[list[Record], Any]:
    """Validated records, and the `datasets.Dataset` they came from (None for JSON lines).

    Args:
        path: A JSON-lines file, a folder holding `data.jsonl`, or a folder saved by `datasets`.
        reward: The reward every record is scored by, or None to pick one per record.
        hf_split: The split of a saved `DatasetDict` to read.
        skipped: None: a bad record raises. A list: a bad record is left out and its message appended here (the
            lenient reading); the data as a whole must still be readable and keep at least one record.

    Raises:
        InputError: The path does not exist, holds no (good) records, or a record is bad (the message names it).
    """
    if path.is_dir() and (path / "data.jsonl").is_file():
        path = path / "data.jsonl"
    if not path.exists():
        raise InputError(f"dataset path {path} does not exist")
    if path.is_dir():
        records, rows = _read_hf(path, reward, hf_split, skipped)
    else:
        records, rows = _read_jsonl(path, reward, skipped), None
    if not records and skipped:
        raise InputError(f"dataset {path}: every record is bad ({len(skipped)}; the first: {skipped[0]})")
    if not records:
        raise InputError(f"dataset {path} holds no records")
    return records, rows


def _read_jsonl(path: Path, reward: str | None, skipped: list[str] | None) -> list[Record]:
    records = []
    sizes: dict[Path, tuple[int, int]] = {}  # each image file's header read once, however many records show it
    with open(path, "rb") as file:
        for number, raw_line in _bounded_lines(file):
            if raw_line is not None and not raw_line.strip():
                continue
            try:
                if raw_line is None:
                    raise InputError(
                        f"{path.name} line {number}: longer than MAX_LINE_BYTES = {MAX_LINE_BYTES} bytes; refused "
                        "without reading it whole"
                    )
                records.append(_jsonl_record(path, number, raw_line, reward, sizes))
            except InputError as error:
                if skipped is None:
                    raise
                skipped.append(str(error))
    return records


def _bounded_lines(file: BinaryIO) -> Iterator[tuple[int, bytes | None]]:
    """`(line number, line)` of a binary file, None for a line over `MAX_LINE_BYTES` (skipped in pieces, never held)."""
    number = 0
    while line := file.readline(MAX_LINE_BYTES + 2):  # the bound, a newline, and one byte more to see it overrun
        number += 1
        if len(line.rstrip(b"\r\n")) <= MAX_LINE_BYTES:
            yield number, line
            continue
        while line and not line.endswith(b"\n"):
            line = file.readline(1 << 20)
        yield number, None


def _jsonl_record(
    path: Path, number: int, raw_line: bytes, reward: str | None, sizes: dict[Path, tuple[int, int]]
) -> Record:
    """The record on line `number` of a JSON-lines file, its image file checked (`sizes` caches their sizes)."""
    where = f"{path.name} line {number}"
    try:
        line = raw_line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(
            f"{where}: not UTF-8 text (byte 0x{raw_line[error.start]:02x} at column {error.start + 1})"
        ) from None
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as error:
        raise InputError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
    except (ValueError, RecursionError) as error:  # a 5000-digit number, arrays nested 100k deep
        raise InputError(f"{where}: not readable JSON ({type(error).__name__}: {error})") from None
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    image = raw.get("image")
    if not isinstance(image, str) or not image:
        raise InputError(f"{where}: field 'image' must be a path (a non-empty string), got {image!r}")
    file_path = Path(image) if os.path.isabs(image) else path.parent / image
    return _file_record(where, raw, file_path, reward, sizes)


def image_file_size(path: Path, where: str) -> tuple[int, int]:
    """(W, H) of an image file as a viewer shows it, from its header, after checking that it is an image of at most
    `MAX_IMAGE_PIXELS` pixels and, for PNG, that its chunks are all there and their checksums hold (`Image.verify`;
    nothing decoded). The EXIF orientation is applied (`rewards.image_files.viewed_size`): boxes drawn on the upright
    photo are checked against the upright size.

    Raises:
        InputError: naming `where`, the field 'image', the file and what is wrong with it.
    """
    prefix = f"{where}: field 'image': {path}"
    try:
        with warnings.catch_warnings():
            # Between PIL's bound and twice it PIL only warns; the check below refuses those with their size.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                width, height = image.size
                viewed = viewed_size(image)  # before `verify`, which leaves the file unreadable
                if width * height > MAX_IMAGE_PIXELS:
                    raise InputError(
                        f"{prefix} is {width}x{height} pixels ({width * height}), above the limit of "
                        f"{MAX_IMAGE_PIXELS} (PIL's decompression-bomb bound); refused before decoding"
                    )
                image.verify()
    except Image.DecompressionBombError as error:  # refused by PIL from the header: its message gives the size
        pixels = re.search(r"\((\d+) pixels\)", str(error))
        size = f"{pixels.group(1)} pixels" if pixels else str(error)
        raise InputError(
            f"{prefix} is {size}, above the limit of {MAX_IMAGE_PIXELS} (PIL's decompression-bomb bound); refused "
            "before decoding"
        ) from None
    except Image.UnidentifiedImageError:
        raise InputError(f"{prefix} is not an image PIL can read") from None
    except InputError:
        raise
    except (OSError, SyntaxError, ValueError, struct_error) as error:  # PIL's plugins raise all of these
        detail = str(error) or type(error).__name__
        raise InputError(f"{prefix} is truncated or broken ({detail})") from None
    return viewed


def check_inside(record: Record, width: int, height: int) -> None:
    """Refuse a record whose box, boxes or point reach outside its `width` x `height` image (pixel edges: a box may
    end at x2 = width), allowing `BORDER_SLACK` pixels of rounding."""
    low_x, low_y, high_x, high_y = -BORDER_SLACK, -BORDER_SLACK, width + BORDER_SLACK, height + BORDER_SLACK
    shapes: list[tuple[str, tuple[float, ...]]] = []
    if record.box is not None:
        shapes.append(("box", record.box))
    if record.point is not None:
        shapes.append(("point", record.point))
    shapes += [(f"boxes[{i}]", box) for i, box in enumerate(record.boxes or ())]
    for field, values in shapes:
        xs, ys = values[0::2], values[1::2]
        if min(xs) < low_x or max(xs) > high_x or min(ys) < low_y or max(ys) > high_y:
            raise InputError(
                f"{record.where}: field {field!r} = {[round(v, 3) for v in values]} lies outside the "
                f"{width}x{height} image (coordinates are pixels of the original image)"
            )


def _read_hf(path: Path, reward: str | None, hf_split: str, skipped: list[str] | None) -> tuple[list[Record], Any]:
    try:
        import datasets
    except ImportError as error:
        raise ImportError(
            f"reading a saved Hugging Face dataset needs `datasets` (pip install 'mmrl[data]'): {error}"
        ) from error
    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as error:
        raise InputError(f"{path} is neither a JSON-lines file nor a folder saved by datasets: {error}") from None
    if isinstance(loaded, datasets.DatasetDict):
        if hf_split not in loaded:
            raise InputError(f"{path} has splits {', '.join(loaded)}; choose one with hf_split (got {hf_split!r})")
        loaded = loaded[hf_split]
    if "image" not in loaded.column_names:
        raise InputError(f"{path}: no 'image' column (columns: {', '.join(loaded.column_names)})")
    # Validate from the other columns only: decoding (or even loading) every image here would cost a full pass.
    metadata = loaded.remove_columns(["image"]).to_list()
    embedded = isinstance(loaded.features["image"], datasets.Image)
    if embedded:
        import pyarrow.compute as pc

        missing = pc.is_null(loaded.data.column("image"))
        if pc.any(missing).as_py():
            row = pc.index(missing, True).as_py()
            raise InputError(f"{path.name} row {row}: field 'image' is empty")
        images: list[Any] = list(range(len(metadata)))  # rows of `loaded`, decoded when first shown
    else:
        images = loaded["image"]
    records = []
    sizes: dict[Path, tuple[int, int]] = {}
    for index, (raw, image) in enumerate(zip(metadata, images)):
        try:
            records.append(_hf_record(path, index, raw, image, embedded, reward, sizes))
        except InputError as error:
            if skipped is None:
                raise
            skipped.append(str(error))
    return records, loaded if embedded else None


def _hf_record(
    path: Path,
    index: int,
    raw: Mapping[str, Any],
    image: Any,
    embedded: bool,
    reward: str | None,
    sizes: dict[Path, tuple[int, int]],
) -> Record:
    """Row `index` of a saved `datasets` folder as a record; an image file it names is checked (an embedded image
    is checked when first shown)."""
    where = f"{path.name} row {index}"
    if embedded:
        return _record(where, raw, image, reward)
    if not isinstance(image, str) or not image:
        raise InputError(f"{where}: field 'image' must be an Image feature or a path, got {image!r}")
    file_path = Path(image) if os.path.isabs(image) else path / image
    return _file_record(where, raw, file_path, reward, sizes)


def _file_record(
    where: str, raw: Mapping[str, Any], file_path: Path, reward: str | None, sizes: dict[Path, tuple[int, int]]
) -> Record:
    """The record of a row whose image is a file: the file must exist, and every box or point lie inside the image.

    `sizes` caches each file's (W, H) across the rows that share it, so a file's header is read once.
    """
    if not file_path.is_file():
        raise InputError(f"{where}: field 'image': file {file_path} not found")
    record = _record(where, raw, str(file_path), reward)
    if file_path not in sizes:
        sizes[file_path] = image_file_size(file_path, where)
    check_inside(record, *sizes[file_path])
    return replace(record, size=sizes[file_path])


def _record(where: str, raw: Mapping[str, Any], image: Any, reward: str | None) -> Record:
    """One validated `Record` from a raw mapping (a JSON object or a dataset row)."""
    question = raw.get("question", raw.get("instruction"))
    for field, value in (("question", question), ("answer", raw.get("answer"))):
        texts = value if isinstance(value, list) else [value]
        chars = sum(len(text) for text in texts if isinstance(text, str))
        if chars > MAX_TEXT_CHARS:  # before any message shows the value
            raise InputError(
                f"{where}: field {field!r} holds {chars} characters, over MAX_TEXT_CHARS = {MAX_TEXT_CHARS}"
            )
    if not isinstance(question, str) or not question.strip():
        raise InputError(f"{where}: field 'question' (or 'instruction') must be a non-empty string, got {question!r}")
    box = _box(where, "box", raw.get("box"))
    boxes = _box_list(where, raw.get("boxes"))
    if box is not None and boxes is not None:
        raise InputError(f"{where}: give one of the fields 'box' (one object) and 'boxes' (several), not both")
    point = _numbers(where, "point", raw.get("point"), 2)
    answer = _answer(where, raw.get("answer"))
    if box is None and boxes is None and point is None and answer is None:
        raise InputError(f"{where}: needs a target: one of the fields 'answer', 'box', 'boxes' or 'point'")
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
            raise InputError(f"{where}: reward {name!r} needs a field 'boxes' (a list of [x1, y1, x2, y2])")
        if "target_box" in params and box is None and point is None:
            raise InputError(f"{where}: reward {name!r} needs a field 'box' or 'point'")
        if "answer" in params and "target_box" not in params and answer is None:
            raise InputError(f"{where}: reward {name!r} needs a field 'answer'")
        if not {"answer", "target_box", "target_boxes"} & set(params):
            raise InputError(
                f"reward {name!r} reads none of 'target_box', 'target_boxes' and 'answer'; the dataset env cannot "
                "feed it"
            )
        if name == "numeric_match" and not isinstance(answer, str):
            raise InputError(f"{where}: reward 'numeric_match' needs one answer, got a list")
        if name == "numeric_match" and parse_number(answer).value is None:
            raise InputError(f"{where}: field 'answer' = {answer!r} holds no number for reward 'numeric_match'")
        if name == "multiple_choice" and (not isinstance(answer, str) or parse_choice(answer).letter is None):
            raise InputError(f"{where}: field 'answer' = {answer!r} is no choice letter for reward 'multiple_choice'")
    return Record(where, image, question.strip(), box, point, answer, name, boxes)


def _box(where: str, field: str, value: Any) -> tuple[float, float, float, float] | None:
    box = _numbers(where, field, value, 4)
    if box is not None and not (box[0] < box[2] and box[1] < box[3]):
        raise InputError(
            f"{where}: field {field!r} must be [x1, y1, x2, y2] with x1 < x2 and y1 < y2, got {list(box)}"
        )
    return box  # type: ignore[return-value]


def _box_list(where: str, value: Any) -> tuple[tuple[float, float, float, float], ...] | None:
    """The field 'boxes': a list of [x1, y1, x2, y2] boxes; an empty list means there is nothing to find."""
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        raise InputError(f"{where}: field 'boxes' must be a list of [x1, y1, x2, y2] boxes, got {value!r}")
    return tuple(_box(where, f"boxes[{i}]", box) for i, box in enumerate(value))  # type: ignore[misc]


def _numbers(where: str, field: str, value: Any, count: int) -> tuple[float, ...] | None:
    if value is None:
        return None
    ok = isinstance(value, list | tuple) and len(value) == count
    ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    if not ok:
        raise InputError(f"{where}: field {field!r} must be a list of {count} finite numbers, got {value!r}")
    return tuple(float(v) for v in value)


def _answer(where: str, value: Any) -> str | tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise InputError(f"{where}: field 'answer' must be text, a number or a list of texts, got {value!r}")
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value):
        return tuple(v.strip() for v in value)
    raise InputError(f"{where}: field 'answer' must be text, a number or a list of texts, got {value!r}")


def open_image(value: Any, rows: Any) -> Image.Image:
    """A record's image as RGB as a viewer shows it (`rewards.image_files.viewed_rgb`: upright, transparency on white,
    16-bit scaled): from a path, a `datasets` row index (its Image column), bytes or a PIL image."""
    if isinstance(value, int) and rows is not None:
        value = rows[value]["image"]
    if isinstance(value, dict):
        value = io.BytesIO(value["bytes"]) if value.get("bytes") is not None else value.get("path")
    if isinstance(value, Image.Image):
        return viewed_rgb(value)
    with Image.open(value) as image:
        return viewed_rgb(image)


def image_size_of(record: Record, rows: Any) -> tuple[int, int]:
    """(W, H) of a record's image: from the file's header (read when the data loaded), or from an embedded image's
    header (PIL reads the size without decoding the pixels)."""
    if record.size is not None:
        return record.size
    value = record.image
    if isinstance(value, int) and rows is not None:
        value = rows[value]["image"]
    if isinstance(value, dict):
        value = io.BytesIO(value["bytes"]) if value.get("bytes") is not None else value.get("path")
    if isinstance(value, Image.Image):
        return viewed_size(value)
    try:
        with Image.open(value) as image:
            return viewed_size(image)
    except Exception as error:  # as when the image is shown: name the record
        raise InputError(f"{record.where}: field 'image': cannot read the image: {error}") from error


def fit_pixels(width: int, height: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(W', H') of an image of `width` x `height` resized as Qwen-VL's processors do (qwen-vl-utils' `smart_resize`):
    both sides multiples of `factor` (the vision tower's patch x merge size), the area within
    [`min_pixels`, `max_pixels`], the aspect ratio kept as closely as that allows. An image already on the grid and
    within the bounds keeps its size, so a Qwen-VL processor given the result resizes it no further.

    Raises:
        InputError: An aspect ratio above 200 (qwen-vl-utils refuses those too).
    """
    if max(width, height) / min(width, height) > 200:
        raise InputError(f"a {width}x{height} image has an aspect ratio above 200; Qwen-VL's resize refuses it")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return w_bar, h_bar
