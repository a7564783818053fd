"""Write the multiple-choice sample `assets/datasets/shapes_mc/`: the 480 images of `shapes_qa_480` asked as A-D questions.

The consistency methods (TTRV, ACRE, GRPO-CARE; `configs/ttrv_tiny.yaml`, `acre_tiny.yaml`, `grpo_care_tiny.yaml`)
train on multiple-choice questions whose options the `dataset` env can read and shuffle. Each record of
`assets/datasets/shapes_qa_480` (made by `scripts/make_sample_dataset.py`) becomes one such question about the same
image, which it names by a relative path (no image is copied):

* box / point ("Find the red circle.") -> "Which shape is red? (A) circle (B) square (C) triangle";
* count ("How many shapes are in the image?", 2 or 3) -> the same question with options 1, 2, 3, 4;
* colour ("What colour is the triangle?") -> the same question with options red, green, blue, yellow.

The options are listed in a seeded random order per record, so the right letter is spread over A-D; `answer` is its
letter (the presets score it with `env.options.reward: multiple_choice`). Every run writes the same bytes:

    python scripts/make_choice_dataset.py            # into assets/datasets/shapes_mc
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "assets" / "datasets" / "shapes_qa_480"
DEFAULT_OUT = REPO / "assets" / "datasets" / "shapes_mc"
SEED = 20_251_125
SHAPES = ("circle", "square", "triangle")
COLOURS = ("red", "green", "blue", "yellow")
COUNTS = ("1", "2", "3", "4")
LETTERS = "ABCDE"


def as_choice(raw: dict, rng: np.random.Generator) -> dict:
    """One source record as a multiple-choice record (same image path, relative to the output folder)."""
    question = raw["question"]
    found = re.fullmatch(r"(?:Find|Point at) the (\w+) (\w+)\.", question)
    if found is not None:
        stem, options, right = f"Which shape is {found.group(1)}?", SHAPES, found.group(2)
    elif question.startswith("How many"):
        stem, options, right = question, COUNTS, raw["answer"]
    else:
        stem, options, right = question, COLOURS, raw["answer"]
    order = [options[int(i)] for i in rng.permutation(len(options))]
    listed = " ".join(f"({LETTERS[k]}) {option}" for k, option in enumerate(order))
    image = f"../{SOURCE.name}/{raw['image']}"
    return {"image": image, "question": f"{stem} {listed}", "answer": LETTERS[order.index(right)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (next to shapes_qa_480)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    source = [json.loads(line) for line in (SOURCE / "data.jsonl").read_text().splitlines() if line.strip()]
    lines = [json.dumps(as_choice(raw, rng)) for raw in source]
    (args.out / "data.jsonl").write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} records to {args.out}")


if __name__ == "__main__":
    main()
