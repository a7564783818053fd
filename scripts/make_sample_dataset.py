"""Write the sample dataset `assets/datasets/shapes_qa/`: 24 small images of flat shapes and questions about them.

The `dataset` env (`sim/tasks/dataset.py`) reads it when no `path` is given, so the env builds and trains with its
defaults. Every run writes the same bytes (a seeded generator, PIL drawing without antialiasing, PNG without
timestamps):

    python scripts/make_sample_dataset.py            # into assets/datasets/shapes_qa
    python scripts/make_sample_dataset.py --out DIR
    python scripts/make_sample_dataset.py --records 480 --out assets/datasets/shapes_qa_480   # configs/dataset_tiny

Records (one JSON object a line in `data.jsonl`, images in `images/`, paths relative to the file's folder) cycle
through four kinds, so both the training part and the held-out tail of the file hold each kind:

* box: "Find the red circle." -> `box` [x1, y1, x2, y2], the tight box of the shape's pixels, x2/y2 exclusive;
* point: "Point at the blue square." -> `point` [x, y], the centre of that box;
* count: "How many shapes are in the image?" -> `answer` "3";
* colour: "What colour is the triangle?" -> `answer` "green".

Images are 48 to 64 pixels on a side and not all square, so the env's letterboxing is exercised.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "assets" / "datasets" / "shapes_qa"
COLOURS = {"red": (220, 30, 30), "green": (30, 160, 50), "blue": (30, 70, 220), "yellow": (235, 195, 10)}
KINDS = ("circle", "square", "triangle")
SIZES = ((64, 64), (64, 48), (48, 64), (56, 56))  # (width, height)
KIND_CYCLE = ("box", "point", "box", "count", "box", "colour")  # 12 box, 4 point, 4 count, 4 colour in 24
NUM_RECORDS = 24
SEED = 20_250_101


def draw_shape(draw: ImageDraw.ImageDraw, kind: str, x: int, y: int, side: int, colour: tuple[int, int, int]) -> None:
    """One filled shape in the square `(x, y, side)`; PIL boxes include both corners, hence `side - 1`."""
    last = side - 1
    if kind == "circle":
        draw.ellipse((x, y, x + last, y + last), fill=colour)
    elif kind == "square":
        draw.rectangle((x, y, x + last, y + last), fill=colour)
    else:
        draw.polygon([(x + last / 2, y), (x + last, y + last), (x, y + last)], fill=colour)


def place_shapes(width: int, height: int, rng: np.random.Generator):
    """2 or 3 shapes of distinct kinds and colours (so "the red circle" and "the triangle" each name one shape) at
    free spots: (kinds, colours, boxes), or None when a shape found no free spot in 200 tries."""
    count = int(rng.integers(2, 4))
    kinds = [KINDS[int(i)] for i in rng.permutation(len(KINDS))[:count]]
    colours = [list(COLOURS)[int(i)] for i in rng.permutation(len(COLOURS))[:count]]
    boxes: list[tuple[int, int, int, int]] = []
    for _kind in kinds:
        side = int(rng.integers(12, 19))
        for _ in range(200):  # free spots are plentiful: 3 shapes of <= 18 px in >= 48 x 48
            x, y = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
            if all(
                x + side + 2 <= bx or bx2 + 2 <= x or y + side + 2 <= by or by2 + 2 <= y for bx, by, bx2, by2 in boxes
            ):
                break
        else:
            return None
        boxes.append((x, y, x + side, y + side))
    return kinds, colours, boxes


def make_record(index: int, rng: np.random.Generator) -> tuple[Image.Image, dict]:
    """One image and its record (without the image path)."""
    width, height = SIZES[index % len(SIZES)]
    for _ in range(100):  # a layout with no free spot left is drawn again (rare: record 482 of 4800 was the first)
        layout = place_shapes(width, height, rng)
        if layout is not None:
            break
    else:
        raise RuntimeError(f"record {index}: no layout of its shapes found in 100 tries")
    image = Image.new("RGB", (width, height), (235, 235, 230))
    kinds, colours, boxes = layout
    for kind, colour, (x, y, x2, _) in zip(kinds, colours, boxes):
        draw_shape(ImageDraw.Draw(image), kind, x, y, x2 - x, COLOURS[colour])
    count = len(kinds)
    target = int(rng.integers(count))
    kind, colour = kinds[target], colours[target]
    # The tight box of the target's drawn pixels (a triangle's top row is narrower but still one pixel high).
    mask = np.all(np.asarray(image) == COLOURS[colour], axis=-1)  # [H, W]
    ys, xs = np.nonzero(mask)
    box = [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]
    question_kind = KIND_CYCLE[index % len(KIND_CYCLE)]
    if question_kind == "box":
        record = {"question": f"Find the {colour} {kind}.", "box": box}
    elif question_kind == "point":
        record = {
            "question": f"Point at the {colour} {kind}.",
            "point": [(box[0] + box[2]) / 2, (box[1] + box[3]) / 2],
        }
    elif question_kind == "count":
        record = {"question": "How many shapes are in the image?", "answer": str(count)}
    else:
        record = {"question": f"What colour is the {kind}?", "answer": colour}
    return image, record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    parser.add_argument("--records", type=int, default=NUM_RECORDS, help="how many records")
    args = parser.parse_args()
    (args.out / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    lines = []
    for index in range(args.records):
        image, record = make_record(index, rng)
        name = f"images/{index:03d}.png"
        image.save(args.out / name, optimize=True)
        lines.append(json.dumps({"image": name, **record}))
    (args.out / "data.jsonl").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.records} records to {args.out}")


if __name__ == "__main__":
    main()
