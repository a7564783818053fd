"""scripts/make_sample_dataset.py: it rebuilds the committed sample datasets byte for byte, and larger ones too."""

from __future__ import annotations

import filecmp
import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
make_sample_dataset = importlib.import_module("make_sample_dataset")


def test_the_committed_sample_is_what_the_script_writes(tmp_path):
    committed = REPO / "assets" / "datasets" / "shapes_qa"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_sample_dataset.py"), "--out", str(tmp_path)], check=True
    )
    names = ["data.jsonl", *(f"images/{p.name}" for p in sorted((committed / "images").iterdir()))]
    match, mismatch, errors = filecmp.cmpfiles(committed, tmp_path, names, shallow=False)
    assert not mismatch and not errors and len(match) == 25


def test_records_past_a_dead_end_layout_are_made_and_the_first_480_are_the_committed_ones():
    """Record 482 of a 4800-record run once stopped the script ("no free spot for a circle"); the records before it
    must not change, so `shapes_qa_480` (configs/dataset_tiny.yaml) is still what the script makes."""
    committed = REPO / "assets" / "datasets" / "shapes_qa_480"
    lines = [json.loads(line) for line in (committed / "data.jsonl").read_text().splitlines()]
    rng = np.random.default_rng(make_sample_dataset.SEED)
    for index in range(490):
        image, record = make_sample_dataset.make_record(index, rng)
        if index < len(lines):
            want = dict(lines[index])
            pixels = np.asarray(Image.open(committed / want.pop("image")).convert("RGB"))
            assert record == want and np.array_equal(np.asarray(image), pixels), f"record {index} changed"
    assert len(lines) == 480
