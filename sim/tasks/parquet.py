"""Parquet data for the dataset env: a file, or a folder laid out as a Hugging Face dataset repository, read lazily.

A repository's files are found as the hub finds them: the `configs` its README card's YAML declares (each with
`data_files`, a glob or a list of `{split, path}`), else shard names `<split>-00000-of-00002.parquet` (under `data/`
or anywhere below), else files named or foldered by a split (`test.parquet`, `test/0000.parquet`).

Opening reads only the text columns (column projection) and, of an image column, the `path` field of its
`{bytes, path}` structs, row group by row group; the image bytes are read when a world first shows a row (`rows`,
one row group's image column at a time), so a 200k-row dataset opens in seconds in memory that does not grow
with its images (`bench/dataset_open.py`).
"""

from __future__ import annotations

import bisect
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import yaml

from sim.errors import InputError
from sim.tasks.bulk import bulk_records
from sim.tasks.columns import find_columns

_SHARD = re.compile(r"^(?P<split>[A-Za-z0-9_.]+?)-\d+-of-\d+")
_SPLIT_NAMES = ("train", "test", "validation", "valid", "val", "dev", "eval")
_CACHED_GROUPS = 2  # row groups whose image column `ParquetRows` keeps in memory (bytes, not decoded images)


def parquet_files(path: Path, split: str, config: str | None, option: str = "hf_split") -> list[Path]:
    """The parquet files of one split of `path` (a file, or a repository folder; see the module docstring), chosen
    by the option `option` (`hf_split`, or `hf_validation_split` / `hf_test_split`, which must find a split by name).

    Raises:
        InputError: No parquet file, an unknown split or configuration (naming the ones there).
    """
    if path.is_file():
        if config is not None:
            raise InputError(f"hf_config={config!r} chooses among a repository's configs; {path} is one file")
        return [path]
    card = _card_configs(path)
    if card:
        return _config_files(path, card, split, config, option)
    if config is not None:
        raise InputError(f"hf_config={config!r}: {path} has no README.md card declaring configs")
    files = sorted(p for p in path.rglob("*.parquet") if not any(part.startswith(".") for part in p.parts))
    if not files:
        raise InputError(
            f"{path} holds no parquet file, no data.jsonl and no dataset saved by datasets (Dataset.save_to_disk)"
        )
    splits: dict[str | None, list[Path]] = {}
    for file in files:
        splits.setdefault(_split_of(file, path), []).append(file)
    if split in splits:
        return splits[split]
    if list(splits) == [None] and option == "hf_split":  # no file is named by a split: one split, whatever its name
        return files
    named = ", ".join(sorted(s for s in splits if s is not None)) or "none (no parquet file is named by a split)"
    raise InputError(f"{path} has splits {named}; choose one with {option} (got {split!r})")


def _split_of(file: Path, root: Path) -> str | None:
    shard = _SHARD.match(file.name)
    if shard:
        return shard["split"]
    if file.stem in _SPLIT_NAMES:
        return file.stem
    folders = [part for part in file.relative_to(root).parts[:-1] if part in _SPLIT_NAMES]
    return folders[-1] if folders else None


def _card_configs(path: Path) -> list[dict[str, Any]]:
    """The `configs` of the README card's YAML header (empty without a card or a `configs` key)."""
    readme = path / "README.md"
    if not readme.is_file():
        return []
    text = readme.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return []
    header = text[3:].split("\n---", 1)[0]
    try:
        card = yaml.safe_load(header) or {}
    except yaml.YAMLError as error:
        raise InputError(f"{readme}: the card's YAML header does not parse ({error})") from None
    configs = card.get("configs") if isinstance(card, dict) else None
    if configs is None:
        return []
    if not isinstance(configs, list) or not all(isinstance(c, dict) and "config_name" in c for c in configs):
        raise InputError(f"{readme}: 'configs' must be a list of {{config_name, data_files}} entries")
    return configs


def _config_files(
    path: Path, configs: list[dict[str, Any]], split: str, config: str | None, option: str
) -> list[Path]:
    names = [str(c["config_name"]) for c in configs]
    if config is not None:
        if config not in names:
            raise InputError(f"{path}/README.md declares configs {', '.join(names)}; got hf_config={config!r}")
        chosen = configs[names.index(config)]
    else:
        defaults = [c for c in configs if c.get("default")]
        if len(configs) > 1 and len(defaults) != 1:
            raise InputError(f"{path}/README.md declares configs {', '.join(names)}; choose one with hf_config")
        chosen = defaults[0] if defaults else configs[0]
    data_files = chosen.get("data_files")
    if isinstance(data_files, str | list) and all(isinstance(d, str) for d in _as_list(data_files)):
        patterns = {"train": _as_list(data_files)}  # a bare glob is the train split, as the hub reads it
    elif isinstance(data_files, list) and all(isinstance(d, dict) and "split" in d for d in data_files):
        patterns = {str(d["split"]): _as_list(d.get("path")) for d in data_files}
    else:
        raise InputError(f"{path}/README.md: config {chosen['config_name']!r} has no readable data_files")
    if split not in patterns:
        raise InputError(
            f"{path}/README.md: config {chosen['config_name']!r} has splits {', '.join(patterns)}; choose one with "
            f"{option} (got {split!r})"
        )
    files = sorted({file for pattern in patterns[split] for file in path.glob(str(pattern))})
    if not files:
        raise InputError(f"{path}: the split {split!r}'s data_files {patterns[split]} match no file")
    return files


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def read_parquet(path: Path, split: str, config: str | None, reading: Any, row_record: Any) -> tuple[list[Any], Any]:
    """The records of a parquet file or repository folder, and the rows their embedded images are read from.

    Args:
        path: A parquet file or a repository folder.
        split: The split to read (`hf_split`, or the option `reading.option` names).
        config: The card's configuration to read (`hf_config`), or None.
        reading: `records.Reading`: the layout, and `keep`, which collects each row's record (or why it is bad).
        row_record: `records.row_record`, which makes one row's record (passed in: `records` imports this module).
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ImportError(f"reading parquet data needs `pyarrow` (pip install 'mmrl[data]'): {error}") from error

    files = parquet_files(path, split, config, reading.option)
    handles = [_open(pq, file) for file in files]
    names = handles[0].schema_arrow.names
    for file, handle in zip(files[1:], handles[1:]):
        if handle.schema_arrow.names != names:
            raise InputError(f"{file}: its columns {handle.schema_arrow.names} differ from {files[0].name}'s {names}")
    found = find_columns(names, reading.layout, str(path))
    column = found["image"]
    if column is None:
        raise InputError(f"{path}: no 'image' column (columns: {', '.join(names)})")
    kind = handles[0].schema_arrow.field(column).type
    listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    item = kind.value_type if listed else kind
    prefix = f"{column}.list.{kind.value_field.name}" if listed else column  # "element", or "item" in older files
    if pa.types.is_struct(item):
        fields = {item.field(i).name for i in range(item.num_fields)}
        if not fields & {"bytes", "path"}:
            raise InputError(f"{path}: column {column!r} holds structs without 'bytes' or 'path' ({item})")
        bytes_leaf = f"{prefix}.bytes" if "bytes" in fields else None
        path_leaf = f"{prefix}.path" if "path" in fields else (bytes_leaf if listed else None)  # a list's lengths
    elif pa.types.is_string(item) or pa.types.is_large_string(item):
        path_leaf, bytes_leaf = column, None
    else:  # image bytes (a list of them read at load for its lengths)
        path_leaf, bytes_leaf = (column if listed else None), column
    others = sorted({c.split(".")[0] for c in found.values() if c is not None} - {column})
    base = path if path.is_dir() else path.parent
    records: list[Any] = []
    segments: list[tuple[int, int, int]] = []  # (file, row group, first row)
    row = 0
    for number, (file, handle) in enumerate(zip(files, handles)):
        first, name = row, file.name if reading.label is None else f"{file.name} (split {reading.label!r})"
        for group in range(handle.num_row_groups):
            segments.append((number, group, row))
            table = handle.read_row_group(group, columns=others)
            count = table.num_rows
            embedded = _embedded(handle, group, bytes_leaf, column, count)
            every = embedded[0] is None and not listed if count else False  # every row one embedded image
            paths = [None] * count if every else _leaf(handle, group, path_leaf, column, count)
            built = bulk_records(table, found, reading.layout, reading.reward, name, row - first, row)
            if every and not any(record is None for record in built):  # the whole group passed in bulk
                records.extend(built)
                row += count
                continue
            meta = None
            for index, (record, row_paths, row_bytes) in enumerate(zip(built, paths, embedded)):
                images = _images(row_paths, row_bytes, listed)
                if record is not None and images == [None]:  # one embedded image, every check passed in bulk
                    records.append(record)
                else:
                    meta = table.to_pylist() if meta is None else meta
                    where = f"{name} row {row - first}"
                    reading.keep(records, row_record, where, meta[index], found, base, reading, row, images)
                row += 1
    return records, ParquetRows(files, column, segments, row)


def _open(pq: Any, file: Path) -> Any:
    try:
        return pq.ParquetFile(file)
    except Exception as error:  # pyarrow raises ArrowInvalid (a ValueError) or OSError for a file that is no parquet
        raise InputError(f"{file}: not a readable parquet file ({error})") from None


def _leaf(handle: Any, group: int, leaf: str | None, column: str, rows: int) -> list[Any]:
    """One row group's values of an image column's `path` field (or the column itself for plain paths), as Python;
    [None] * rows for image bytes, whose paths there are none of."""
    if leaf is None:
        return [None] * rows
    values = handle.read_row_group(group, columns=[leaf]).column(column).to_pylist()
    return [_each(value, _path_of) for value in values]


def _path_of(value: Any) -> Any:
    """An image's path: `{"path": p}` -> p (a struct read at its `path` field); None for image bytes."""
    if isinstance(value, bytes):  # a list of image bytes, read at load for its lengths
        return None
    return value.get("path") if isinstance(value, dict) else value


def _has_bytes(value: Any) -> bool:
    return value.get("bytes") is not None if isinstance(value, dict) else value is not None


def _each(value: Any, fn: Any) -> Any:
    """`fn` of each image in a row's value (a list of images, or one)."""
    return [fn(item) for item in value] if isinstance(value, list) else fn(value)


def _embedded(handle: Any, group: int, leaf: str | None, column: str, rows: int) -> list[Any]:
    """Whether each image of one row group holds bytes: read from the row group's statistics where they say every
    value has them (None: "all of them"), else from the bytes themselves (True/False per image)."""
    if leaf is None:
        return [False] * rows
    metadata = handle.metadata.row_group(group)
    for index in range(metadata.num_columns):
        chunk = metadata.column(index)
        if chunk.path_in_schema == leaf:
            stats = chunk.statistics
            if stats is not None and stats.has_null_count and stats.null_count == 0:
                return [None] * rows
    values = handle.read_row_group(group, columns=[leaf]).column(column).to_pylist()
    return [_each(value, _has_bytes) for value in values]


def _images(paths: Any, embedded: Any, listed: bool) -> list[Any]:
    """A row's images for `row_record`: None for each embedded one, the path of each file."""
    if not listed:
        if embedded is None or embedded:
            return [None]
        return [paths] if paths else []
    if paths is None:  # a null list
        return []
    held = [embedded is None or bool(embedded[index]) for index in range(len(paths))]
    return [None if hold else path for path, hold in zip(paths, held) if hold or path]


class ParquetRows:
    """Rows `{"image": value}` of a parquet dataset's image column, read when asked: one row group's image column
    at a time, the last `_CACHED_GROUPS` kept (bytes, not decoded images). What `records.open_image` reads a row's
    embedded image from; picklable (the files are reopened where it is unpickled)."""

    def __init__(self, files: list[Path], column: str, segments: list[tuple[int, int, int]], rows: int):
        self.files, self.column, self.segments, self.rows = files, column, segments, rows
        self._starts = [start for _, _, start in segments]
        self._handles: dict[int, Any] = {}
        self._groups: OrderedDict[int, Any] = OrderedDict()

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.rows:
            raise IndexError(f"row {index} of {self.rows}")
        segment = bisect.bisect_right(self._starts, index) - 1
        number, group, start = self.segments[segment]
        if segment not in self._groups:
            import pyarrow.parquet as pq

            if number not in self._handles:
                self._handles[number] = pq.ParquetFile(self.files[number])
            self._groups[segment] = self._handles[number].read_row_group(group, columns=[self.column]).column(0)
            while len(self._groups) > _CACHED_GROUPS:
                self._groups.popitem(last=False)
        self._groups.move_to_end(segment)
        value = self._groups[segment][index - start].as_py()
        if isinstance(value, list):
            value = next((v for v in value if v is not None), None)
        if isinstance(value, bytes):
            value = {"bytes": value, "path": None}
        return {"image": value}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handles": {}, "_groups": OrderedDict()}
