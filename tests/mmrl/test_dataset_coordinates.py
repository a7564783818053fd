"""The dataset env asks for and reads boxes and points in the model's coordinate convention, chosen from `model.path`
through the config as a user sets it (`mmrl.runtime.conventions`), while its targets stay in pixels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

import sim.tasks.dataset  # noqa: F401  (registers `dataset`)
from mmrl.cli import main
from mmrl.runtime.checkpoint import latest_checkpoint
from mmrl.runtime.config import load_config
from sim import make
from sim.errors import InputError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def wide(tmp_path) -> Path:
    """A 40x20 image (letterboxed into 64 px: 64x32 with 16 px bands above and below) with a box, a point and a box
    list record. By hand, in pixels of the 64 px square: box [4, 2, 24, 12] -> [6.4, 19.2, 38.4, 35.2]; point
    [10, 5] -> (16, 24), scored within 0.05 * 64 = 3.2 px; boxes [[0, 0, 10, 10], [20, 10, 40, 20]] ->
    [[0, 16, 16, 32], [32, 32, 64, 48]]."""
    Image.new("RGB", (40, 20), (200, 40, 40)).save(tmp_path / "wide.png")
    records = [
        {"image": "wide.png", "question": "Find the box.", "box": [4, 2, 24, 12]},
        {"image": "wide.png", "question": "Point at it.", "point": [10, 5]},
        {"image": "wide.png", "question": "Find both.", "boxes": [[0, 0, 10, 10], [20, 10, 40, 20]]},
    ]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path / "data.jsonl"


BOX = [6.4, 19.2, 38.4, 35.2]  # pixels of the 64 px square
POINT = [16.0, 24.0]
BOXES = [[0.0, 16.0, 16.0, 32.0], [32.0, 32.0, 64.0, 48.0]]


def _env(path: Path, *overrides: str):
    cfg = load_config(None, ["env.name=dataset", f"env.options.path={path}", "env.options.image_size=64", *overrides])
    env = make(cfg.env.name, num_envs=3, **cfg.env.make_options(), split="all", shuffle=False)
    return cfg, env


def _answers(scale: float) -> list[str]:
    """Right answers to the three records, written with every coordinate times `scale`."""
    box = ", ".join(f"{v * scale:.4f}" for v in BOX)
    listed = ", ".join("[" + ", ".join(f"{v * scale:.4f}" for v in row) + "]" for row in BOXES)
    return [f"<answer>[{box}]</answer>", f"<answer>({POINT[0] * scale:.4f}, {POINT[1] * scale:.4f})</answer>",
            f"<answer>[{listed}]</answer>"]  # fmt: skip


# (the model, the convention the config chooses, input_size it sets, the side of the answers' frame, the hint's units)
CASES = [
    ("tiny:qwen3_vl", "0-1000", None, 1000.0, "in coordinates relative to the image, 0 to 1000."),
    # Qwen2.5-VL's tiny processor (14 px patches, merge 2) resizes the 64 px square to 56 px: pixels of that image.
    ("tiny:qwen2_5_vl", "pixels", 56, 56.0, "in pixels of the 56x56 image."),
    ("tiny:idefics3", "0-1", None, 1.0, "in coordinates relative to the image, 0 to 1."),
    # The presets' model: the warm start's folder says it learned pixels; Qwen3-VL's 16 px patches keep 64 px.
    ("assets/tiny_models/qwen3_vl_warm_start", "pixels", None, 64.0, "in pixels of the 64x64 image."),
]


@pytest.mark.parametrize(("model", "convention", "input_size", "side", "units"), CASES,
                         ids=["qwen3_vl", "qwen2_5_vl", "idefics3", "warm_start"])  # fmt: skip
def test_boxes_and_points_are_asked_for_and_scored_in_the_models_convention(
    wide, model, convention, input_size, side, units
):
    cfg, env = _env(wide, f"model.path={model}")
    assert cfg.env.options["coordinates"] == convention
    assert cfg.env.options.get("input_size") == input_size
    obs = env.reset(seed=[0, 1, 2])
    assert all(text.endswith(units) for text in obs.instruction), obs.instruction
    right = env.step(_answers(side / 64))
    torch.testing.assert_close(right.reward, torch.ones(3), atol=1e-3, rtol=0)
    assert right.info["success"].all()
    torch.testing.assert_close(right.info["target_box"][0], torch.tensor(BOX))  # targets stay in pixels
    env.reset(seed=[0, 1, 2])  # the expert writes the same units
    assert env.step(env.expert_action()).info["success"].all()
    if side != 64.0:  # the shown image's pixel numbers, read in the model's units, miss (56 px: overshoot)
        env.reset(seed=[0, 1, 2])
        wrong = env.step(_answers(1.0))
        assert (wrong.reward < 0.95).all()
        if convention != "pixels":
            assert not wrong.info["success"].any()


def test_the_expert_writes_0_1000_by_hand(wide):
    _, env = _env(wide, "model.path=tiny:qwen3_vl")
    env.reset(seed=[0, 1, 2])
    assert env.expert_action() == [
        "<answer>[100, 300, 600, 550]</answer>",
        "<answer>(250, 375)</answer>",
        "<answer>[[0, 250, 250, 500], [500, 500, 1000, 750]]</answer>",
    ]


def test_an_override_wins_and_native_sizes_need_no_input_size(wide):
    cfg, env = _env(wide, "model.path=tiny:qwen3_vl", "env.options.coordinates=pixels")
    assert cfg.env.options["coordinates"] == "pixels" and "input_size" not in cfg.env.options
    assert env.reset(seed=[0, 1, 2]).instruction[0].endswith("in pixels of the 64x64 image.")
    # Native sizes: the 40x20 image stays 40x20 on a 20 px grid, and the model (its processor on that grid) sees it so.
    cfg = load_config(None, ["env.name=dataset", f"env.options.path={wide}", "env.options.resize=native",
                             "model.path=tiny:qwen2_5_vl", "sft.episodes=0"])  # fmt: skip
    assert cfg.env.options["coordinates"] == "pixels" and "input_size" not in cfg.env.options
    env = make("dataset", num_envs=1, **cfg.env.make_options(), split="all", shuffle=False, factor=20, min_pixels=400)
    assert env.reset(seed=[0]).instruction[0].endswith("in pixels of the 40x20 image.")
    with pytest.raises(InputError, match="input_size=56 is for letterboxed images"):
        make("dataset", num_envs=1, path=wide, resize="native", input_size=56)
    with pytest.raises(InputError, match="coordinates must be one of pixels, 0-1000, 0-1"):
        make("dataset", num_envs=1, path=wide, coordinates="0-100")


def test_native_sizes_in_0_1000_scale_each_axis_by_its_own_side(wide):
    """The 40x20 image kept at 40x20 (a 20 px grid): 0-1000 runs over 40 px across and 20 px down, so the box
    [4, 2, 24, 12] is [100, 100, 600, 600], and an answer there scores full marks."""
    cfg = load_config(None, ["env.name=dataset", f"env.options.path={wide}", "env.options.resize=native",
                             "model.path=tiny:qwen3_vl", "sft.episodes=0"])  # fmt: skip
    env = make("dataset", num_envs=1, **cfg.env.make_options(), split="all", shuffle=False, factor=20, min_pixels=400)
    env.reset(seed=[0])
    assert env.expert_action() == ["<answer>[100, 100, 600, 600]</answer>"]
    torch.testing.assert_close(env.step(["<answer>[100, 100, 600, 600]</answer>"]).reward, torch.ones(1))


def test_a_qwen3_vl_run_on_the_dataset_env_trains_and_records_0_1000(wide, tmp_path):
    """`mmrl train` as a user runs it: the run's config.json and its checkpoint say the units it was asked in, so
    `mmrl eval` of that checkpoint reads answers the same way."""
    out = tmp_path / "run"
    overrides = [
        "model.path=tiny:qwen3_vl", f"env.options.path={wide}", "env.options.eval_fraction=0.34", "sft.episodes=0",
        "algo.group_size=2", "trainer.prompts_per_step=1", "trainer.total_steps=1", "trainer.eval_episodes=1",
        "trainer.eval_every=0", "trainer.threads=1", "sampling.max_new_tokens=4", f"output_dir={out}",
    ]  # fmt: skip
    assert main(["train", str(REPO / "configs" / "dataset_tiny.yaml"), *overrides]) == 0
    assert json.loads((out / "config.json").read_text())["env"]["options"]["coordinates"] == "0-1000"
    checkpoint = latest_checkpoint(out)
    assert checkpoint is not None
    assert json.loads((checkpoint / "config.json").read_text())["grounding_coordinates"] == "0-1000"
    assert load_config(None, [f"checkpoint={checkpoint}", "env.name=dataset"]).env.options["coordinates"] == "0-1000"
