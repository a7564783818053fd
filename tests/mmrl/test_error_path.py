"""One error path: each command of `mmrl` given a wrong input, as a careless user would, answers one line on stderr
naming the field, file or folder, exits 2, and leaves no run folder behind.

Each case fails at load, before anything trains: a random tiny model (`tiny:<family>`) or a tiny folder saved here.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from mmrl.cli import main

REPO = Path(__file__).resolve().parents[2]
GROUNDING = str(REPO / "configs" / "grounding_tiny.yaml")
PI0 = str(REPO / "configs" / "pi0_reach_tiny.yaml")
VLA = str(REPO / "configs" / "vla_reach_tiny.yaml")
TINY = ["sampling.max_new_tokens=4", "trainer.total_steps=1", "trainer.eval_episodes=2"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """A saved tiny Qwen2-VL folder and damaged copies of it, a file where a folder belongs, a VLM checkpoint."""
    from mmrl.policy import build_tiny

    root = tmp_path_factory.mktemp("folders")
    good = root / "good"
    build_tiny("qwen2_vl", seed=0).save_pretrained(good)
    made = {"good": good, "file": root / "a_file"}
    made["file"].write_text("not a folder")
    made["no_weights"] = shutil.copytree(good, root / "no_weights")
    for weights in made["no_weights"].glob("*.safetensors"):
        weights.unlink()
    made["cut_weights"] = shutil.copytree(good, root / "cut_weights")
    for weights in made["cut_weights"].glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    made["no_tokenizer"] = shutil.copytree(good, root / "no_tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (made["no_tokenizer"] / name).unlink()
    made["unknown_type"] = shutil.copytree(good, root / "unknown_type")
    config = json.loads((good / "config.json").read_text())
    (made["unknown_type"] / "config.json").write_text(json.dumps({**config, "model_type": "foo_vl"}))
    return made


# (command line, what the line must name); {name} is a folder of `folders`, {run} the run's output_dir.
CASES = {
    "pi0_refused_option": (["train", PI0, "model.history_turns=2"], ["model.history_turns"]),
    "pi0_on_a_text_env": (["train", GROUNDING, *TINY, "model.path=tiny:pi0"], ["model.path", "continuous"]),
    "vlm_on_a_continuous_env": (["train", VLA, "model.action_bins=0"], ["model.action_bins"]),
    "shards_not_dividing": (
        ["train", GROUNDING, *TINY, "model.path=tiny:qwen2_vl", "trainer.generation_shards=3"],
        ["trainer.generation_shards"],
    ),
    "output_dir_a_file": (
        ["train", GROUNDING, *TINY, "model.path=tiny:qwen2_vl", "output_dir={file}"],
        ["output_dir", "{file}"],
    ),
    "output_dir_under_a_file": (
        ["train", GROUNDING, *TINY, "model.path=tiny:qwen2_vl", "output_dir={file}/run"],
        ["output_dir", "{file}"],
    ),
    "checkpoint_a_file": (
        ["train", GROUNDING, *TINY, "model.path=tiny:qwen2_vl", "checkpoint={file}"],
        ["checkpoint", "{file}"],
    ),
    "no_weights": (["train", GROUNDING, *TINY, "model.path={no_weights}"], ["model.path", "{no_weights}", "weights"]),
    "cut_weights": (["train", GROUNDING, *TINY, "model.path={cut_weights}"], ["model.path", "{cut_weights}"]),
    "no_tokenizer": (["train", GROUNDING, *TINY, "model.path={no_tokenizer}"], ["model.path", "tokenizer"]),
    "unknown_model_type_grounding": (
        ["train", GROUNDING, *TINY, "model.path={unknown_type}"],
        ["model.path", "foo_vl"],
    ),
    "unknown_model_type_dataset": (
        ["train", GROUNDING, *TINY, "model.path={unknown_type}", "env.name=dataset", "env.eval_metric=reward"],
        ["model.path", "foo_vl"],
    ),
    "eval_metric_not_reported": (
        ["train", GROUNDING, *TINY, "model.path=tiny:qwen2_vl", "env.name=dataset"],
        ["env.eval_metric", "'iou'", "box_iou"],
    ),
    "env_name_unknown": (
        ["train", GROUNDING, *TINY, "model.path=tiny:qwen2_vl", "env.name=groundin"],
        ["env.name", "groundin", "grounding"],
    ),
    "device_unknown": (
        ["train", GROUNDING, *TINY, "model.path=tiny:qwen2_vl", "model.device=cude"],
        ["model.device", "'cude'"],
    ),
    "eval_of_another_kind": (["eval", PI0, "checkpoint={good}"], ["checkpoint", "{good}", "VLM"]),
    "eval_metric_not_reported_in_eval": (
        ["eval", GROUNDING, *TINY, "model.path=tiny:qwen2_vl", "checkpoint={good}", "env.name=dataset"],
        ["env.eval_metric", "box_iou"],
    ),
    "export_into_a_file": (["export", "{good}", "{file}"], ["{file}"]),
    "score_a_missing_file": (["score", "{file}.jsonl"], ["{file}.jsonl"]),
}


def one_line(stderr: str) -> str:
    """The error line of `stderr`, asserted to be its one line besides progress bars (transformers' weight loading,
    the evaluation's), which a terminal redraws in place (carriage returns) and clears."""
    lines = [line.strip() for line in stderr.replace("\r", "\n").splitlines()]
    lines = [line for line in lines if line and not line.endswith("/s]")]
    assert len(lines) == 1 and lines[0].startswith("mmrl") and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize("case", list(CASES))
def test_a_wrong_input_is_one_line_exit_2_naming_it_and_leaves_no_run(case, folders, tmp_path, capsys):
    args, named = CASES[case]
    run = tmp_path / "run"
    names = {**{k: str(v) for k, v in folders.items()}, "run": str(run)}
    args = [a.format(**names) for a in args]
    if args[0] in ("train", "eval") and not any(a.startswith("output_dir=") for a in args):
        args.append(f"output_dir={run}")
    assert main(args) == 2
    err = one_line(capsys.readouterr().err)
    for word in named:
        assert word.format(**names) in err, f"{word.format(**names)!r} not in: {err}"
    assert not run.exists(), sorted(p.name for p in run.iterdir())  # a refused run leaves nothing behind


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_an_output_dir_that_cannot_be_written_is_named(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    args = ["train", GROUNDING, *TINY, "model.path=tiny:qwen2_vl", f"output_dir={locked / 'run'}"]
    assert main(args) == 2
    err = one_line(capsys.readouterr().err)
    assert "output_dir" in err and str(locked) in err, err


def test_cuda_on_a_machine_without_one_is_named(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    args = ["train", GROUNDING, *TINY, "model.path=tiny:qwen2_vl", "model.device=cuda", f"output_dir={tmp_path / 'r'}"]
    assert main(args) == 2
    err = one_line(capsys.readouterr().err)
    assert "model.device" in err and "no CUDA GPU" in err, err
    assert not (tmp_path / "r").exists()
