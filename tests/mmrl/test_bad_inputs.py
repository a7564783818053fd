"""Bad input through the command line, as a user would give it: one line naming the file, line and field (or the key),
exit code 2, no traceback, and nothing of an earlier run lost.

Each case fails before anything trains: config errors at load, dataset errors when the env reads its records (before
the model loads), checkpoint and model-folder errors before the run folder is written to.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl.cli import main

REPO = Path(__file__).resolve().parents[2]
PRESET = str(REPO / "configs" / "grounding_tiny.yaml")
TINY = ["model.path=tiny:qwen2_vl", "sampling.max_new_tokens=4", "trainer.total_steps=1", "trainer.eval_episodes=2"]


def one_line_error(capsys) -> str:
    """The command's stderr, asserted to be one line and no traceback."""
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("mmrl"), err
    return err


# ------------------------------------------------------------------------------------------------------- dataset


def write_dataset(folder: Path, line: dict) -> Path:
    """A JSON-lines dataset of a good record, then `line` (line 2), then another good record."""
    Image.new("RGB", (8, 8), (200, 0, 0)).save(folder / "a.png")
    noise = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(noise).save(folder / "cut.png")
    data = (folder / "cut.png").read_bytes()
    (folder / "cut.png").write_bytes(data[: len(data) // 2])
    Image.new("L", (1, 1)).save(folder / "huge.png")  # then its header made to declare 20000x20000
    data = bytearray((folder / "huge.png").read_bytes())
    data[16:24] = struct.pack(">II", 20000, 20000)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    (folder / "huge.png").write_bytes(bytes(data))
    good = {"image": "a.png", "question": "Which colour?", "answer": "red"}
    path = folder / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (good, line, good)).replace("Infinity", "NaN") + "\n")
    return path


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ({"image": "gone.png", "question": "Q?", "answer": "a"}, r"field 'image': file .*gone.png not found"),
        ({"image": "cut.png", "question": "Q?", "answer": "a"}, r"field 'image': .*cut.png is truncated or broken"),
        ({"image": "huge.png", "question": "Q?", "answer": "a"}, r"field 'image': .*huge.png is 400000000 pixels"),
        ({"image": "a.png", "question": "Q?", "box": [float("inf"), 1, 5, 5]}, r"field 'box' must be .* finite"),
        ({"image": "a.png", "answer": "a"}, r"field 'question' \(or 'instruction'\)"),
        ({"image": "a.png", "question": "Q?", "box": [1, 1, 30, 5]}, r"field 'box' .* outside the 8x8 image"),
    ],
    ids=["missing_image", "truncated_png", "huge_image", "nan_coordinates", "missing_field", "box_outside"],
)
def test_train_on_a_bad_dataset_is_one_line_naming_file_line_and_field(tmp_path, capsys, line, named):
    import re

    data = write_dataset(tmp_path, line)
    args = ["train", PRESET, *TINY, "env.name=dataset", f"env.options={{path: {data}, image_size: 64}}",
            "env.eval_metric=reward", f"output_dir={tmp_path / 'run'}"]  # fmt: skip
    assert main(args) == 2
    err = one_line_error(capsys)
    assert re.search(rf"data.jsonl line 2: {named}", err), err


# ------------------------------------------------------------------------------------------------ config, model


def test_a_config_that_is_a_folder_or_not_utf8_is_named(tmp_path, capsys):
    assert main(["train", str(tmp_path)]) == 2
    assert str(tmp_path) in one_line_error(capsys)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("output_dir: caf\xe9\n".encode("latin-1"))
    assert main(["train", str(latin1)]) == 2
    err = one_line_error(capsys)
    assert "latin1.yaml" in err and "utf-8" in err


def test_an_env_option_of_the_wrong_type_names_the_key_and_the_type(tmp_path, capsys):
    assert main(["train", PRESET, *TINY, "env.options.image_size=big", f"output_dir={tmp_path}"]) == 2
    err = one_line_error(capsys)
    assert "env.options.image_size" in err and "expected an integer, got 'big'" in err
    assert not (tmp_path / "config.json").exists()  # refused before the run folder is written to


def test_a_model_folder_without_config_json_is_named(tmp_path, capsys):
    folder = tmp_path / "my_model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    assert main(["train", PRESET, f"model.path={folder}", f"output_dir={tmp_path / 'run'}"]) == 2
    err = one_line_error(capsys)
    assert "model.path" in err and str(folder) in err and "config.json" in err


def test_a_model_path_that_is_no_folder_is_named_when_the_hub_is_offline(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = tmp_path / "nowhere" / "model"
    assert main(["train", PRESET, f"model.path={missing}", f"output_dir={tmp_path / 'run'}"]) == 2
    err = one_line_error(capsys)
    assert "model.path" in err and str(missing) in err


def test_eval_of_a_checkpoint_folder_without_config_json_is_named(tmp_path, capsys):
    folder = tmp_path / "checkpoints" / "step_00000003"
    folder.mkdir(parents=True)
    assert main(["eval", PRESET, *TINY, f"checkpoint={folder}", f"output_dir={tmp_path}"]) == 2
    err = one_line_error(capsys)
    assert "checkpoint" in err and "config.json" in err


def test_eval_of_a_damaged_checkpoint_names_what_is_wrong(tmp_path, capsys):
    folder = tmp_path / "checkpoints" / "step_00000003"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x" * 50)  # the manifest says 100: cut short
    (folder / "manifest.json").write_text(json.dumps({"format": 1, "files": {"model.safetensors": {"size": 100}}}))
    assert main(["eval", PRESET, *TINY, f"checkpoint={folder}", f"output_dir={tmp_path}"]) == 2
    err = one_line_error(capsys)
    assert "damaged: model.safetensors is 50 bytes, 100 when saved" in err, err


# ------------------------------------------------------------------------------------------------------- resume


def test_resume_with_no_complete_checkpoint_refuses_and_keeps_the_earlier_history(tmp_path, capsys):
    """A run folder with history but only a damaged checkpoint: resume=true refuses instead of starting over."""
    history = '{"step": 0, "eval/iou": 0.1}\n{"step": 1, "reward/total": 0.5}\n'
    (tmp_path / "metrics.jsonl").write_text(history)
    (tmp_path / "config.json").write_text('{"earlier": true}')
    (tmp_path / "checkpoints" / "step_00000001").mkdir(parents=True)  # empty: nothing in it verifies
    assert main(["train", PRESET, *TINY, f"output_dir={tmp_path}", "resume=true"]) == 2
    err = one_line_error(capsys)
    assert "resume" in err and "no complete checkpoint" in err and "step_00000001" in err, err
    assert (tmp_path / "metrics.jsonl").read_text() == history
    assert (tmp_path / "config.json").read_text() == '{"earlier": true}'


def test_export_of_a_run_without_a_complete_checkpoint_is_named(tmp_path, capsys):
    (tmp_path / "run" / "checkpoints" / "step_00000002").mkdir(parents=True)
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out")]) == 2
    err = one_line_error(capsys)
    assert "step_00000002: the folder is empty" in err
    folder = tmp_path / "run" / "checkpoints" / "step_00000002"
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x" * 50)
    (folder / "manifest.json").write_text(json.dumps({"format": 1, "files": {"model.safetensors": {"size": 100}}}))
    assert main(["export", str(folder), str(tmp_path / "out")]) == 2  # the checkpoint folder itself
    assert "damaged: model.safetensors is 50 bytes, 100 when saved" in one_line_error(capsys)


def test_an_env_refusing_an_option_value_is_one_line_naming_the_env(tmp_path, capsys, monkeypatch):
    """A value of the right type that the env's own checks refuse (a ValueError in its constructor)."""
    assert main(["train", PRESET, *TINY, "env.options.image_size=4", f"output_dir={tmp_path}"]) == 2
    err = one_line_error(capsys)
    assert err.startswith("mmrl: env 'grounding': ") and "image_size" in err, err
    monkeypatch.setenv("MMRL_TRACEBACK", "1")  # asked for: the traceback of the same mistake
    with pytest.raises(ValueError, match="image_size"):
        main(["train", PRESET, *TINY, "env.options.image_size=4", f"output_dir={tmp_path}"])


def test_an_unknown_tiny_architecture_is_named(tmp_path, capsys):
    assert main(["train", PRESET, "model.path=tiny:qwen9_vl", f"output_dir={tmp_path}"]) == 2
    err = one_line_error(capsys)
    assert "model.path" in err and "qwen9_vl" in err and "qwen2_vl" in err


@pytest.mark.parametrize("preset", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_preset_passes_the_model_folder_check(preset, monkeypatch):
    """The check refuses no shipped preset's model (a hub id is refused only while the hub is off and the model is
    not in its local cache, as transformers would then fail too)."""
    from mmrl.policy.vlm.tiny import ALL_TINY_ARCHS
    from mmrl.runtime.config import ConfigError, load_config
    from mmrl.runtime.folders import check_model_folders

    cfg = load_config(preset)
    if cfg.model.path.startswith("./checkpoints/"):  # the user's own folder (pi0_libero: a π0 LIBERO checkpoint)
        with pytest.raises(ConfigError, match=r"model\.path: no folder at checkpoints/"):
            check_model_folders(cfg, "train", (*ALL_TINY_ARCHS, "pi0"))
        return
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    check_model_folders(cfg, "train", (*ALL_TINY_ARCHS, "pi0"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if cfg.model.path.count("/") == 1 and not (REPO / cfg.model.path).exists():
        with pytest.raises(ConfigError, match="hub's local cache"):
            check_model_folders(cfg, "train", (*ALL_TINY_ARCHS, "pi0"))
    else:
        check_model_folders(cfg, "train", (*ALL_TINY_ARCHS, "pi0"))
