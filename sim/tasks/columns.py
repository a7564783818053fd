"""Which column of a user's dataset is the question, the answer, the box or the image, and their values read out.

Public datasets name the same thing differently (Geometry3K's `problem`, ChartQA's `query` and `label`, RefCOCO's
`bbox`, TRL's chat `messages`), so the dataset env finds each role among the usual names (`CANDIDATES`) when exactly
one is present, and takes a `columns` mapping (role -> column) where several are or the data uses another name.
Everything here raises `sim.errors.InputError` naming the dataset (or row) and the column.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sim.errors import InputError

BoxFormat = Literal["xyxy", "xywh"]
BoxUnits = Literal["pixels", "0-1", "0-1000"]
BOX_FORMATS = ("xyxy", "xywh")
UNIT_SCALE = {"pixels": None, "0-1": 1.0, "0-1000": 1000.0}  # the value a coordinate at the image's far edge takes

# Role -> the column names it is found under, without options. A dotted name reads a field of a struct column
# (verl's `reward_model.ground_truth`); it is taken only when no plain candidate is there.
CANDIDATES: dict[str, tuple[str, ...]] = {
    "question": ("prompt", "problem", "question", "query", "instruction"),
    "answer": ("answer", "solution", "ground_truth", "label", "reward_model.ground_truth"),
    "box": ("bbox", "box"),
    "boxes": ("boxes",),
    "point": ("point",),
    "image": ("images", "image"),
    "messages": ("messages", "conversations"),
}
ROLES = tuple(CANDIDATES)
IMAGE_MARK = "<image>"  # where an image stands in the text (LLaVA's, EasyR1's and TRL's placeholder)
_MARK = re.compile(r"\s*<image>\s*")
_SPEAKERS = {"human": "user", "gpt": "assistant"}  # LLaVA's `from` values


@dataclass(frozen=True)
class Layout:
    """How the rows are read: `columns` (role -> column, None for "not in this data"), and the boxes' format and
    units."""

    columns: Mapping[str, str | None]
    box_format: str = "xyxy"
    box_units: str = "pixels"


def check_layout(columns: Mapping[str, Any] | None, box_format: str, box_units: str) -> Layout:
    """The env options `columns`, `box_format` and `box_units`, checked.

    Raises:
        InputError: An unknown role, a column that is not a string, or an unknown format or unit.
    """
    columns = dict(columns or {})
    for role, column in columns.items():
        if role not in ROLES:
            raise InputError(f"columns: unknown role {role!r}; the roles are {', '.join(ROLES)}")
        if column is not None and (not isinstance(column, str) or not column):
            raise InputError(f"columns: {role!r} must map to a column name (or null for none), got {column!r}")
    if box_format not in BOX_FORMATS:
        raise InputError(f"box_format must be 'xyxy' or 'xywh', got {box_format!r}")
    if box_units not in UNIT_SCALE:
        raise InputError(f"box_units must be 'pixels', '0-1' or '0-1000', got {box_units!r}")
    return Layout(columns, box_format, box_units)


def find_columns(names: Collection[str], layout: Layout, source: str, strict: bool = True) -> dict[str, str | None]:
    """Role -> the column that holds it (None where the data has none).

    Args:
        names: The data's column names (a JSON line's keys).
        layout: The user's `columns` take precedence; a column they name is no candidate for another role.
        source: Names the data (or the line) in errors.
        strict: A mapped column the data lacks is an error (tables, whose every row has every column); JSON lines
            pass False, where a line without it simply lacks the field.

    Raises:
        InputError: Two candidates for one role (naming both and the option that chooses), or a mapped column that
            is not there.
    """
    present = set(names)
    mapped = {role: column for role, column in layout.columns.items()}
    for role, column in mapped.items():
        if strict and column is not None and column.split(".")[0] not in present:
            raise InputError(
                f"{source}: columns maps {role!r} to {column!r}, which is not a column (columns: "
                f"{', '.join(sorted(present))})"
            )
    taken = {column for column in mapped.values() if column is not None}
    found: dict[str, str | None] = {}
    for role, candidates in CANDIDATES.items():
        if role in mapped:
            found[role] = mapped[role]
            continue
        plain = [c for c in candidates if "." not in c and c in present and c not in taken]
        if len(plain) > 1:
            listed = " and ".join(repr(c) for c in plain)
            raise InputError(
                f"{source}: columns {listed} could each be the {role}; choose one with the option "
                f"columns={{{role}: NAME}}"
            )
        nested = [c for c in candidates if "." in c and c.split(".")[0] in present and c.split(".")[0] not in taken]
        found[role] = plain[0] if plain else (nested[0] if nested else None)
    return found


def value_at(raw: Mapping[str, Any], column: str | None) -> Any:
    """The row's value in `column` (a dotted name reads into structs); None where it is missing."""
    if column is None:
        return None
    if "." not in column:
        return raw.get(column)
    value: Any = raw
    for part in column.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def question_and_answer(where: str, raw: Mapping[str, Any], found: Mapping[str, str | None]) -> tuple[Any, Any, str]:
    """The row's question text, its answer (None without one) and the name of the field the question came from.

    A list of texts (lmms-lab/RefCOCO's `answer`: several referring expressions of one object) asks the first. A
    chat conversation (a `messages` column, or a question column holding a list of turns as verl's `prompt` does)
    gives the user turn's text, with `<image>` where its image parts stand, and the assistant turn as the
    answer when the data has no answer column.
    """
    answer = value_at(raw, found["answer"])
    question_column = found["question"]
    question = value_at(raw, question_column)
    field = question_column or "question"
    if question is None and found["messages"] is not None:
        question, field = value_at(raw, found["messages"]), found["messages"]
    if isinstance(question, list) and question and all(isinstance(text, str) for text in question):
        question = question[0]  # several phrasings of one question (RefCOCO's referring expressions): the first
    if isinstance(question, list):
        question, reply = _conversation(where, field, question)
        if answer is None:
            answer = reply
    return question, answer, field


def _conversation(where: str, field: str, turns: list[Any]) -> tuple[str, str | None]:
    """(user text, assistant text or None) of a chat conversation: `{"role", "content"}` turns (content a string or
    a list of `{"type": "text"|"image", ...}` parts) or LLaVA's `{"from": "human"|"gpt", "value"}`. A system turn's
    text is put before the question."""
    user: list[str] = []
    system: list[str] = []
    reply = None
    for number, turn in enumerate(turns):
        if not isinstance(turn, Mapping):
            raise InputError(f"{where}: field {field!r}[{number}] must be a chat turn (a mapping), got {turn!r}")
        role = turn.get("role", _SPEAKERS.get(turn.get("from"), turn.get("from")))
        text = _turn_text(where, f"{field}[{number}]", turn.get("content", turn.get("value")))
        if role == "system":
            system.append(text)
        elif role == "user":
            if user:
                raise InputError(
                    f"{where}: field {field!r} holds more than one user turn; the dataset env asks one question per "
                    "record"
                )
            user.append(text)
        elif role == "assistant":
            if user and reply is None:
                reply = text.strip() or None
        else:
            raise InputError(f"{where}: field {field!r}[{number}] has role {role!r}; expected system, user, assistant")
    if not user:
        raise InputError(f"{where}: field {field!r} holds no user turn")
    return " ".join(part.strip() for part in [*system, *user] if part.strip()), reply


def _turn_text(where: str, field: str, content: Any) -> str:
    """A turn's text; image parts become `<image>` where they stand."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InputError(f"{where}: field {field!r} must hold text or a list of parts, got {content!r}")
    pieces = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            pieces.append(str(part.get("text") or ""))
        elif kind in ("image", "image_url"):
            pieces.append(IMAGE_MARK)
        else:
            raise InputError(f"{where}: field {field!r}: a part of type {kind!r}; expected 'text' or 'image'")
    return " ".join(pieces)


def image_values(where: str, field: str, value: Any) -> list[Any]:
    """A row's images as a list: a path, bytes, a `{"bytes", "path"}` struct (the hub's Image feature as parquet
    stores it), a PIL image, or a list of those. Bytes become `{"bytes": ..., "path": None}`."""
    if value is None:
        return []
    items = value if isinstance(value, list | tuple) else [value]
    images = []
    for item in items:
        if isinstance(item, bytes | bytearray):
            item = {"bytes": bytes(item), "path": None}
        if isinstance(item, Mapping):
            if item.get("bytes") is None and not item.get("path"):
                raise InputError(f"{where}: field {field!r}: an image with neither bytes nor a path")
        elif isinstance(item, str):
            if not item:
                raise InputError(f"{where}: field {field!r} must be a path (a non-empty string), got ''")
        elif not hasattr(item, "convert"):  # a PIL image, as `datasets` decodes an Image feature
            raise InputError(
                f"{where}: field {field!r} must be a path, image bytes, a {{bytes, path}} struct or a list of them, "
                f"got {type(item).__name__}"
            )
        images.append(item)
    return images


def one_image(where: str, field: str, question: str, count: int) -> str:
    """The question without its `<image>` placeholders, after checking that the row has the one image it shows.

    The policy places a record's image itself (its prompt template's `{image}`), so the placeholder is dropped from
    the text. Observations hold one image per world, so a row with several images is refused here.
    """
    marks = question.count(IMAGE_MARK)
    if count == 0:
        raise InputError(f"{where}: field {field!r} holds no image")
    if count > 1:
        raise InputError(
            f"{where}: field {field!r} holds {count} images; the dataset env shows one image per record (rows with "
            "several images are not supported yet)"
        )
    if marks > 1:
        raise InputError(f"{where}: the question holds {marks} {IMAGE_MARK} placeholders for the row's one image")
    return _MARK.sub(" ", question).strip() if marks else question


def to_xyxy(where: str, field: str, box: tuple[float, ...], box_format: str) -> tuple[float, ...]:
    """A `[x, y, w, h]` box as `[x1, y1, x2, y2]` (an `xyxy` box is returned as it is)."""
    if box_format == "xyxy":
        return box
    x, y, w, h = box
    if not (w > 0 and h > 0):
        raise InputError(f"{where}: field {field!r} must be [x, y, w, h] with w > 0 and h > 0, got {list(box)}")
    return (x, y, x + w, y + h)


def check_units(where: str, field: str, values: tuple[float, ...], units: str) -> None:
    """Refuse normalised coordinates outside `[0, scale]` (with the rounding `records.BORDER_SLACK` allows in
    pixels, taken here as 0.05% of the range)."""
    scale = UNIT_SCALE[units]
    if scale is None:
        return
    slack = 0.0005 * scale
    if min(values) < -slack or max(values) > scale + slack:
        raise InputError(
            f"{where}: field {field!r} = {[round(v, 4) for v in values]} lies outside 0-{scale:g} "
            f"(box_units={units!r})"
        )
