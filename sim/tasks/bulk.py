"""The dataset env's records of a table's rows built column by column, for the rows whose checks pass in bulk.

A 200k-row parquet dataset spends most of its opening in the per-row checks of `sim.tasks.records.row_record` (about
15-20 us a row in Python). Most rows of a large table are plain: a question string, a box, point or answer of the
usual types, one embedded image. `bulk_records` checks those columns for a whole row group at once (pyarrow and
numpy: lengths, types, finite values, `w > 0`, `x1 < x2`, normalised ranges, text lengths) and builds the `Record`
of every row that passes every check; any other row (a null question, a list answer, a `<image>` placeholder, a
box that fails a check, a reward given by option...) comes back as None and is read by `row_record` as before,
which raises the same error naming the same row and field. So the bulk path only decides which rows are certainly
good, and builds for those exactly the record `row_record` would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sim.tasks.columns import IMAGE_MARK, UNIT_SCALE, Layout
from sim.tasks.record import MAX_TEXT_CHARS, NUMBER, Record, record_names

_LARGE = 1e300  # a coordinate beyond this is left to the per-row check (a sum of four could overflow to inf)


def bulk_records(
    table: Any, found: Mapping[str, str | None], layout: Layout, reward: str | None, name: str, first: int, row: int
) -> list[Record | None]:
    """The record of each row of `table` whose checks all pass, None for the rows `row_record` must read.

    Args:
        table: A `pyarrow.Table` of the rows' text and target columns (no image column: each row has one embedded
            image, the caller checks that).
        found: Role -> column (`sim.tasks.columns.find_columns`).
        layout: The boxes' format and units.
        reward: The reward option (rows are built here only when it is None: one picked per record).
        name: The file (or folder) the rows are named by: "<name> row <i>".
        first: The index, within `name`, of the table's first row.
        row: The index of the table's first row in the table that embeds the images (`Record.image`).
    """
    count = table.num_rows
    question = found["question"]
    if reward is not None or count == 0 or not _plain(table, question):
        return [None] * count
    if any(found[role] is not None and not _plain(table, found[role]) for role in ("answer", "box", "boxes", "point")):
        return [None] * count
    import pyarrow as pa

    questions = table.column(question)
    if not pa.types.is_string(questions.type) and not pa.types.is_large_string(questions.type):
        return [None] * count
    texts = questions.to_pylist()
    ok = np.fromiter(
        (q is not None and len(q) <= MAX_TEXT_CHARS and IMAGE_MARK not in q and bool(q.strip()) for q in texts),
        bool,
        count,
    )
    ok &= ~_present(table, found["boxes"], count)  # a row with `boxes` is left to the per-row reading
    box, has_box, good = _coordinates(table, found["box"], 4, count)
    ok &= good | ~has_box
    if has_box.any():
        box, good = _xyxy(box, layout.box_format)
        ok &= good | ~has_box
    point, has_point, good = _coordinates(table, found["point"], 2, count)
    ok &= good | ~has_point
    for values, present in ((box, has_box), (point, has_point)):
        ok &= _in_range(values, layout.box_units) | ~present
    answers, has_answer, good = _answers(table, found["answer"], count)
    ok &= good | ~has_answer
    ok &= has_box | has_point | has_answer
    names = record_names(found["box"] or "box", found["boxes"] or "boxes", found["point"] or "point")
    units = layout.box_units
    box_rows, point_rows = box.tolist(), point.tolist()
    records: list[Record | None] = [None] * count
    for i in np.flatnonzero(ok).tolist():
        box_i = tuple(box_rows[i]) if has_box[i] else None
        point_i = tuple(point_rows[i]) if has_point[i] else None
        answer = answers[i]
        if box_i is not None:
            kind = "box_iou"
        elif point_i is not None:
            kind = "point_in_box"
        else:
            kind = "numeric_match" if isinstance(answer, str) and NUMBER.fullmatch(answer) else "exact_match"
        where = f"{name} row {first + i}"
        records[i] = Record(where, row + i, texts[i].strip(), box_i, point_i, answer, kind, None, None, units, names)
    return records


def _plain(table: Any, column: str | None) -> bool:
    """A column read as it is (no dotted struct field), and in the table."""
    return column is not None and "." not in column and column in table.column_names


def _present(table: Any, column: str | None, count: int) -> np.ndarray:
    """`[count]` bool: the row holds a value in `column` (all False without the column)."""
    if column is None:
        return np.zeros(count, bool)
    return _valid(table.column(column).combine_chunks())


def _valid(array: Any) -> np.ndarray:
    """`[len]` bool: which values of a `pyarrow.Array` are not null, from its validity bitmap.

    Arrow's own `to_numpy` imports pandas (a third of a second and 40 MiB), so the buffers are read directly."""
    if array.null_count == 0:
        return np.ones(len(array), bool)
    bits = np.unpackbits(np.frombuffer(array.buffers()[0], np.uint8), bitorder="little")
    return bits[array.offset : array.offset + len(array)].astype(bool)


def _numbers(array: Any, dtype: Any) -> np.ndarray:
    """The values of a `pyarrow.Array` of fixed-width numbers as `dtype` (whatever stands under a null)."""
    return np.frombuffer(array.buffers()[1], dtype, count=len(array), offset=array.offset * np.dtype(dtype).itemsize)


def _coordinates(table: Any, column: str | None, size: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The `[count, size]` float64 values of a list column of numbers, whether each row holds a value, and whether
    that value is `size` finite numbers of moderate size (rows failing it are left to the per-row check)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = np.zeros((count, size))
    if column is None:
        return values, np.zeros(count, bool), np.zeros(count, bool)
    data = table.column(column).combine_chunks()
    present = _valid(data)
    kind = data.type
    listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    item = kind.value_type if listed else None  # float16 reads as numpy's, which the per-row check refuses
    numeric = listed and (pa.types.is_integer(item) or (pa.types.is_floating(item) and not pa.types.is_float16(item)))
    if not numeric or not present.any():
        return values, present, np.zeros(count, bool)
    offsets = _numbers(data.offsets, np.int64 if pa.types.is_large_list(kind) else np.int32).astype(np.int64)
    child = pc.cast(data.values, pa.float64(), safe=False)  # as Python's float() rounds an int
    numbers = _numbers(child, np.float64).copy()
    numbers[~_valid(child)] = np.nan
    good = present & (np.diff(offsets) == size)
    picked = numbers[offsets[:-1][good][:, None] + np.arange(size)]  # [G, size]
    values[good] = picked
    good[good] = (np.abs(picked) < _LARGE).all(axis=1)  # NaN fails too
    return values, present, good


def _xyxy(box: np.ndarray, box_format: str) -> tuple[np.ndarray, np.ndarray]:
    """Boxes as `[x1, y1, x2, y2]` (from `[x, y, w, h]` with `w, h > 0`) and whether `x1 < x2` and `y1 < y2`."""
    good = np.ones(len(box), bool)
    if box_format == "xywh":
        good &= (box[:, 2] > 0) & (box[:, 3] > 0)
        with np.errstate(over="ignore", invalid="ignore"):  # rows past `_LARGE` are left to the per-row check
            box = np.concatenate([box[:, :2], box[:, :2] + box[:, 2:]], axis=1)
    return box, good & (box[:, 0] < box[:, 2]) & (box[:, 1] < box[:, 3])


def _in_range(values: np.ndarray, units: str) -> np.ndarray:
    """Normalised coordinates within `[0, scale]` up to `columns.check_units`' slack (all True for pixels)."""
    scale = UNIT_SCALE[units]
    if scale is None:
        return np.ones(len(values), bool)
    slack = 0.0005 * scale
    return (values.min(axis=1) >= -slack) & (values.max(axis=1) <= scale + slack)


def _answers(table: Any, column: str | None, count: int) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """Each row's answer as a record holds it (stripped text, or a number's text), whether the row holds one, and
    whether it is one the bulk path reads (a non-empty text within `MAX_TEXT_CHARS`, or a number)."""
    import pyarrow as pa

    if column is None:
        return [None] * count, np.zeros(count, bool), np.zeros(count, bool)
    data = table.column(column)
    raw = data.to_pylist()
    present = np.fromiter((value is not None for value in raw), bool, count)
    kind = data.type
    if pa.types.is_integer(kind) or (pa.types.is_floating(kind) and not pa.types.is_float16(kind)):
        return [None if value is None else str(value) for value in raw], present, present.copy()
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return [None] * count, present, np.zeros(count, bool)
    answers = [None if value is None else value.strip() for value in raw]
    good = np.fromiter((bool(text) and len(value) <= MAX_TEXT_CHARS for text, value in zip(answers, raw)), bool, count)
    return answers, present, good
