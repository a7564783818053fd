"""Write small samples laid out as four public datasets store themselves on the Hugging Face hub, with synthetic images.

Each sample is a dataset repository folder as `huggingface-cli download --repo-type dataset` writes it: a
`README.md` card whose YAML declares the features and the `configs` / `data_files` of its split, and one parquet
shard `data/<split>-00000-of-00001.parquet` with the public set's column names and types (images embedded as the
hub's `Image` feature stores them, `{"bytes": PNG, "path": NAME}` structs) and the schema's `huggingface` metadata.
No download: the images are drawn with PIL, from one seeded generator per sample, so every run writes the same bytes.

    python scripts/make_public_samples.py                 # all four, into assets/datasets/<name>
    python scripts/make_public_samples.py --only chartqa  # one of them
    python scripts/make_public_samples.py --out DIR       # elsewhere

| sample (folder) | the public set | columns | split (rows) |
|---|---|---|---|
| `refcoco_shapes` | `lmms-lab/RefCOCO` | `question_id`, `image`, `question` (the set's fixed prompt), `answer` (the referring expressions, a list), `segmentation` (a polygon), `bbox` (`[x, y, w, h]` pixels, float32), `iscrowd`, `file_name` | `val` (320) |
| `screenspot_shapes` | `rootsautomation/ScreenSpot` | `file_name`, `bbox` (`[x1, y1, x2, y2]` pixels, float64), `instruction`, `data_type` (`text`/`icon`), `data_source`, `image` | `test` (320) |
| `geometry3k_shapes` | `hiyouga/geometry3k` (EasyR1's) | `images` (a list of one image), `problem` (`"<image>..."`), `answer` (a number as text) | `train` (320) |
| `chartqa_shapes` | `HuggingFaceM4/ChartQA` | `image`, `query`, `label` (a list of one accepted answer), `human_or_machine` (0 human, 1 machine) | `train` (320) |

The tasks can be learnt from the pixels by a small model:

* RefCOCO: 2 or 3 flat shapes of distinct kinds and colours; each expression names one ("the red circle", "the
  triangle", "the blue shape"); the box is the tight box of its pixels.
* ScreenSpot: a screen (desktop-wide or phone-tall) with a title bar and 3 elements: icons (a coloured shape) and
  text buttons (a word on a coloured button); the instruction names the icon by its colour and kind or the button by
  its colour ("click the green button"), the box is the element's.
* Geometry3K: one regular polygon (3 to 6 sides, any colour, size and rotation); the problem asks one interior angle,
  the angle sum or the number of diagonals, each a whole number set by the number of sides.
* ChartQA: a bar chart of 3 or 4 bars of distinct colours on a 0-100 scale (gridlines at 25, 50, 75); the query asks
  the value of the bar of one colour (its height, a whole number: 5% tolerance is relaxed accuracy's).
"""

from __future__ import annotations

import argparse
import io
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from make_sample_dataset import COLOURS, KINDS, draw_shape, place_shapes  # scripts/, on sys.path when run
from PIL import Image, ImageDraw

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "assets" / "datasets"
ROWS = 320
SEED = 20_261_129
BACKGROUND = (235, 235, 230)
IMAGE_FEATURE = {"_type": "Image"}
# lmms-lab/RefCOCO's `question`, the same in every row (its referring expressions are the `answer` list).
REFCOCO_PROMPT = "Please carefully observe the area circled in the image and come up with a caption for the area."


def png(image: Image.Image) -> bytes:
    """The image as PNG bytes (no timestamps, so the same image gives the same bytes)."""
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def tight_box(image: Image.Image, colour: tuple[int, int, int]) -> list[int]:
    """`[x1, y1, x2, y2]` (x2, y2 exclusive) of the pixels of exactly `colour`."""
    ys, xs = np.nonzero(np.all(np.asarray(image) == colour, axis=-1))
    return [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]


# ------------------------------------------------------------------------------------------------ RefCOCO
def refcoco_row(index: int, rng: np.random.Generator) -> dict:
    """One lmms-lab/RefCOCO row: shapes, and expressions naming one of them with its `[x, y, w, h]` box."""
    width, height = ((64, 64), (80, 64), (64, 80), (72, 56))[index % 4]
    layout = None
    while layout is None:
        layout = place_shapes(width, height, rng)
    kinds, colours, boxes = layout
    image = Image.new("RGB", (width, height), BACKGROUND)
    for kind, colour, (x, y, x2, _) in zip(kinds, colours, boxes):
        draw_shape(ImageDraw.Draw(image), kind, x, y, x2 - x, COLOURS[colour])
    target = int(rng.integers(len(kinds)))
    kind, colour = kinds[target], colours[target]
    x1, y1, x2, y2 = tight_box(image, COLOURS[colour])
    # Two phrasings, as RefCOCO's annotators give several; each names the target alone (kinds and colours are
    # distinct in an image).
    expressions = [f"the {colour} {kind}", rng.choice([f"the {kind}", f"the {colour} shape"]).item()]
    name = f"COCO_train2014_{index:012d}.jpg"
    return {
        "question_id": str(index),
        "image": {"bytes": png(image), "path": name},
        "question": REFCOCO_PROMPT,
        "answer": expressions,
        "segmentation": [float(v) for v in (x1, y1, x2, y1, x2, y2, x1, y2)],
        "bbox": [float(x1), float(y1), float(x2 - x1), float(y2 - y1)],
        "iscrowd": 0,
        "file_name": name,
    }


REFCOCO = {
    "split": "val",
    "row": refcoco_row,
    "features": {
        "question_id": ("string", pa.string()),
        "image": (IMAGE_FEATURE, None),
        "question": ("string", pa.string()),
        "answer": ({"feature": "string"}, pa.list_(pa.string())),
        "segmentation": ({"feature": "float32"}, pa.list_(pa.float32())),
        "bbox": ({"feature": "float32"}, pa.list_(pa.float32())),
        "iscrowd": ("int8", pa.int8()),
        "file_name": ("string", pa.string()),
    },
}


# ------------------------------------------------------------------------------------------------ ScreenSpot
WORDS = ("Save", "Open", "Send", "Edit", "Help", "Undo")
SOURCES = (("ios", (48, 80)), ("android", (48, 80)), ("macos", (80, 56)), ("windows", (80, 56)), ("web", (80, 56)))


def screenspot_row(index: int, rng: np.random.Generator) -> dict:
    """One rootsautomation/ScreenSpot row: a screen with 3 elements, an instruction naming one, its xyxy box."""
    source, (width, height) = SOURCES[index % len(SOURCES)]
    image = Image.new("RGB", (width, height), (250, 250, 250))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, width - 1, 6), fill=(90, 90, 100))  # a title bar: elements sit below it
    colours = [list(COLOURS)[int(i)] for i in rng.permutation(len(COLOURS))[:3]]
    elements = []  # (kind of element, instruction, box)
    taken: list[tuple[int, int, int, int]] = []
    for colour in colours:
        button = bool(rng.integers(2))
        w, h = (int(rng.integers(27, 31)), 12) if button else (int(rng.integers(11, 15)),) * 2
        for _ in range(500):  # free spots are plentiful: 3 elements in 48 x 73 or more
            x, y = int(rng.integers(1, width - w)), int(rng.integers(8, height - h))
            if all(x + w + 2 <= a or c + 2 <= x or y + h + 2 <= b or d + 2 <= y for a, b, c, d in taken):
                break
        else:
            raise RuntimeError(f"row {index}: no free spot for an element")
        taken.append((x, y, x + w, y + h))
        if button:
            draw.rectangle((x, y, x + w - 1, y + h - 1), fill=COLOURS[colour])
            draw.text((x + 2, y + 1), WORDS[int(rng.integers(len(WORDS)))], fill=(255, 255, 255))
            elements.append(("text", f"click the {colour} button", [x, y, x + w, y + h]))
        else:
            kind = KINDS[int(rng.integers(len(KINDS)))]
            draw_shape(draw, kind, x, y, w, COLOURS[colour])
            elements.append(("icon", f"click the {colour} {kind} icon", [x, y, x + w, y + h]))
    data_type, instruction, box = elements[int(rng.integers(len(elements)))]
    name = f"{source}_{index:04d}.png"
    return {
        "file_name": name,
        "bbox": [float(v) for v in box],
        "instruction": instruction,
        "data_type": data_type,
        "data_source": source,
        "image": {"bytes": png(image), "path": name},
    }


SCREENSPOT = {
    "split": "test",
    "row": screenspot_row,
    "features": {
        "file_name": ("string", pa.string()),
        "bbox": ({"feature": "float64"}, pa.list_(pa.float64())),
        "instruction": ("string", pa.string()),
        "data_type": ("string", pa.string()),
        "data_source": ("string", pa.string()),
        "image": (IMAGE_FEATURE, None),
    },
}


# ------------------------------------------------------------------------------------------------ Geometry3K
PROBLEMS = (
    ("<image>The polygon shown is regular. Find x, the measure of one of its interior angles.",
     lambda n: 180 * (n - 2) // n),
    ("<image>Find the sum of the measures of the interior angles of the polygon.", lambda n: 180 * (n - 2)),
    ("<image>How many diagonals does the polygon have?", lambda n: n * (n - 3) // 2),
)  # fmt: skip


def geometry3k_row(index: int, rng: np.random.Generator) -> dict:
    """One hiyouga/geometry3k row: a regular polygon, a problem whose answer its number of sides sets."""
    sides = int(rng.integers(3, 7))
    size = 64
    image = Image.new("RGB", (size, size), (255, 255, 255))
    radius = float(rng.uniform(18, 28))
    cx, cy = size / 2 + rng.uniform(-3, 3), size / 2 + rng.uniform(-3, 3)
    turn = float(rng.uniform(0, 2 * math.pi))
    corners = [
        (
            cx + radius * math.cos(turn + 2 * math.pi * k / sides),
            cy + radius * math.sin(turn + 2 * math.pi * k / sides),
        )
        for k in range(sides)
    ]
    colour = list(COLOURS.values())[int(rng.integers(len(COLOURS)))]
    ImageDraw.Draw(image).polygon(corners, outline=colour, width=2)
    problem, answer = PROBLEMS[index % len(PROBLEMS)]
    return {
        "images": [{"bytes": png(image), "path": None}],
        "problem": problem,
        "answer": str(answer(sides)),
    }


GEOMETRY3K = {
    "split": "train",
    "row": geometry3k_row,
    "features": {
        "images": ({"feature": IMAGE_FEATURE, "_type": "Sequence"}, None),
        "problem": ("string", pa.string()),
        "answer": ("string", pa.string()),
    },
}


# ------------------------------------------------------------------------------------------------ ChartQA
def chartqa_row(index: int, rng: np.random.Generator) -> dict:
    """One HuggingFaceM4/ChartQA row: a bar chart on a 0-100 scale, the value of one bar asked."""
    width = height = 64
    image = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    left, bottom, top = 6, 60, 10  # the plot: value v is (bottom - top) * v / 100 pixels high
    for tick in (25, 50, 75, 100):
        y = round(bottom - (bottom - top) * tick / 100)
        draw.line((left, y, width - 2, y), fill=(215, 215, 215))
    draw.line((left, top, left, bottom), fill=(0, 0, 0))
    draw.line((left, bottom, width - 2, bottom), fill=(0, 0, 0))
    count = int(rng.integers(3, 5))
    colours = [list(COLOURS)[int(i)] for i in rng.permutation(len(COLOURS))[:count]]
    values = [int(rng.integers(10, 101)) for _ in colours]
    slot = (width - 2 - left - 2) // count
    for k, (colour, value) in enumerate(zip(colours, values)):
        x = left + 3 + k * slot
        draw.rectangle(
            (x, round(bottom - (bottom - top) * value / 100), x + slot - 4, bottom - 1), fill=COLOURS[colour]
        )
    target = int(rng.integers(count))
    return {
        "image": {"bytes": png(image), "path": None},
        "query": f"What is the value of the {colours[target]} bar?",
        "label": [str(values[target])],
        "human_or_machine": index % 2,
    }


CHARTQA = {
    "split": "train",
    "row": chartqa_row,
    "features": {
        "image": (IMAGE_FEATURE, None),
        "query": ("string", pa.string()),
        "label": ({"feature": "string"}, pa.list_(pa.string())),
        "human_or_machine": ({"names": ["human", "machine"], "_type": "ClassLabel"}, pa.int64()),
    },
}

SAMPLES: dict[str, dict] = {
    "refcoco_shapes": REFCOCO,
    "screenspot_shapes": SCREENSPOT,
    "geometry3k_shapes": GEOMETRY3K,
    "chartqa_shapes": CHARTQA,
}
IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def hub_feature(feature) -> dict:
    """A `datasets` feature as its JSON: `"string"` is a Value."""
    if isinstance(feature, str):
        return {"dtype": feature, "_type": "Value"}
    if "feature" in feature and "_type" not in feature:
        return {"feature": hub_feature(feature["feature"]), "_type": "Sequence"}
    if feature.get("_type") == "Sequence":
        return {"feature": hub_feature(feature["feature"]), "_type": "Sequence"}
    return feature


def card_feature(name: str, feature) -> str:
    """The feature's lines in a README card's `dataset_info`, as the hub writes them."""
    if isinstance(feature, str):
        return f"  - name: {name}\n    dtype: {feature}\n"
    if feature.get("_type") == "Image":
        return f"  - name: {name}\n    dtype: image\n"
    if feature.get("_type") == "ClassLabel":
        names = "".join(f"          '{i}': {label}\n" for i, label in enumerate(feature["names"]))
        return f"  - name: {name}\n    dtype:\n      class_label:\n        names:\n{names}"
    inner = feature["feature"]
    return f"  - name: {name}\n    sequence: {'image' if isinstance(inner, dict) else inner}\n"


def write_sample(name: str, spec: dict, out: Path, rows: int, seed: int) -> Path:
    """Draw `rows` rows and write the repository folder `out/name`; returns it."""
    rng = np.random.default_rng(seed)
    records = [spec["row"](index, rng) for index in range(rows)]
    features = spec["features"]
    types = []
    for column, (feature, arrow) in features.items():
        if arrow is None:  # an Image, or a Sequence of them
            arrow = IMAGE_STRUCT if feature.get("_type") == "Image" else pa.list_(IMAGE_STRUCT)
        types.append(pa.field(column, arrow))
    meta = {"info": {"features": {c: hub_feature(f) for c, (f, _) in features.items()}}}
    schema = pa.schema(types, metadata={"huggingface": json.dumps(meta)})
    table = pa.Table.from_pylist(records, schema=schema)
    folder = out / name
    (folder / "data").mkdir(parents=True, exist_ok=True)
    split = spec["split"]
    pq.write_table(table, folder / "data" / f"{split}-00000-of-00001.parquet", row_group_size=100)
    card = (
        "---\ndataset_info:\n  features:\n"
        + "".join(card_feature(c, f) for c, (f, _) in features.items())
        + f"  splits:\n  - name: {split}\n    num_examples: {rows}\n"
        + f"configs:\n- config_name: default\n  data_files:\n  - split: {split}\n    path: data/{split}-*\n---\n\n"
        + f"A synthetic sample in the schema of the public set named in scripts/make_public_samples.py, written by it "
        f"({rows} rows, seed {seed}).\n"
    )
    (folder / "README.md").write_text(card)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the folder the samples' folders go in")
    parser.add_argument("--only", choices=sorted(SAMPLES), action="append", help="write only this sample")
    parser.add_argument("--rows", type=int, default=ROWS, help="rows in each sample")
    args = parser.parse_args()
    for number, name in enumerate(SAMPLES):
        if args.only and name not in args.only:
            continue
        folder = write_sample(name, SAMPLES[name], args.out, args.rows, SEED + number)
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        print(f"wrote {args.rows} rows to {folder} ({size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
