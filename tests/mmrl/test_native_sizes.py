"""Images of different sizes through the policy (the dataset env's `resize: native`), and the bounds `mmrl train`
hands that env from the model."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from PIL import Image

import sim
from mmrl.build import native_pixel_bounds
from mmrl.families import missing_classes
from mmrl.policy import build_tiny
from mmrl.runtime.config import ConfigError, load_config
from mmrl.types import Sampling

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def two_sizes(tmp_path) -> Path:
    """A 300x200 and a 40x40 record."""
    for name, size in (("wide", (300, 200)), ("small", (40, 40))):
        Image.new("RGB", size, (120, 30, 200)).save(tmp_path / f"{name}.png")
    records = [
        {"image": "wide.png", "question": "Find the box.", "box": [30, 20, 150, 100]},
        {"image": "small.png", "question": "What colour?", "answer": "purple"},
    ]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path / "data.jsonl"


def samples_and_rescores(policy, obs) -> None:
    """The batch of `obs` samples, and the sampled log-probs equal the training forward's."""
    torch.manual_seed(0)
    rollout = policy.generate(obs, group_size=1, sampling=Sampling(max_new_tokens=3, temperature=1.0))
    with torch.no_grad():
        again = policy.logprobs(rollout)
    mask = rollout.completion_mask
    torch.testing.assert_close(again[mask], rollout.logprobs[mask], atol=1e-5, rtol=0)


def test_qwen_sees_each_image_at_its_own_size(two_sizes):
    """Qwen2-VL (14 px patches, 2x2 merge: a 28 px grid): the env's 308x196 and 56x56 reach the vision tower as
    they are (grids 14x22 and 4x4 patches), so their token counts differ per row, and the batch samples and
    re-scores (sampled log-probs equal the training forward's)."""
    policy = build_tiny("qwen2_vl", seed=0)
    env = sim.make("dataset", num_envs=2, path=two_sizes, split="all", shuffle=False, resize="native", factor=28)
    obs = env.reset(seed=[0, 1])
    assert obs.sizes.tolist() == [[196, 308], [56, 56]]
    inputs = policy.encode(obs)
    assert inputs.vision.per_image["image_grid_thw"].tolist() == [[1, 14, 22], [1, 4, 4]]
    assert inputs.vision.tokens.tolist() == [14 * 22 // 4, 4 * 4 // 4]
    samples_and_rescores(policy, obs)


def test_gemma3_resizes_each_image_itself(two_sizes):
    """Gemma 3's processor resizes every image to its fixed square (32 px in the tiny model, 896 in the released
    ones; aspect not kept, pan-and-scan off), so native sizes batch as they come and cost the same tokens."""
    policy = build_tiny("gemma3", seed=0)
    env = sim.make("dataset", num_envs=2, path=two_sizes, split="all", shuffle=False, resize="native")
    obs = env.reset(seed=[0, 1])
    inputs = policy.encode(obs)
    assert tuple(inputs.vision.pixel_values.shape) == (2, 3, 32, 32)
    assert inputs.vision.tokens.tolist() == [4, 4]  # image_seq_length of the tiny model, per image
    rollout = policy.generate(obs, group_size=1, sampling=Sampling(max_new_tokens=2, temperature=1.0))
    assert rollout.completion_ids.shape[0] == 2


@pytest.mark.skipif(bool(missing_classes("gemma4")), reason=missing_classes("gemma4"))
def test_gemma4_keeps_each_images_aspect_within_its_patch_budget(two_sizes):
    """Gemma 4's processor resizes each image, aspect kept, to the most patches its budget allows (the tiny model: 70
    soft tokens of 3 x 3 patches of 4 px, 630 patches; sides multiples of 12 px), so native sizes cost different
    tokens. By hand (the env's native sizes, on its default 28 px grid): 196 x 308 px scales by
    sqrt(630 * 16 / 60368) to 80 x 126, down to 72 x 120 px = 18 x 30 = 540 patches = 60 soft tokens; 56 x 56 px up
    to 100 x 100, down to 96 x 96 = 576 patches = 64. Both rows are padded to 630 patches and batch together, and the
    batch samples and re-scores."""
    policy = build_tiny("gemma4", seed=0)
    env = sim.make("dataset", num_envs=2, path=two_sizes, split="all", shuffle=False, resize="native")
    obs = env.reset(seed=[0, 1])
    assert obs.sizes.tolist() == [[196, 308], [56, 56]]
    inputs = policy.encode(obs)
    assert tuple(inputs.vision.pixel_values.shape) == (2, 630, 3 * 4 * 4)
    assert (inputs.vision.per_image["image_position_ids"] >= 0).all(-1).sum(-1).tolist() == [540, 576]
    assert inputs.vision.tokens.tolist() == [60, 64]
    samples_and_rescores(policy, obs)


def config(*overrides: str):
    return load_config(REPO / "configs" / "dataset_tiny.yaml", ["sft.episodes=0", *overrides])


def test_mmrl_train_hands_the_env_the_models_bounds():
    settings = json.loads((REPO / "assets/tiny_models/qwen2_vl/preprocessor_config.json").read_text())
    cfg = native_pixel_bounds(config("env.options.resize=native", "model.path=tiny:qwen2_vl"))
    assert cfg.env.options["min_pixels"] == settings["size"]["shortest_edge"]  # the processor's own
    assert cfg.env.options["max_pixels"] == settings["size"]["longest_edge"]
    assert cfg.env.options["factor"] == settings["patch_size"] * settings["merge_size"] == 28
    cfg = native_pixel_bounds(config("env.options.resize=native", "model.path=tiny:qwen3_5", "model.max_pixels=50000"))
    assert cfg.env.options["max_pixels"] == 50000 and cfg.env.options["factor"] == 32  # 16 px patches, 2x2
    cfg = native_pixel_bounds(config("env.options.resize=native", "env.options.factor=56"))
    assert cfg.env.options["factor"] == 56  # what the user set wins
    for unchanged in (config(), config("env.options.resize=native", "model.path=tiny:gemma3")):
        assert native_pixel_bounds(unchanged) is unchanged  # letterbox; a family that resizes itself
    with pytest.raises(ConfigError, match="sft.episodes"):
        cfg = config("env.options.resize=native")
        native_pixel_bounds(replace(cfg, sft=replace(cfg.sft, episodes=4)))


def test_a_short_native_run_on_the_dataset_preset(tmp_path):
    from mmrl.trainer import train

    cfg = config(
        "env.options.resize=native", "algo.group_size=2", "trainer.prompts_per_step=2", "trainer.total_steps=1",
        "trainer.eval_episodes=2", "trainer.eval_batch_size=2", "trainer.threads=1", "sampling.max_new_tokens=4",
        "trainer.eval_every=0", f"output_dir={tmp_path}",
    )  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        history = train(cfg)
    steps = [h for h in history if "loss/policy" in h]
    assert len(steps) == 1 and torch.isfinite(torch.tensor([steps[0]["loss/policy"], steps[0]["grad_norm"]])).all()
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["env"]["options"]["resize"] == "native"
