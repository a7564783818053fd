"""`mmrl score`: score predictions against targets with the reward library, without training anything.

The command's core: `mmrl.cli` adds `add_arguments` to its `score` subcommand and calls `run`; reading the pairs
is `rewards.score_inputs`.

Inputs
------
A JSON-lines file, one pair per line::

    {"id": "a1", "prediction": "<svg ...>...</svg>", "target": "targets/a1.png"}
    {"id": "a2", "prediction": "preds/a2.svg", "target": "targets/a2.png"}
    {"id": "b1", "prediction": "<answer>[10, 20, 50, 60]</answer>", "target": [12, 18, 49, 61]}
    {"id": "c1", "prediction": "charts/c1.py", "target": {"text": "Revenue by year"}}

or a folder laid out as ``DIR/pred/<stem>.<ext>`` and ``DIR/target/<stem>.<ext>``, pairs matched by file stem
(``pred/cat.svg`` goes with ``target/cat.png``; a stem on one side only is a row with the reason).

A **prediction** is one of: SVG source or a ``.svg`` file (rendered in the sandbox at ``--size``), chart code or a
``.py`` file (matplotlib, rendered in the sandbox), HTML or a ``.html`` file (headless Chromium, in the sandbox), an
image file (``.png``, ``.jpg``, ...), or text (a ``.txt``
file, or an inline string: a model's answer, parsed for a box by ``box_iou``). Inline strings are read as
``--render`` says: ``svg``/``chart``/``cad``/``html`` render them (a ``.py`` file that imports build123d is CAD),
``auto`` (default) renders text that holds code (a block fenced as ``html`` or ``python``, an HTML page, an SVG
fenced or bare; `rewards.score_inputs.code_kind`) and takes anything else as text. Sources, inline or in files, are
read as a model writes them and as the render envs read their answers (`rewards.parse.answer_code`): think blocks
skipped, the last ``<answer>`` tag's content, the last block fenced in the kind's language, else the bare code (for
SVG the ``<svg>...</svg>`` after any leading sentence); a source holding none is the prediction's failure, named.
Relative paths are relative to the JSON-lines file.

A **target** is an image path (``{"image": path}`` or a string with an image extension; ``.png``/``.jpg`` files in
folder mode), a source rendered like a prediction and compared as an image (a ``.svg``, ``.py`` or ``.html``
file, or ``{"svg": ...}``, ``{"chart": ...}``, ``{"cad": ...}``, ``{"html": ...}`` inline; each distinct target is rendered once a run), a box ``[x1, y1, x2, y2]`` (``{"box": [...]}``; a ``.json`` file in folder mode), or a text
(``{"text": ...}``, any other string; a ``.txt`` file). ``{"reference_length": N}`` on a line gives
``code_length`` its reference.

Metrics (``--metrics``, comma-separated)
---------------------------------------
``pixel``, ``ssim``, ``edge``, ``color_histogram``, ``embedding`` (needs ``--encoder``): prediction image against
target image, both brought to ``--size`` (PIL bicubic; transparency composited on white). ``ocr``: words read in the
prediction image against a text target. ``box_iou``: the box parsed from a text prediction against a box target.
``text_f1``: word F1 of a text prediction against a text target. ``code_length``: the source's length against
``reference_length`` (or ``--reference-length``).

A metric that does not apply to a row's kinds is left empty (NaN, and out of the summary), and the row's reason
names the side that does not fit it (the prediction, the target or both). A prediction that fails (render refused,
timed out or crashed; unreadable file; no code or no box in it) scores 0.0 on every metric that applies, and the row
says why. The summary starts with how many renders were refused or failed and the commonest reasons; in folder mode a
file without a partner of the same stem is listed apart, not counted as a pair. Nothing in the data makes the command
fail.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rewards.box import box_iou
from rewards.image import (
    HFImageEncoder,
    code_length_reward,
    color_histogram_similarity,
    edge_similarity,
    embedding_similarity,
    pixel_similarity,
    ssim,
)
from rewards.ocr import ocr_similarity, text_f1
from rewards.parse import parse_box
from rewards.render import RenderPool
from rewards.score_inputs import CODE_KINDS, IMAGE_EXTENSIONS, MAX_TEXT_FILE, Item, load_image, read_items

__all__ = [
    "CODE_KINDS",
    "EXAMPLES",
    "IMAGE_EXTENSIONS",
    "IMAGE_METRICS",
    "MAX_TEXT_FILE",
    "METRICS",
    "Item",
    "add_arguments",
    "load_image",
    "read_items",
    "run",
    "score_items",
    "summary",
    "write_rows",
]

IMAGE_METRICS = ("pixel", "ssim", "edge", "color_histogram", "embedding")
METRICS = (*IMAGE_METRICS, "ocr", "box_iou", "text_f1", "code_length")

EXAMPLES = """examples:
  mmrl score pairs.jsonl --metrics ssim,pixel,edge --render svg --size 256 --out scores.csv
  mmrl score runs/eval_svgs --metrics ssim,color_histogram --out scores.jsonl   # DIR/pred/*.svg vs DIR/target/*.png
  mmrl score boxes.jsonl --metrics box_iou
  mmrl score charts.jsonl --render chart --metrics ssim,ocr --timeout 20

pairs.jsonl holds one {"id": ..., "prediction": ..., "target": ...} per line; see `rewards.score` for the kinds.
"""


# =========================================================================================================== SCORING


def score_items(
    items: list[Item],
    metrics: Sequence[str],
    *,
    size: tuple[int, int] = (256, 256),
    timeout: float = 10.0,
    workers: int = 2,
    encoder: Callable[[torch.Tensor], torch.Tensor] | None = None,
    reference_length: float | None = None,
    batch_size: int = 64,
    progress: bool | None = None,
) -> list[Item]:
    """Fills each item's `scores` (and `pred_error` where its prediction fails), in place, chunk by chunk.

    Args:
        items: from `read_items`.
        metrics: names from `METRICS`.
        size: `(W, H)` images are rendered at and resized to.
        timeout: per-render limit in seconds.
        workers: sandbox workers per render kind.
        encoder: the image encoder for `embedding`.
        reference_length: default reference for `code_length`.
        batch_size: rows rendered and scored together.
        progress: show a tqdm bar; None shows one for more than two batches on a terminal.

    Returns:
        `items`.
    """
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; valid: {', '.join(METRICS)}")
    if "embedding" in metrics and encoder is None:
        raise ValueError("the embedding metric needs an image encoder (--encoder PATH)")
    pools: dict[str, RenderPool] = {}
    target_renders: dict[tuple[str, str], Any] = {}  # (kind, source) -> RenderResult: each target rendered once
    bar = tqdm(
        total=len(items),
        unit="pair",
        disable=(not sys.stderr.isatty() or len(items) <= 2 * batch_size) if progress is None else not progress,
    )
    try:
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            _score_chunk(chunk, metrics, size, timeout, workers, pools, encoder, reference_length, target_renders)
            _note_empty_scores(chunk, metrics)
            bar.update(len(chunk))
    finally:
        bar.close()
        for pool in pools.values():
            pool.close()
    return items


def _score_chunk(
    chunk: list[Item],
    metrics: Sequence[str],
    size: tuple[int, int],
    timeout: float,
    workers: int,
    pools: dict[str, RenderPool],
    encoder: Callable[[torch.Tensor], torch.Tensor] | None,
    reference_length: float | None,
    target_renders: dict[tuple[str, str], Any],
) -> None:
    # ------------------------------------------------------------------------------------------ images, both sides
    pred_images: dict[int, torch.Tensor] = {}
    if any(m in IMAGE_METRICS or m == "ocr" for m in metrics):
        for kind in CODE_KINDS:
            rows = [i for i, item in enumerate(chunk) if item.pred_kind == kind and not item.pred_error]
            if not rows:
                continue
            if kind not in pools:
                pools[kind] = RenderPool(kind, workers)
            results = pools[kind].render_batch([chunk[i].pred_value for i in rows], size, timeout=timeout)
            for i, result in zip(rows, results):
                chunk[i].render_seconds = round(result.seconds, 4)
                if result.image is None:
                    chunk[i].pred_error = f"render failed: {result.reason}"
                else:
                    pred_images[i] = result.image
        for i, item in enumerate(chunk):
            if item.pred_kind == "image" and not item.pred_error:
                try:
                    pred_images[i] = load_image(item.pred_value, size)
                except Exception as e:  # any unreadable or hostile file is the row's problem, not the run's
                    item.pred_error = f"cannot read prediction image: {type(e).__name__}: {e}"
    target_images: dict[int, torch.Tensor] = {}
    if any(m in IMAGE_METRICS for m in metrics):
        for kind in CODE_KINDS:  # targets given as sources: rendered in the sandbox like predictions, once each
            rows = [i for i, item in enumerate(chunk) if item.target_render == kind and not item.target_error]
            missing = list(
                dict.fromkeys(
                    chunk[i].target_value for i in rows if (kind, chunk[i].target_value) not in target_renders
                )
            )
            if missing:
                if kind not in pools:
                    pools[kind] = RenderPool(kind, workers)
                for source, result in zip(missing, pools[kind].render_batch(missing, size, timeout=timeout)):
                    target_renders[kind, source] = result
            for i in rows:
                result = target_renders[kind, chunk[i].target_value]
                if result.image is None:
                    chunk[i].target_error = f"target render failed: {result.reason}"
                else:
                    target_images[i] = result.image
        for i, item in enumerate(chunk):
            if item.target_kind == "image" and not item.target_render and not item.target_error:
                try:
                    target_images[i] = load_image(item.target_value, size)
                except Exception as e:
                    item.target_error = f"cannot read target image: {type(e).__name__}: {e}"

    def fill(name: str, target_kind: str, pred_kinds: tuple[str, ...], scored: dict[int, float]) -> None:
        """Scores where computed; 0.0 where the prediction failed but the metric applies; NaN where it does not."""
        for i, item in enumerate(chunk):
            applies = item.target_kind == target_kind and not item.target_error and item.pred_kind in pred_kinds
            item.scores[name] = scored[i] if i in scored else 0.0 if applies and item.pred_error else math.nan

    # ---------------------------------------------------------------------------------------------------- metrics
    image_fns: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "pixel": pixel_similarity,
        "ssim": ssim,
        "edge": edge_similarity,
        "color_histogram": color_histogram_similarity,
        "embedding": lambda a, b: embedding_similarity(a, b, encoder),  # type: ignore[arg-type]
    }
    image_kinds = (*CODE_KINDS, "image")
    pairs = [i for i in range(len(chunk)) if i in pred_images and i in target_images]
    for name in metrics:
        scored: dict[int, float] = {}
        if name in IMAGE_METRICS:
            if pairs:
                a = torch.stack([pred_images[i] for i in pairs])  # [n, H, W, 3]
                b = torch.stack([target_images[i] for i in pairs])  # [n, H, W, 3]
                scored = dict(zip(pairs, image_fns[name](a, b).tolist()))
            fill(name, "image", image_kinds, scored)
        elif name == "ocr":
            rows = [i for i, item in enumerate(chunk) if i in pred_images and item.target_kind == "text"]
            if rows:
                images = torch.stack([pred_images[i] for i in rows])  # [n, H, W, 3]
                scored = dict(zip(rows, ocr_similarity(images, [chunk[i].target_value for i in rows]).tolist()))
            fill(name, "text", image_kinds, scored)
        elif name == "box_iou":
            for i, item in enumerate(chunk):
                if item.target_kind == "box" and not item.target_error and item.pred_kind == "text":
                    parsed = parse_box(item.pred_value)
                    if parsed.box is None:
                        item.pred_error = item.pred_error or f"no box in the prediction: {parsed.reason}"
                    else:
                        scored[i] = float(box_iou(torch.tensor([parsed.box]), torch.tensor([item.target_value]))[0])
            fill(name, "box", ("text",), scored)
        elif name == "text_f1":
            rows = [i for i, item in enumerate(chunk) if item.pred_kind == "text" and not item.pred_error]
            rows = [i for i in rows if chunk[i].target_kind == "text" and not chunk[i].target_error]
            if rows:
                predictions, targets = [chunk[i].pred_value for i in rows], [chunk[i].target_value for i in rows]
                scored = dict(zip(rows, text_f1(predictions, targets).tolist()))
            fill(name, "text", ("text",), scored)
        elif name == "code_length":
            for item in chunk:
                reference = item.reference_length if item.reference_length is not None else reference_length
                source = item.pred_value if item.pred_kind in (*CODE_KINDS, "text") else None
                if isinstance(source, str) and reference is not None and reference > 0:
                    item.scores[name] = float(code_length_reward([source], reference)[0])
                else:
                    item.scores[name] = math.nan


_IMAGE_SIDE = (*CODE_KINDS, "image")
# metric -> (the prediction kinds it reads, the target kind it reads); code_length reads a reference length instead.
_APPLIES: dict[str, tuple[tuple[str, ...], str | None]] = {name: (_IMAGE_SIDE, "image") for name in IMAGE_METRICS}
_APPLIES.update(ocr=(_IMAGE_SIDE, "text"), box_iou=(("text",), "box"), text_f1=(("text",), "text"))
_APPLIES["code_length"] = ((*CODE_KINDS, "text"), None)
_KIND_WORDS = {"svg": "an SVG", "html": "HTML", "image": "an image", "text": "text", "cad": "a CAD script"}


def _kind_words(kind: str) -> str:
    return _KIND_WORDS.get(kind, f"a {kind}" if kind else "nothing")


def _note_empty_scores(chunk: list[Item], metrics: Sequence[str]) -> None:
    """Gives every row whose asked-for metrics are partly empty without a failure the reason, naming the side that
    does not fit each metric (the prediction, the target, or both) or the missing reference length."""
    wants = {_IMAGE_SIDE: "an image or a source to render (svg, chart, cad, html)", ("text",): "text"}
    wants[_APPLIES["code_length"][0]] = "a source or text"
    for item in chunk:
        empty = [name for name in metrics if math.isnan(item.scores.get(name, math.nan))]
        if not empty or item.pred_error or item.target_error:
            continue
        reasons = []
        for name in empty:
            pred_kinds, target_kind = _APPLIES[name]
            wrong = []
            if item.pred_kind not in pred_kinds:
                wrong.append(f"the prediction must be {wants[pred_kinds]} (not {_kind_words(item.pred_kind)})")
                if item.pred_kind == "text":
                    wrong[-1] += ": inline text is read as code when it holds SVG, HTML or fenced code, or by --render"
            if target_kind is not None and item.target_kind != target_kind:
                wrong.append(f"the target must be {_kind_words(target_kind)} (not {_kind_words(item.target_kind)})")
            if target_kind is None and not wrong:
                wrong.append("it needs a reference length (reference_length on the line, or --reference-length)")
            if not wrong:
                wrong.append(f"not scored for {_kind_words(item.pred_kind)} against {_kind_words(item.target_kind)}")
            reasons.append(f"{name}: " + " and ".join(wrong))
        item.note = "empty: " + "; ".join(reasons)


# =========================================================================================================== OUTPUT


def write_rows(items: Sequence[Item], metrics: Sequence[str], out: Path) -> None:
    """Per-item scores to CSV (`.csv`) or JSON lines (anything else, e.g. `.jsonl`); empty/null where NaN."""
    columns = ["id", "prediction", "target", *metrics, "render_seconds", "reason"]
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for item in items:
        row: dict[str, Any] = {"id": item.id, "prediction": item.prediction, "target": item.target}
        for name in metrics:
            value = item.scores.get(name, math.nan)
            row[name] = None if math.isnan(value) else round(value, 6)
        row["render_seconds"] = item.render_seconds
        row["reason"] = item.reason
        rows.append(row)
    with open(out, "w", encoding="utf-8", newline="") as f:
        if out.suffix.lower() == ".csv":
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: "" if v is None else v for k, v in row.items()})
        else:
            for row in rows:
                f.write(json.dumps(row) + "\n")


def summary(items: Sequence[Item], metrics: Sequence[str], *, top: int = 5) -> str:
    """What was refused and why first, then a table of mean/std/min/max per metric over the rows where it applies."""
    unpaired = [item for item in items if item.unpaired]
    items = [item for item in items if not item.unpaired]
    failed = [item for item in items if item.pred_error or item.target_error]
    renders = [item for item in items if item.pred_kind in CODE_KINDS and item.pred_value is not None]  # attempted
    failed_renders = [item for item in renders if item.pred_error.startswith("render failed")]
    refused = [item for item in failed_renders if "refused" in item.pred_error]
    target_renders = [item for item in items if item.target_render]
    failed_targets = [item for item in target_renders if item.target_error.startswith("target render failed")]
    lines = [
        f"{len(items)} pairs; {len(failed_renders)} of {len(renders)} renders failed ({len(refused)} refused by the "
        f"sandbox's checks)" + (f"; {len(failed_targets)} of {len(target_renders)} target renders failed" if target_renders else "")
        + f"; {len(failed)} pairs with a problem"
    ]  # fmt: skip
    if unpaired:
        names = ", ".join(f"{i.prediction or i.target}" for i in unpaired[:top])
        lines.append(
            f"{len(unpaired)} files without a partner of the same stem in the other folder, not scored: {names}"
            + (", ..." if len(unpaired) > top else "")
        )
    if failed:
        reasons = Counter(_reason_key("; ".join(r for r in (i.pred_error, i.target_error) if r)) for i in failed)
        lines.append("top reasons:")
        lines.extend(f"  {count:5d}  {reason}" for reason, count in reasons.most_common(top))
    notes = Counter(_reason_key(item.note) for item in items if item.note)
    if notes:
        lines.append("empty scores:")
        lines.extend(f"  {count:5d}  {note}" for note, count in notes.most_common(top))
    lines += ["", f"{'metric':16s} {'n':>6s} {'mean':>8s} {'std':>8s} {'min':>8s} {'max':>8s}"]
    for name in metrics:
        values = [item.scores[name] for item in items if not math.isnan(item.scores.get(name, math.nan))]
        if values:
            std = statistics.pstdev(values) if len(values) > 1 else 0.0
            lines.append(
                f"{name:16s} {len(values):6d} {statistics.fmean(values):8.4f} {std:8.4f} {min(values):8.4f} {max(values):8.4f}"
            )
        else:
            lines.append(f"{name:16s} {0:6d} {'-':>8s} {'-':>8s} {'-':>8s} {'-':>8s}")
    return "\n".join(lines)


def _reason_key(reason: str) -> str:
    """Groups reasons that differ only in details (numbers, quoted values)."""
    key = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", reason)
    key = re.sub(r"\d+(\.\d+)?", "N", key)
    return key[:100]


# ============================================================================================================== CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `mmrl score` arguments."""
    parser.add_argument("input", type=Path, help="a JSON-lines file of pairs, or a folder with pred/ and target/")
    parser.add_argument(
        "--metrics", default="ssim,pixel", help=f"comma-separated, from: {', '.join(METRICS)} (default: ssim,pixel)"
    )
    parser.add_argument(
        "--render",
        choices=("auto", *CODE_KINDS, "none"),
        default="auto",
        help="how inline prediction strings are read (files go by extension); default: auto",
    )
    parser.add_argument("--size", default="256", help="image size: 256 or WxH, e.g. 320x240 (default: 256)")
    parser.add_argument("--out", type=Path, help="per-item scores: .csv, or .jsonl (JSON lines)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per render (default: 10)")
    parser.add_argument("--workers", type=int, default=2, help="sandbox workers per render kind (default: 2)")
    parser.add_argument("--batch-size", type=int, default=64, help="pairs rendered and scored together (default: 64)")
    parser.add_argument("--encoder", help="a CLIP/SigLIP checkpoint folder, for the embedding metric")
    parser.add_argument("--reference-length", type=float, help="reference length for code_length (chars)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Runs `mmrl score` with parsed arguments; returns the exit code."""
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    unknown = [m for m in metrics if m not in METRICS]
    if unknown or not metrics:
        print(f"mmrl score: unknown metric(s) {unknown}; valid: {', '.join(METRICS)}", file=sys.stderr)
        return 2
    try:
        parts = [int(v) for v in args.size.lower().split("x")]
        size = (parts[0], parts[0]) if len(parts) == 1 else (parts[0], parts[1])
        if len(parts) > 2 or min(size) < 1 or max(size) > 4096:
            raise ValueError
    except ValueError:
        print(f"mmrl score: --size must be N or WxH (1-4096), got {args.size!r}", file=sys.stderr)
        return 2
    if not args.input.exists():
        print(f"mmrl score: no such file or folder: {args.input}", file=sys.stderr)
        return 2
    encoder = None
    if "embedding" in metrics:
        if not args.encoder:
            print("mmrl score: the embedding metric needs --encoder PATH (a CLIP/SigLIP checkpoint)", file=sys.stderr)
            return 2
        encoder = HFImageEncoder.from_pretrained(args.encoder)
    try:
        items = read_items(args.input, args.render)
    except (OSError, FileNotFoundError) as e:
        print(f"mmrl score: {e}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    score_items(
        items,
        metrics,
        size=size,
        timeout=args.timeout,
        workers=args.workers,
        encoder=encoder,
        reference_length=args.reference_length,
        batch_size=args.batch_size,
        progress=False if args.no_progress else None,
    )
    seconds = time.perf_counter() - start
    if args.out is not None:
        write_rows(items, metrics, args.out)
    print(summary(items, metrics))
    print(f"\nscored in {seconds:.1f} s" + (f"; per-item scores in {args.out}" if args.out is not None else ""))
    return 0
