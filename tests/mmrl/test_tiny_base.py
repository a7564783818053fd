"""The shared multi-task base (assets/tiny_models/qwen3_vl_base) and its builder, scripts/make_tiny_base.py.

The builder runs a few steps into a temporary folder (twice: the same weights); the committed base is checked for its
architecture and size, and, on held-out seeds its builder never saw, for clicking GUI elements, which the grounding
warm start it starts from does not, and for tighter boxes than the warm start's. (Shape questions are not tested: the
base answers them at chance, 0.300 held out against about 0.28.)
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import sim
from mmrl.policy import Sampling
from mmrl.policy.vlm import VLMPolicy
from sim.seeds import eval_seeds

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "assets" / "tiny_models" / "qwen3_vl_base"
sys.path.insert(0, str(REPO / "scripts"))  # make_tiny_base imports its neighbour warmstart.py as a script does
make_tiny_base = importlib.import_module("make_tiny_base")


def test_the_builder_trains_each_family_in_turn_and_saves_a_loadable_float16_model(tmp_path):
    scores = make_tiny_base.make_tiny_base(
        tmp_path / "base", steps=3, batch_size=2, eval_every=0, final_eval_episodes=2, verbose=False
    )
    assert set(scores) == set(make_tiny_base.FAMILIES)
    assert all(0.0 <= s <= 1.0 for s in scores.values())
    config = json.loads((tmp_path / "base" / "config.json").read_text())
    assert config["dtype"] == "float16"
    assert config["text_config"]["num_hidden_layers"] == 4
    policy = VLMPolicy.from_pretrained(tmp_path / "base", prompt_template="{instruction} {image}")
    env = sim.make("shape_questions", num_envs=2, image_size=64)
    rollout = policy.generate(env.reset(seed=0), 1, Sampling(max_new_tokens=4, temperature=0.0))
    assert len(rollout.texts) == 2
    assert rollout.completion_ids.shape[1] <= 4


def test_the_builder_is_deterministic(tmp_path):
    for name in ("a", "b"):
        make_tiny_base.make_tiny_base(
            tmp_path / name, families=("shape_questions",), steps=2, batch_size=2, final_eval_episodes=1, verbose=False
        )
    a, b = (load_file(tmp_path / name / "model.safetensors") for name in ("a", "b"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    warm = load_file(make_tiny_base.WARM_START / "model.safetensors")
    assert any(not torch.equal(a[k], warm[k]) for k in a)  # two steps moved the weights


def test_the_builder_refuses_an_unknown_family(tmp_path):
    with pytest.raises(ValueError, match="families"):
        make_tiny_base.make_tiny_base(tmp_path, families=("grounding", "chess"), steps=1)


def test_the_committed_base_has_the_builders_architecture_and_is_small():
    size = sum(f.stat().st_size for f in BASE.iterdir())
    assert size < 3e6, f"{size} bytes"
    committed = json.loads((BASE / "config.json").read_text())
    built = make_tiny_base.build_warm_model("qwen3_vl", 4, 0, "{instruction}").model.config.to_dict()
    for part in ("text_config", "vision_config"):
        for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "depth"):
            assert committed[part].get(key) == built[part].get(key), (part, key)
    assert committed["dtype"] == "float16"


@pytest.fixture(scope="module")
def committed():
    """The committed base and the warm start it started from, loaded once."""
    return VLMPolicy.from_pretrained(BASE), VLMPolicy.from_pretrained(make_tiny_base.WARM_START)


def held_out(policy, name: str, episodes: int = 64) -> float:
    """Greedy mean score of family `name` on the first `episodes` held-out seeds (the builder's own validation)."""
    return make_tiny_base.validate(policy, make_tiny_base.FAMILIES[name], episodes, seed=eval_seeds(episodes))


def test_the_committed_base_clicks_gui_elements_the_warm_start_cannot_yet(committed):
    base, warm = (held_out(policy, "gui_click") for policy in committed)
    # Measured: 0.500 for the base, 0 for the warm start (it never learned the click format; the gui_click preset's
    # own cold start brings it to 0.282, 60 RL steps to 0.483, 3 seeds).
    assert warm == 0.0
    assert base > 0.35, base


def test_the_committed_base_boxes_tighter_than_the_warm_start(committed):
    base, warm = (held_out(policy, "grounding") for policy in committed)
    # Measured: mean IoU 0.295 for the base (exact boxes) against 0.160 for the warm start (a sloppy demonstrator's).
    assert base > warm + 0.08, (base, warm)
