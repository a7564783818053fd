"""The dataset env's bulk reading of a table's rows (`sim.tasks.bulk`) builds exactly the records the per-row reading
(`records.row_record`) builds, and leaves to it every row it would refuse, whatever the column types."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from sim.errors import InputError
from sim.tasks.bulk import bulk_records
from sim.tasks.columns import Layout, find_columns
from sim.tasks.record import MAX_TEXT_CHARS
from sim.tasks.records import Reading, row_record

LONG = "x" * (MAX_TEXT_CHARS + 1)
QUESTIONS = ["Find it.", "  Padded?  ", "", "   ", None, "<image>Where?", LONG, "Where is 3?", "Q", "Q2"]

TABLES = {
    "xywh boxes in pixels, doubles": (
        {
            "question": QUESTIONS,
            "bbox": [
                [1.0, 2, 3, 4],
                [0.5, 0.5, 10, 10],
                [1, 2, 3, 4],
                [1, 2, 3, 4],
                [1, 2, 3, 4],
                [1, 2, 3, 4],
                [1, 2, 3, 4],
                [1, 2, 0, 4],
                [1e308, 0, 1e308, 1],
                None,
            ],
            "answer": ["a", "3", None, " x ", "y", "z", "w", "", "  ", None],
        },
        {"bbox": pa.list_(pa.float64())},
        Layout({}, "xywh", "pixels"),
    ),
    "xyxy boxes with nulls, NaN and wrong lengths": (
        {
            "question": ["Q"] * 8,
            "box": [
                [1, 2, 3, 4],
                [3, 2, 1, 4],
                [1, 2, 3],
                [1, 2, None, 4],
                [math.nan, 0, 1, 1],
                [0, 0, 5, 5],
                [1, 1, 1, 1],
                [1, 2, 3, 4, 5],
            ],
        },
        {"box": pa.list_(pa.float32())},
        Layout({}, "xyxy", "pixels"),
    ),
    "integer points in 0-1000 and numeric answers": (
        {
            "question": ["Q"] * 6,
            "point": [[500, 500], [0, 1000], [1001, 3], [-1, 4], None, [1000, 1000]],
            "label": [1.5, None, 2.0, -3.0, 7.25, math.inf],
        },
        {"point": pa.list_(pa.int64()), "label": pa.float64()},
        Layout({}, "xyxy", "0-1000"),
    ),
    "normalised boxes at the edges, integer answers": (
        {
            "question": ["Q"] * 5,
            "bbox": [[0, 0, 1, 1], [-0.0004, 0, 1.0004, 1], [-0.001, 0, 1, 1], [0.2, 0.2, 0.1, 0.9], None],
            "answer": [1, 2, 3, 4, None],
        },
        {"bbox": pa.list_(pa.float64()), "answer": pa.int64()},
        Layout({}, "xyxy", "0-1"),
    ),
    "types the bulk reading leaves alone": (
        {
            "question": ["Q"] * 3,
            "bbox": [[True, False, True, True], [False, False, True, True], None],
            "answer": [["a", "b"], ["c"], []],
            "boxes": [None, [[1, 2, 3, 4]], []],
        },
        {"bbox": pa.list_(pa.bool_())},
        Layout({}, "xyxy", "pixels"),
    ),
    "half floats": (
        {"question": ["Q"] * 2, "point": [np.array([1, 2], np.float16), np.array([3, 4], np.float16)]},
        {"point": pa.list_(pa.float16())},
        Layout({}, "xyxy", "pixels"),
    ),
}


@pytest.mark.parametrize("sliced", [False, True])
@pytest.mark.parametrize("name", list(TABLES))
def test_bulk_records_equal_the_per_row_records(name, sliced):
    columns, types, layout = TABLES[name]
    table = pa.table({column: pa.array(values, types.get(column)) for column, values in columns.items()})
    table = table.slice(1) if sliced else table  # arrays that start past their buffers' first value
    found = find_columns([*table.column_names, "image"], layout, name)
    built = bulk_records(table, found, layout, None, "d.parquet", 10, 100)
    assert len(built) == table.num_rows
    reading = Reading(None, layout, None)
    agreed = 0
    for index, raw in enumerate(table.to_pylist()):
        try:
            record = row_record(f"d.parquet row {10 + index}", raw, found, Path("."), reading, 100 + index, [None])
        except InputError:
            assert built[index] is None, f"row {index}: refused per row, built in bulk"
            continue
        if built[index] is not None:
            assert built[index] == record
            agreed += 1
    assert agreed >= (0 if name in ("types the bulk reading leaves alone", "half floats") else 1 + (not sliced))


def test_a_given_reward_leaves_every_row_to_the_per_row_reading():
    table = pa.table({"question": ["Q"], "answer": ["a"]})
    found = find_columns([*table.column_names, "image"], Layout({}), "t")
    assert bulk_records(table, found, Layout({}), "exact_match", "t", 0, 0) == [None]
    assert bulk_records(table, found, Layout({}), None, "t", 0, 0)[0].reward == "exact_match"
