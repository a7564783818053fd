"""scripts/make_sample_dataset.py: it rebuilds the committed sample datasets byte for byte, and larger ones too."""

from __future__ import annotations

import filecmp
import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np

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


def test_a_record_whose_shapes_found_no_free_spot_is_laid_out_again():
    """Record 482 of a 4800-record run once stopped the script ("no free spot for a circle")."""
    rng = np.random.default_rng(make_sample_dataset.SEED)
    for index in range(490):
        image, record = make_sample_dataset.make_record(index, rng)
        assert record["question"]
    assert image.size == make_sample_dataset.SIZES[489 % len(make_sample_dataset.SIZES)]
