"""Reading the pairs `rewards.score` scores: a JSON-lines file or a `pred/` + `target/` folder into `Item`s.

Reading never raises for a bad row: an unreadable prediction or target is an `Item` with `pred_error` or
`target_error` set, which scoring reports as the row's reason: a file that is named but missing ("file not found:
PATH"), over `MAX_TEXT_FILE` (its size and the limit), or not UTF-8 (refused, not repaired), and a line that is not
UTF-8 or not readable JSON (malformed, nested too deep, a number too long to convert) is a row of its own. The accepted kinds are listed in `rewards.score`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from rewards.image_files import viewed_rgb
from rewards.parse import answer_code, answer_region, extract_code

CODE_KINDS = ("svg", "chart", "cad", "html")  # sources rendered in the sandbox (rewards.render kinds)
CODE_LANGUAGES = {"svg": "svg", "chart": "python", "cad": "python", "html": "html"}  # each kind's fence language
_SOURCE_SUFFIXES = {".svg": "svg", ".py": "chart", ".html": "html", ".htm": "html"}  # .py: chart, or cad (build123d)
_FILE_KINDS = {**_SOURCE_SUFFIXES, ".txt": "text"}  # a prediction file's kind by suffix (images aside)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
MAX_TEXT_FILE = 1 << 20


@dataclass
class Item:
    """One prediction/target pair as read, before scoring.

    Attributes:
        id: the row's id (the line's `id`, else its line number; the stem in folder mode).
        prediction: what the prediction was given as (a path, or inline text), for the output file.
        target: what the target was given as.
        pred_kind: "svg", "chart", "image", "text", or "" if unreadable.
        pred_value: SVG/chart source, an image path, or the text.
        target_kind: "image", "box", "text", or "".
        target_value: an image path, 4 floats, or the text; for a target given as source, the source.
        target_render: for a target given as source (an SVG, chart or CAD script), its render kind: the target is
            rendered like a prediction and compared as an image. "" otherwise.
        reference_length: for `code_length`.
        pred_error: why the prediction could not be read or rendered ("" if it could): its metrics score 0.0.
        target_error: why the target could not be read ("" if it could): metrics that need it are NaN.
        scores: metric -> score (NaN where the metric does not apply).
        render_seconds: the sandbox's time for this prediction, if it was rendered.
        note: why some asked-for metrics are empty though nothing failed (they do not apply to these kinds).
        unpaired: folder mode: a stem with a file on one side only (not a pair; the summary counts it apart).
    """

    id: str
    prediction: str = ""
    target: str = ""
    pred_kind: str = ""
    pred_value: Any = None
    target_kind: str = ""
    target_value: Any = None
    target_render: str = ""
    reference_length: float | None = None
    pred_error: str = ""
    target_error: str = ""
    scores: dict[str, float] = field(default_factory=dict)
    render_seconds: float | None = None
    note: str = ""
    unpaired: bool = False

    @property
    def reason(self) -> str:
        """Everything wrong with the row, then why any empty score is empty; "" if nothing."""
        return "; ".join(r for r in (self.pred_error, self.target_error, self.note) if r)


# =========================================================================================================== READING


def read_items(source: Path, render: str = "auto") -> list[Item]:
    """Reads a JSON-lines file or a `pred/` + `target/` folder into items (never raises for bad rows).

    Args:
        source: the file or folder.
        render: how inline prediction strings are read: a `CODE_KINDS` kind, "none" (text), or "auto".

    Returns:
        One item per line (or per stem), in file order (sorted stems).
    """
    if source.is_dir():
        return _read_folder(source)
    return _read_jsonl(source, render)


def _read_jsonl(path: Path, render: str) -> list[Item]:
    items = []
    base = path.parent
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            item = Item(id=str(number))
            items.append(item)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                item.pred_error = f"line {number} is not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})"
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                item.pred_error = f"line {number} is not JSON ({e.msg})"
                continue
            except (ValueError, RecursionError) as e:  # a number of 5000 digits, arrays nested 100k deep
                item.pred_error = f"line {number} is not readable JSON ({type(e).__name__}: {e})"
                continue
            if not isinstance(row, dict):
                item.pred_error = f"line {number} is not a JSON object"
                continue
            try:
                _read_row(item, row, number, base, render)
            except (ValueError, TypeError, OverflowError, RecursionError) as e:  # values no reader expects
                item.pred_error = f"line {number} cannot be read ({type(e).__name__}: {e})"
    return items


def _read_row(item: Item, row: dict[str, Any], number: int, base: Path, render: str) -> None:
    item.id = _shorten(str(row.get("id", number)))
    length = row.get("reference_length")
    if isinstance(length, int | float) and not isinstance(length, bool) and _finite(length):
        item.reference_length = float(length)
    _read_prediction(item, row.get("prediction"), base, render)
    _read_target(item, row.get("target"), base)


def _finite(value: int | float) -> bool:
    """Whether a JSON number is a finite float (an integer of 400 digits is not: it overflows)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _read_folder(root: Path) -> list[Item]:
    pred_dir, target_dir = root / "pred", root / "target"
    if not pred_dir.is_dir() or not target_dir.is_dir():
        raise FileNotFoundError(f"{root} must hold pred/ and target/ folders (pairs matched by file stem)")

    def by_stem(folder: Path) -> dict[str, list[Path]]:
        files: dict[str, list[Path]] = {}
        for p in sorted(folder.iterdir()):
            if p.is_file() and not p.name.startswith("."):
                files.setdefault(p.stem, []).append(p)
        return files

    preds, targets = by_stem(pred_dir), by_stem(target_dir)
    items = []
    for stem in sorted(set(preds) | set(targets)):
        item = Item(id=stem)
        pred_files, target_files = preds.get(stem, []), targets.get(stem, [])
        if len(pred_files) != 1 or len(target_files) != 1:
            side = "pred" if len(pred_files) != 1 else "target"
            count = len(pred_files) if side == "pred" else len(target_files)
            problem = f"{count} files named {stem}.* in {side}/ (need exactly one)"
            item.unpaired = count == 0
            if side == "pred":
                item.pred_error = problem
            else:
                item.target_error = problem
            item.prediction = ", ".join(p.name for p in pred_files)
            item.target = ", ".join(p.name for p in target_files)
            items.append(item)
            continue
        # Paths relative to `root`, which is also the base they are resolved against.
        _read_prediction(item, str(pred_files[0].relative_to(root)), root, "none")
        target_path = target_files[0]
        if target_path.suffix.lower() == ".json":
            try:
                _read_target(item, json.loads(target_path.read_text(encoding="utf-8")), root)
            except (OSError, ValueError, RecursionError) as e:  # unreadable, not UTF-8, not JSON, too deep
                item.target = str(target_path)
                item.target_error = f"target {target_path.name}: {type(e).__name__}: {e}"
        else:
            _read_target(item, str(target_path.relative_to(root)), root)
        items.append(item)
    return items


def _read_prediction(item: Item, value: Any, base: Path, render: str) -> None:
    if not isinstance(value, str):
        item.pred_error = f"prediction is {type(value).__name__}, not a string"
        return
    path = _as_path(value, base)
    item.prediction = value if path is None else str(path)
    missing = _missing_file(value, base) if path is None else None
    if missing is not None:  # a file name, not an answer: say so, not "no box in the prediction"
        item.prediction = str(missing)
        item.pred_kind = "image" if missing.suffix.lower() in IMAGE_EXTENSIONS else _FILE_KINDS[missing.suffix.lower()]
        item.pred_error = f"file not found: {missing}"
        return
    if path is not None:
        suffix = path.suffix.lower()
        if suffix in IMAGE_EXTENSIONS:
            item.pred_kind, item.pred_value = "image", path
            return
        kind = _FILE_KINDS.get(suffix)
        if kind is not None:
            text, problem = _read_text(path)
            if text is None:
                item.pred_error = f"prediction file {problem}"
                item.pred_kind = kind
                return
            if kind == "chart" and (render == "cad" or (render == "auto" and "build123d" in text)):
                kind = "cad"  # a build123d script, not matplotlib code
            if kind in CODE_KINDS:
                _take_code(item, kind, text, f"prediction file {path.name}")
            else:
                item.pred_kind, item.pred_value = kind, text
            return
    item.prediction = _shorten(value)
    if render in CODE_KINDS:
        _take_code(item, render, value, "prediction")
        return
    kind = code_kind(value) if render == "auto" else None
    if kind is not None:
        _take_code(item, kind, value, "prediction")
    else:
        item.pred_kind, item.pred_value = "text", value


def _take_code(item: Item, kind: str, text: str, what: str) -> None:
    """The code of a source prediction as a model writes it (a fenced block, a leading sentence, `<answer>` tags), read
    as the render envs read their answers (`rewards.parse.answer_code`); its absence is the prediction's fault."""
    item.pred_kind = kind
    item.pred_value = answer_code(text, CODE_LANGUAGES[kind])
    if item.pred_value is None:
        item.pred_error = (
            f"{what} holds no <svg>...</svg> element (fenced or bare)" if kind == "svg" else f"{what} holds no code"
        )


def code_kind(text: str) -> str | None:
    """The render kind of an inline prediction read with `--render auto`, or None for text.

    A model's completion counts by its code: a block fenced as `html`, then as `python` (`cad` if it imports
    build123d, else `chart`), then a page that begins anywhere with `<!doctype html` or `<html`, then SVG (fenced as
    `svg`, a bare `<svg>...</svg>` after any leading sentence, or text that starts like SVG). Think blocks are skipped
    and `<answer>` tags read.
    """
    region = answer_region(text)
    if extract_code(region, "html") is not None:
        return "html"
    python = extract_code(region, "python")
    if python is not None:
        return "cad" if "build123d" in python else "chart"
    lowered = region.lower()
    if "<!doctype html" in lowered or "<html" in lowered:
        return "html"
    if extract_code(region, "svg") is not None or region.lstrip()[:5].lower().startswith(("<svg", "<?xml")):
        return "svg"  # the second: SVG cut off before its end, named as such
    return None


def _read_target(item: Item, value: Any, base: Path) -> None:
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in CODE_KINDS:
        kind, source = next(iter(value.items()))  # {"svg": "<svg ...>"}: inline source, rendered
        item.target, item.target_kind, item.target_render = _shorten(str(source)), "image", kind
        if isinstance(source, str):
            item.target_value = source
        else:
            item.target_error = f"target {kind} source is {type(source).__name__}, not a string"
        return
    if isinstance(value, dict):
        if "box" in value:
            value = value["box"]
        elif "text" in value:
            value = {"text": value["text"]}
        elif "image" in value:
            value = str(value["image"])
            path = _as_path(value, base)
            item.target = value
            if path is None:
                item.target_error = f"file not found: {value if _missing_file(value, base) is None else base / value}"
                item.target_kind = "image"
            else:
                item.target_kind, item.target_value = "image", path
            return
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        item.target, item.target_kind, item.target_value = _shorten(value["text"]), "text", value["text"]
        return
    if isinstance(value, list):
        item.target = json.dumps(value)
        if len(value) == 4 and all(
            isinstance(v, int | float) and not isinstance(v, bool) and _finite(v) for v in value
        ):
            item.target_kind, item.target_value = "box", [float(v) for v in value]
        else:
            item.target_error = "target box must be 4 finite numbers"
            item.target_kind = "box"
        return
    if isinstance(value, str):
        path = _as_path(value, base)
        if path is not None and path.suffix.lower() in IMAGE_EXTENSIONS:
            item.target, item.target_kind, item.target_value = str(path), "image", path
            return
        if path is not None and path.suffix.lower() in _SOURCE_SUFFIXES:  # a source file: rendered like a prediction
            text, problem = _read_text(path)
            kind = _SOURCE_SUFFIXES[path.suffix.lower()]
            kind = "cad" if kind == "chart" and text and "build123d" in text else kind
            item.target, item.target_kind, item.target_render, item.target_value = str(path), "image", kind, text
            if text is None:
                item.target_error = f"target file {problem}"
            return
        if path is not None and path.suffix.lower() == ".txt":
            text, problem = _read_text(path)
            item.target, item.target_kind, item.target_value = str(path), "text", text
            if text is None:
                item.target_error = f"target file {problem}"
            return
        missing = _missing_file(value, base) if path is None else None
        if missing is not None:  # a file name, not a text target
            suffix = missing.suffix.lower()
            item.target, item.target_kind = str(missing), "text" if suffix == ".txt" else "image"
            item.target_render = _SOURCE_SUFFIXES.get(suffix, "")
            item.target_error = f"file not found: {missing}"
            return
        item.target, item.target_kind, item.target_value = _shorten(value), "text", value
        return
    item.target = json.dumps(value) if value is not None else ""
    item.target_error = "no target (need an image path, a box or a text)"


def _as_path(value: str, base: Path) -> Path | None:
    """`value` as an existing file (relative to `base`), or None if it is not one."""
    if not value or len(value) > 4096 or "\n" in value or "\x00" in value:
        return None
    path = Path(value)
    if not path.is_absolute():
        path = base / path
    try:
        return path if path.is_file() else None
    except OSError:
        return None


def _missing_file(value: str, base: Path) -> Path | None:
    """The path `value` names when it reads as a file name (one short line ending in a known file suffix, no spaces
    unless it has a folder) but no such file exists; None otherwise (it is an answer or inline source)."""
    if not value or len(value) > 4096 or "\n" in value or "\x00" in value or value.lstrip().startswith("<"):
        return None
    if " " in value and "/" not in value:  # "the answer is chart.py": a sentence, not a path
        return None
    path = Path(value)
    if path.suffix.lower() not in (*IMAGE_EXTENSIONS, *_FILE_KINDS):
        return None
    path = path if path.is_absolute() else base / path
    try:
        return None if path.exists() else path
    except OSError:
        return None


def _read_text(path: Path) -> tuple[str | None, str]:
    """A source or text file's contents, or None and why not ("x.svg is not UTF-8 (...)"): too large, unreadable, or
    not UTF-8 (refused, not repaired: a replaced byte would render or score as something the file does not say)."""
    try:
        size = path.stat().st_size
        if size > MAX_TEXT_FILE:
            return None, f"{path.name} is {size} bytes, over the limit of {MAX_TEXT_FILE}"
        data = path.read_bytes()
    except OSError as e:
        return None, f"{path.name} cannot be read ({e.strerror or e})"
    try:
        return data.decode("utf-8"), ""
    except UnicodeDecodeError as e:
        return None, f"{path.name} is not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})"


def _shorten(text: str, limit: int = 80) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def load_image(path: Path, size: tuple[int, int]) -> torch.Tensor:
    """An image file as `[H, W, 3]` uint8 at `size = (W, H)`, as a viewer shows it (`rewards.image_files.viewed_rgb`:
    EXIF orientation applied, transparency composited on white, 16-bit scaled), then resized (bicubic)."""
    with Image.open(path) as image:
        rgb = viewed_rgb(image)
    if rgb.size != size:
        rgb = rgb.resize(size, Image.Resampling.BICUBIC)
    return torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).view(size[1], size[0], 3)
