"""scripts/make_public_samples.py and the presets that read its samples: the committed samples are what the script
writes, laid out as the public sets are on the hub, and each preset's options read them with the benchmark's metric."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import sim.tasks.dataset  # noqa: F401  (registers `dataset`)
from mmrl.runtime.config import load_config
from sim import make

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "assets" / "datasets"
# sample -> (preset, the shard the public set's card declares, its columns as the public set names them)
PUBLIC = {
    "refcoco_shapes": ("refcoco_tiny", "data/val-00000-of-00001.parquet",
                       ["question_id", "image", "question", "answer", "segmentation", "bbox", "iscrowd", "file_name"]),
    "screenspot_shapes": ("screenspot_tiny", "data/test-00000-of-00001.parquet",
                          ["file_name", "bbox", "instruction", "data_type", "data_source", "image"]),
    "geometry3k_shapes": ("geometry3k_tiny", "data/train-00000-of-00001.parquet", ["images", "problem", "answer"]),
    "chartqa_shapes": ("chartqa_tiny", "data/train-00000-of-00001.parquet",
                       ["image", "query", "label", "human_or_machine"]),
}  # fmt: skip


def test_the_committed_samples_are_what_the_script_writes(tmp_path):
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_public_samples.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)  # fmt: skip
    for name, (_, shard, columns) in PUBLIC.items():
        match, mismatch, errors = filecmp.cmpfiles(
            SAMPLES / name, tmp_path / name, ["README.md", shard], shallow=False
        )
        assert len(match) == 2, (name, mismatch, errors)
        schema = pq.read_schema(SAMPLES / name / shard)
        assert schema.names == columns and b"huggingface" in schema.metadata
        assert pq.read_metadata(SAMPLES / name / shard).num_rows == 320


def env_of(preset: str, **options):
    cfg = load_config(REPO / "configs" / f"{preset}.yaml")
    return make("dataset", **{"num_envs": 8, **cfg.env.options, **options}), cfg


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_each_preset_reads_its_sample_and_scores_the_benchmarks_metric(name):
    env, cfg = env_of(PUBLIC[name][0])
    assert cfg.env.eval_metric == "success" and len(env.records) == 320 and len(env.eval_ids) == 32
    env.reset(seed=1_000_000_000)  # the test split
    right = env.step(env.expert_action())
    assert right.info["success"].all()
    env.reset(seed=1_000_000_000)
    wrong = env.step(["<answer>(0, 0)</answer>" if name == "screenspot_shapes" else "<answer>-1</answer>"] * 8)
    assert not wrong.info["success"].any()


def test_refcoco_asks_the_first_of_its_referring_expressions():
    env, _ = env_of("refcoco_tiny", split="all", shuffle=False)
    row = pq.read_table(SAMPLES / "refcoco_shapes" / PUBLIC["refcoco_shapes"][1]).slice(0, 1).to_pylist()[0]
    x, y, w, h = row["bbox"]
    assert env.records[0].question == row["answer"][0] and env.records[0].answer is None
    assert env.records[0].box == (x, y, x + w, y + h)  # [x, y, w, h] read as RefCOCO writes it


def test_chartqa_scores_relaxed_accuracy_within_five_percent():
    env, _ = env_of("chartqa_tiny", split="all", shuffle=False, num_envs=1)
    env.reset(seed=0)
    label = float(env.records[env.record_index(0)].answer)
    near, far = f"{label * 1.04:.2f}", f"{label * 1.07:.2f}"
    assert env.step([f"<answer>{near}</answer>"]).info["success"].tolist() == [True]
    env.reset(seed=0)
    assert env.step([f"<answer>{far}</answer>"]).info["success"].tolist() == [False]
