"""`trainer.log_with`: the same metrics to TensorBoard event files and an offline W&B run, read back here."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from mmrl.runtime.config import ConfigError
from mmrl.runtime.metrics import read_metrics, require_backends
from mmrl.trainer import train

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")


def scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in the TensorBoard event files under `folder`: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.fixture
def offline_wandb(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_a_run_logs_the_same_metrics_to_tensorboard_and_offline_wandb(tmp_path, tiny_run_config, offline_wandb):
    out = tmp_path / "run"
    cfg = tiny_run_config(out, "trainer.total_steps=2", "trainer.log_with=[jsonl,tensorboard,wandb]")
    history = train(cfg)
    rows = [m for m in history if "reward/total" in m]
    series = scalars(out / "tensorboard")
    assert series["reward/total"] == [(r["step"], pytest.approx(r["reward/total"], rel=1e-6)) for r in rows]
    assert {"loss/policy", "grad_norm", "perf/step_s", "eval/iou"} <= set(series)
    assert [step for step, _ in series["eval/iou"]] == [0, 2]  # before and after training
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert any(tag.startswith("plots/") for tag in events.Tags()["images"])  # the end-of-run plots
    # An offline W&B run: its folder and data file, under the run's output folder, with the run id kept for resume.
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))
    assert (out / "wandb_id").read_text().strip() in runs[0].name


def test_resumed_run_has_no_duplicate_tensorboard_points(tmp_path, tiny_run_config):
    out = tmp_path / "run"
    cfg = tiny_run_config(out, "trainer.total_steps=3", "trainer.log_with=[jsonl,tensorboard]")
    train(cfg, stop_after=2)
    # As if killed after step 2 had logged but before its checkpoint: remove step 2's checkpoint.
    checkpoints = sorted((out / "checkpoints").iterdir())
    for stale in checkpoints[1:]:
        shutil.rmtree(stale)
    train(dataclasses.replace(cfg, resume=True))
    series = scalars(out / "tensorboard")
    steps = [step for step, _ in series["reward/total"]]
    assert steps == [1, 2, 3]  # step 2 logged twice (before the kill and after resume), kept once
    jsonl = [m["reward/total"] for m in read_metrics(out / "metrics.jsonl") if "reward/total" in m]
    assert [value for _, value in series["reward/total"]] == pytest.approx(jsonl, rel=1e-6)


def test_log_with_mistakes_name_the_field(tiny_run_config, tmp_path):
    with pytest.raises(ConfigError, match=r"trainer\.log_with.*unknown \['mlflow'\]"):
        tiny_run_config(tmp_path, "trainer.log_with=[jsonl,mlflow]")
    with pytest.raises(ConfigError, match=r"trainer\.log_with.*must include jsonl"):
        tiny_run_config(tmp_path, "trainer.log_with=[tensorboard]")


def test_a_missing_logging_package_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'mmrl\[wandb\]'"):
        require_backends(["jsonl", "wandb"])
    require_backends(["jsonl", "tensorboard"])  # present: no error
