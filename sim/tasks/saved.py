"""The dataset env's records of a folder written by `datasets` (`Dataset.save_to_disk`, or a `DatasetDict`'s).

The text and target columns are read and checked at load (column by column where `sim.tasks.bulk` can, row by row
otherwise); images embedded in the table are read when a world first shows them (`ImageColumn`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.errors import InputError
from sim.tasks.bulk import bulk_records
from sim.tasks.columns import find_columns

_CHUNK = 4096  # rows checked in bulk at a time


def read_saved(path: Path, split: str, reading: Any, row_record: Any) -> tuple[list[Any], Any]:
    """The records of a folder saved by `datasets`, and the rows their embedded images are read from (None when
    every image is a file).

    Args:
        path: The saved folder.
        split: The split of a saved `DatasetDict` to read.
        reading: `records.Reading`: the layout, which option chose the split, and `keep`, which collects each row's
            record (or why it is bad).
        row_record: `records.row_record`, which makes one row's record (passed in: `records` imports this module).
    """
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
        if split not in loaded:
            raise InputError(
                f"{path} has splits {', '.join(loaded)}; choose one with {reading.option} (got {split!r})"
            )
        loaded = loaded[split]
    elif reading.option != "hf_split":
        raise InputError(f"{reading.option}={split!r}: {path} holds one dataset, not a DatasetDict of splits")
    found = find_columns(loaded.column_names, reading.layout, str(path))
    column = found["image"]
    if column is None:
        raise InputError(f"{path}: no 'image' column (columns: {', '.join(loaded.column_names)})")
    feature = loaded.features[column]
    inner = getattr(feature, "feature", feature)  # a list of images: `Sequence(Image())` / `List(Image())`
    inner = inner[0] if isinstance(inner, list) else inner
    # Validate from the other columns only: decoding (or even loading) every image here would cost a full pass.
    others = sorted({c.split(".")[0] for c in found.values() if c is not None} - {column})
    name = path.name if reading.label is None else f"{path.name} (split {reading.label!r})"
    records: list[Any] = []
    if isinstance(inner, datasets.Image):  # embedded: read when first shown; each row's count from the table
        counts = _image_counts(loaded.data.column(column))
        columns = loaded.select_columns(others)
        arrow = columns.with_format("arrow")  # slices as `pyarrow.Table`s, for the checks in bulk
        for start in range(0, len(loaded), _CHUNK):
            stop = min(start + _CHUNK, len(loaded))
            built = bulk_records(arrow[start:stop], found, reading.layout, reading.reward, name, start, start)
            built = built if len(built) == stop - start else [None] * (stop - start)  # no column read: no rows
            metadata = None
            for offset, record in enumerate(built):
                index = start + offset
                if record is not None and counts[index] == 1:
                    records.append(record)
                    continue
                if metadata is None:
                    metadata = columns.select(range(start, stop)).to_list()
                raw = metadata[offset]
                reading.keep(records, row_record, f"{name} row {index}", raw, found, path, reading, index,
                             [None] * counts[index])  # fmt: skip
        return records, ImageColumn(loaded, column)
    metadata = loaded.select_columns(others).to_list()
    for index, (raw, image) in enumerate(zip(metadata, loaded[column])):  # paths, or {bytes, path} structs
        raw[column] = image
        reading.keep(records, row_record, f"{name} row {index}", raw, found, path, reading, index)
    embedded = any(isinstance(record.image, int) for record in records)
    return records, ImageColumn(loaded, column) if embedded else None


def _image_counts(column: Any) -> list[int]:
    """Images per row of an Arrow image column (0 for a null row; a list column's lengths), without its bytes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return pc.fill_null(pc.list_value_length(column), 0).to_pylist()
    return pc.if_else(pc.is_null(column), 0, 1).to_pylist()


class ImageColumn:
    """A `datasets.Dataset`'s image column as rows `{"image": value}` (the first image of a list), decoded by
    `datasets` when asked: what `records.open_image` reads a row's embedded image from."""

    def __init__(self, dataset: Any, column: str):
        self.dataset, self.column = dataset, column

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        value = self.dataset[index][self.column]
        return {"image": value[0] if isinstance(value, list) and value else value}
