"""configs/pi0_reach_tiny.yaml's parts: the perception warm start it loads through `model.path`
(assets/tiny_models/pi0_warm_start, scripts/make_tiny_pi0.py) and the cold start's every-step labels
(mmrl.policy.flow.demonstrations). The preset's learning figures are in RESULTS.md#pi0-on-reach."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import sim
from mmrl.policy import load_policy
from mmrl.policy.flow import FlowPolicy, build_tiny_flow
from mmrl.policy.flow.demonstrations import collect_flow_demonstrations
from mmrl.runtime.config import load_config
from sim.seeds import SFT_SEED_BASE

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from make_tiny_pi0 import REACH, image_summary, perception_set  # noqa: E402  (scripts/)

VISION = ("model.vlm.vision_tower.", "model.vlm.multi_modal_projector.")


@pytest.fixture(scope="module")
def warm() -> FlowPolicy:
    cfg = load_config(REPO / "configs" / "pi0_reach_tiny.yaml").model
    assert cfg.path == "assets/tiny_models/pi0_warm_start"
    return load_policy(cfg)


def test_the_warm_start_is_tiny_pi0_with_only_its_vision_trained(warm):
    # Loaded through the preset's model.path as a π0 folder; no statistics (no action has been seen: the cold
    # start computes them), and every weight outside the vision tower and projector is tiny:pi0's seed-0 draw.
    assert isinstance(warm, FlowPolicy) and warm.stats is None
    drawn = build_tiny_flow(seed=0).model.state_dict()
    loaded = warm.model.state_dict()
    assert loaded.keys() == drawn.keys()
    vision = [k for k in drawn if k.startswith(VISION)]
    rest = [k for k in drawn if not k.startswith(VISION)]
    assert len(vision) > 10 and len(rest) > 10
    assert all(torch.equal(loaded[k], drawn[k]) for k in rest), "weights outside the vision tower were trained"
    moved = [k for k in vision if not torch.equal(loaded[k], drawn[k])]
    assert len(moved) == len(vision), f"vision weights left at the random draw: {set(vision) - set(moved)}"


def test_the_warm_start_sees_where_the_discs_are(warm):
    # A least-squares probe on the mean image token, fitted on 192 reach frames of worlds the perception step never
    # saw and scored on 64 more: from the warm start's tower it places the discs relative to the gripper; from the
    # random tower (tiny:pi0's draw) it does little better than the mean offset.
    env = sim.make("reach", num_envs=64, **REACH)
    frames, labels = perception_set(env, 256, SFT_SEED_BASE + 90_000_000)
    env.close()
    offsets, present = labels[..., 1:].reshape(256, 8), labels[..., :1].expand(-1, -1, 2).reshape(256, 8)

    def probe_error(policy: FlowPolicy) -> float:
        with torch.no_grad():
            x = image_summary(policy.model.model.vlm, frames).double()
        x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)  # [256, hidden + 1]
        fit, test = slice(0, 192), slice(192, 256)
        a = x[fit].T @ x[fit] + 1e-3 * torch.eye(x.shape[1], dtype=x.dtype)
        w = torch.linalg.solve(a, x[fit].T @ offsets[fit].double())
        err = ((x[test] @ w - offsets[test].double()) ** 2 * present[test]).sum() / present[test].sum()
        return float(err)

    variance = float((offsets[192:] ** 2 * present[192:]).sum() / present[192:].sum())
    trained, random = probe_error(warm), probe_error(build_tiny_flow(seed=0))
    assert trained < 0.25 * variance, (trained, variance)
    assert random > 0.5 * variance, (random, variance)


def test_every_step_labels_slide_along_the_same_path():
    # 6 episodes of chunk 3: every step gets a row whose label is the expert's next 3 actions along the executed
    # path, so within an episode row t+1's label is row t's shifted by one; the chunk-start rows (steps 0, 3, 6)
    # are among them, the same observations and labels; the success rate is the same path's.
    env = sim.make("reach", num_envs=4, **REACH)
    every = collect_flow_demonstrations(env, 3, 6, noise=0.5, seed=2, every_step=True)
    starts = collect_flow_demonstrations(env, 3, 6, noise=0.5, seed=2)  # the default: where a chunk starts
    env.close()
    images, _, _, chunks, rate = every
    assert rate == starts[4]
    assert chunks.shape[1:] == (3, 2) and len(chunks) > len(starts[3]) >= 6
    sliding = (chunks[1:, :-1] == chunks[:-1, 1:]).all((1, 2))
    # Each episode's rows but its first continue the row before (6 episodes: 5 boundaries, where labels may or may
    # not happen to match).
    assert int(sliding.sum()) >= len(chunks) - 6
    keys = {(images[i].numpy().tobytes(), chunks[i].numpy().tobytes()) for i in range(len(chunks))}
    assert all((starts[0][i].numpy().tobytes(), starts[3][i].numpy().tobytes()) in keys for i in range(len(starts[3])))
