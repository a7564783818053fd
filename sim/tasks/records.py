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

import contextlib
import gc
import inspect
import io
import json
import math
import os
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from struct import error as struct_error
from typing import Any, BinaryIO

from PIL import Image

from rewards import REWARDS, parse_choice, parse_number
from rewards.image_files import viewed_rgb, viewed_size
from sim.errors import InputError
from sim.tasks.columns import (
    CANDIDATES,
    UNIT_SCALE,
    Layout,
    check_units,
    find_columns,
    image_values,
    one_image,
    question_and_answer,
    to_xyxy,
    value_at,
)
from sim.tasks.parquet import read_parquet
from sim.tasks.record import MAX_TEXT_CHARS, NUMBER, Record, record_names
from sim.tasks.saved import read_saved

# The most pixels an image may hold: PIL's default decompression-bomb bound (`Image.MAX_IMAGE_PIXELS`, 1 GiB / 4 / 3),
# stated here so that a program that changes PIL's global does not change what a dataset accepts. A larger image is
# refused from its header, before decoding (a 20000x20000 PNG decodes to 1.2 GB of RGB).
MAX_IMAGE_PIXELS = 89_478_485
# The longest JSON line a dataset may hold, in bytes (room for an image embedded as base64), and the longest question or
# answer (`record.MAX_TEXT_CHARS`). Without them one line of a careless file (a document pasted into a question) costs gigabytes through its copies: decoded, parsed, tokenised. A
# line over the bound is refused without being read whole.
MAX_LINE_BYTES = 16 << 20
# How far outside its image a box or point may reach, in pixels: rounding in an annotation tool, not a wrong box.
BORDER_SLACK = 0.5

_NUMERIC = frozenset((int, float))


@dataclass
class Reading:
    """What reading one dataset needs besides its rows: the reward, the layout (columns, box format and units),
    the lenient list (None: strict), each image file's size (read once however many rows show it), and which
    split is read, by which option."""

    reward: str | None
    layout: Layout
    skipped: list[str] | None
    sizes: dict[Path, tuple[int, int]] = field(default_factory=dict)
    option: str = "hf_split"  # the option that chose the split read, for messages
    label: str | None = None  # the split, named in each row's name where the data's own splits are the env's parts

    def keep(self, records: list[Record], make: Any, *args: Any) -> None:
        """Append `make(*args)`'s record, or under the lenient reading note why it is bad."""
        try:
            records.append(make(*args))
        except InputError as error:
            if self.skipped is None:
                raise
            self.skipped.append(str(error))


def read_records(
    path: Path,
    reward: str | None,
    hf_split: str,
    skipped: list[str] | None = None,
    layout: Layout | None = None,
    hf_config: str | None = None,
    option: str = "hf_split",
    label: str | None = None,
) -> tuple[list[Record], Any]:
    """Validated records, and the table their embedded images are read from when shown (None when every image is
    a file).

    Args:
        path: A JSON-lines file (or a folder holding `data.jsonl`), a parquet file, a folder of parquet files laid
            out as a Hugging Face dataset repository, or a folder saved by `datasets`.
        reward: The reward every record is scored by, or None to pick one per record.
        hf_split: The split to read (of a saved `DatasetDict`, or of a repository's parquet files).
        skipped: None: a bad record raises. A list: a bad record is left out and its message appended here (the
            lenient reading); the data as a whole must still be readable and keep at least one record.
        layout: Which columns hold what, and the boxes' format and units (`sim.tasks.columns`); None: found.
        hf_config: The configuration a repository's README card declares, where it declares several.
        option: The option that names `hf_split` (`hf_validation_split` for the data's validation split...), for
            messages.
        label: The split, named in each row's name (`"d.parquet (split 'test') row 3"`), or None.

    Raises:
        InputError: The path does not exist, holds no (good) records, or a record is bad (the message names it).
    """
    if path.is_dir() and (path / "data.jsonl").is_file():
        path = path / "data.jsonl"
    if not path.exists():
        raise InputError(f"dataset path {path} does not exist")
    reading = Reading(reward, layout or Layout({}), skipped, option=option, label=label)
    if option != "hf_split" and not path.is_dir():
        raise InputError(
            f"{option}={hf_split!r} names a split of a repository folder or of a saved DatasetDict; {path} is one "
            "file (hold records out of it with val_fraction / eval_fraction)"
        )
    with _collector_paused():
        if path.is_dir() and not any((path / name).is_file() for name in _SAVED_MARKS):
            records, rows = read_parquet(path, hf_split, hf_config, reading, row_record)
        elif path.is_dir():
            records, rows = read_saved(path, hf_split, reading, row_record)
        elif path.suffix == ".parquet":
            records, rows = read_parquet(path, hf_split, hf_config, reading, row_record)
        else:
            records, rows = _read_jsonl(path, reading), None
    if not records and skipped:
        raise InputError(f"dataset {path}: every record is bad ({len(skipped)}; the first: {skipped[0]})")
    if not records:
        raise InputError(f"dataset {path} holds no records" + (f" in its split {label!r}" if label else ""))
    return records, rows


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused (and restored): reading keeps a few objects per row and frees few, so
    the collections that allocation triggers walk every record kept so far, again and again (half the CPU time of
    opening 200k parquet rows); records hold no reference cycles for it to find."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_SAVED_MARKS = ("dataset_dict.json", "state.json")  # what `save_to_disk` writes (a hub repository holds neither)


def _read_jsonl(path: Path, reading: Reading) -> list[Record]:
    records: list[Record] = []
    found: dict[frozenset[str], dict[str, str | None]] = {}  # the columns of each set of keys, found once
    with open(path, "rb") as file:
        for number, raw_line in _bounded_lines(file):
            if raw_line is None:
                error = f"{path.name} line {number}: longer than MAX_LINE_BYTES = {MAX_LINE_BYTES} bytes; refused without reading it whole"
                reading.keep(records, _refuse, error)
            elif raw_line.strip():
                reading.keep(records, _jsonl_record, path, number, raw_line, reading, found)
    return records


def _refuse(message: str) -> Record:
    raise InputError(message)


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
    path: Path, number: int, raw_line: bytes, reading: Reading, found: dict[frozenset[str], dict[str, str | None]]
) -> Record:
    """The record on line `number` of a JSON-lines file, its image file checked."""
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
    keys = frozenset(raw)
    if keys not in found:
        found[keys] = find_columns(keys, reading.layout, where, strict=False)
    return row_record(where, raw, found[keys], path.parent, reading)


def row_record(
    where: str,
    raw: Mapping[str, Any],
    found: Mapping[str, str | None],
    base: Path,
    reading: Reading,
    row: int | None = None,
    images: list[Any] | None = None,
) -> Record:
    """The record of one row whose columns are `found` (`sim.tasks.columns.find_columns`).

    Args:
        where: Names the row in errors.
        raw: The row's values (a table's may leave the image column out: then `images` gives it).
        found: Role -> column.
        base: The folder image paths are relative to.
        reading: The reward, the layout and the image files' sizes.
        row: The row's index in the table that embeds its image, or None when it cannot embed one (JSON lines).
        images: The row's images when `raw` leaves them out: paths, or None for each embedded image.
    """
    image_field = found["image"] or "image"
    value = value_at(raw, found["image"])
    if images is None:
        images = image_values(where, image_field, value)
    question, answer, question_field = question_and_answer(where, raw, found)
    if not isinstance(question, str) or not question.strip():
        if found["question"] is None and found["messages"] is None:
            raise InputError(
                f"{where}: field 'question' (or 'instruction') must be a non-empty string, got None; a question is "
                f"read from a column named one of {', '.join(CANDIDATES['question'])}, from chat 'messages', or from "
                "the column the option columns={question: NAME} names"
            )
        raise InputError(f"{where}: field {question_field!r} must be a non-empty string, got {question!r}")
    if not images:
        raise InputError(f"{where}: field {image_field!r} must be a path (a non-empty string), got {value!r}")
    question = one_image(where, image_field, question, len(images))
    image = images[0]
    if isinstance(image, Mapping) and image.get("bytes") is None:
        image = image.get("path")
    if isinstance(image, str):  # a file: it must exist and be an image, every box and point lie inside it
        file_path = Path(image) if os.path.isabs(image) else base / image
        if not file_path.is_file():
            raise InputError(f"{where}: field {image_field!r}: file {file_path} not found")
        return _sized(_record(where, raw, found, answer, question, str(file_path), reading), file_path, reading)
    if row is None:
        raise InputError(f"{where}: field {image_field!r} must be a path (a non-empty string), got {value!r}")
    return _record(where, raw, found, answer, question, row, reading)


def _sized(record: Record, file_path: Path, reading: Reading) -> Record:
    """A record whose image is the file `file_path` (found to exist) with the image's size from its header, and its
    boxes and point converted to its pixels where the data gave them normalised, and checked to lie inside it."""
    if file_path not in reading.sizes:
        reading.sizes[file_path] = image_file_size(file_path, record.where)
    size = reading.sizes[file_path]
    return replace(in_pixels(record, *size), size=size)


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
    for field_name, values in _shapes(record):
        xs, ys = values[0::2], values[1::2]
        if min(xs) < low_x or max(xs) > high_x or min(ys) < low_y or max(ys) > high_y:
            raise InputError(
                f"{record.where}: field {field_name!r} = {[round(v, 3) for v in values]} lies outside the "
                f"{width}x{height} image (coordinates are pixels of the original image)"
            )


def in_pixels(record: Record, width: int, height: int) -> Record:
    """The record with its box, boxes and point in pixels of its `width` x `height` image (normalised coordinates
    scaled by the image's size), checked to lie inside it (`check_inside`)."""
    scale = UNIT_SCALE[record.units]
    if scale is not None:
        sx, sy = width / scale, height / scale

        def scaled(values: tuple[float, ...] | None) -> Any:
            return None if values is None else tuple(v * (sx if i % 2 == 0 else sy) for i, v in enumerate(values))

        boxes = None if record.boxes is None else tuple(scaled(box) for box in record.boxes)
        record = replace(record, box=scaled(record.box), point=scaled(record.point), boxes=boxes, units="pixels")
    check_inside(record, width, height)
    return record


def _shapes(record: Record) -> list[tuple[str, tuple[float, ...]]]:
    """(field, coordinates) of every box and point of a record."""
    box, boxes, point = record.names
    shapes: list[tuple[str, tuple[float, ...]]] = []
    if record.box is not None:
        shapes.append((box, record.box))
    if record.point is not None:
        shapes.append((point, record.point))
    return shapes + [(f"{boxes}[{i}]", each) for i, each in enumerate(record.boxes or ())]


def _record(
    where: str,
    raw: Mapping[str, Any],
    found: Mapping[str, str | None],
    answer_value: Any,
    question: str,
    image: Any,
    reading: Reading,
) -> Record:
    """One validated `Record` from a row's values (its question and answer already read out)."""
    for name, value in ((found.get("question") or "question", question), (found["answer"] or "answer", answer_value)):
        texts = value if isinstance(value, list) else [value]
        chars = sum(len(text) for text in texts if isinstance(text, str))
        if chars > MAX_TEXT_CHARS:  # before any message shows the value
            raise InputError(
                f"{where}: field {name!r} holds {chars} characters, over MAX_TEXT_CHARS = {MAX_TEXT_CHARS}"
            )
    layout, reward = reading.layout, reading.reward
    names = record_names(found["box"] or "box", found["boxes"] or "boxes", found["point"] or "point")
    box = _box(where, names[0], value_at(raw, found["box"]), layout)
    boxes = _box_list(where, names[1], value_at(raw, found["boxes"]), layout)
    if box is not None and boxes is not None:
        raise InputError(
            f"{where}: give one of the fields {names[0]!r} (one object) and {names[1]!r} (several), not both"
        )
    point = _numbers(where, names[2], value_at(raw, found["point"]), 2)
    if point is not None:
        check_units(where, names[2], point, layout.box_units)
    answer = _answer(where, found["answer"] or "answer", answer_value)
    if box is None and boxes is None and point is None and answer is None:
        raise InputError(
            f"{where}: needs a target: one of the fields 'answer', 'box', 'boxes' or 'point' (or a column named "
            "solution, ground_truth, label or bbox, or chosen with the option columns)"
        )
    if reward is None:
        if box is not None:
            name = "box_iou"
        elif boxes is not None:
            name = "matched_iou"
        elif point is not None:
            name = "point_in_box"
        else:
            name = "numeric_match" if isinstance(answer, str) and NUMBER.fullmatch(answer.strip()) else "exact_match"
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
    return Record(where, image, question.strip(), box, point, answer, name, boxes, None, layout.box_units, names)


def _box(where: str, field_name: str, value: Any, layout: Layout) -> tuple[float, float, float, float] | None:
    box = _numbers(where, field_name, value, 4)
    if box is None:
        return None
    box = to_xyxy(where, field_name, box, layout.box_format)
    if not (box[0] < box[2] and box[1] < box[3]):
        raise InputError(
            f"{where}: field {field_name!r} must be [x1, y1, x2, y2] with x1 < x2 and y1 < y2, got {list(box)}"
        )
    check_units(where, field_name, box, layout.box_units)
    return box  # type: ignore[return-value]


def _box_list(
    where: str, field_name: str, value: Any, layout: Layout
) -> tuple[tuple[float, float, float, float], ...] | None:
    """The field 'boxes': a list of boxes; an empty list means there is nothing to find."""
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        raise InputError(f"{where}: field {field_name!r} must be a list of [x1, y1, x2, y2] boxes, got {value!r}")
    return tuple(_box(where, f"{field_name}[{i}]", box, layout) for i, box in enumerate(value))  # type: ignore[misc]


def _numbers(where: str, field_name: str, value: Any, count: int) -> tuple[float, ...] | None:
    if value is None:
        return None
    # Types compared exactly (a bool is no number); the sum is finite only when every value is (and not past 1e308).
    ok = isinstance(value, list | tuple) and len(value) == count and all(map(_NUMERIC.__contains__, map(type, value)))
    if not (ok and math.isfinite(sum(value))):
        raise InputError(f"{where}: field {field_name!r} must be a list of {count} finite numbers, got {value!r}")
    return tuple(map(float, value))


def _answer(where: str, field_name: str, value: Any) -> str | tuple[str, ...] | None:
    if value is None:
        return None
    message = f"{where}: field {field_name!r} must be text, a number or a list of texts, got {value!r}"
    if isinstance(value, bool):
        raise InputError(message)
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, list) and value and all(isinstance(v, str | int | float) for v in value):
        texts = tuple(str(v).strip() for v in value if not isinstance(v, bool))
        if len(texts) == len(value) and all(texts):
            return texts[0] if len(texts) == 1 else texts  # one accepted answer (ChartQA's labels): scored as one
    raise InputError(message)


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
