"""Rewards in YAML (`sim.mix`): any text env's reward as a weighted mix of its own and registered rewards."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from mmrl.runtime.config import ConfigError, load_config
from rewards import REWARDS, combine
from sim import check_vec_env, make
from sim.mix import MixedRewards


def test_a_mix_on_grounding_is_the_weighted_sum_of_its_components_each_logged():
    mix = [{"name": "env"}, {"name": "think_answer_format", "weight": 0.5}, {"name": "box_giou", "weight": 0.25}]
    env = make("grounding", num_envs=4, image_size=64, rewards=mix)
    plain = make("grounding", num_envs=4, image_size=64)
    assert isinstance(env, MixedRewards)
    check_vec_env(env, seed=3)
    env.reset(seed=3)
    plain.reset(seed=3)
    targets = env.target_boxes  # forwarded to the grounding env
    answers = [f"<answer>[{', '.join(str(round(v)) for v in box)}]</answer>" for box in targets.tolist()]
    answers = [f"<think>there</think>{a}" if k % 2 else a for k, a in enumerate(answers)]
    answers[2] = "<think>no idea</think><answer>[0, 0, 8, 8]</answer>"  # a wrong box, well formatted
    result, base = env.step(answers), plain.step(answers)
    c = result.info["reward_components"]
    assert set(c) == set(base.info["reward_components"]) | {"think_answer_format", "box_giou"}
    assert c["think_answer_format"].tolist() == [0.0, 1.0, 1.0, 1.0]
    torch.testing.assert_close(c["box_giou"], REWARDS.get("box_giou")(answers, target_box=targets))
    torch.testing.assert_close(result.reward, base.reward + 0.5 * c["think_answer_format"] + 0.25 * c["box_giou"])
    assert result.info["success"].tolist() == base.info["success"].tolist()  # success stays the env's


def test_without_the_env_entry_the_mix_replaces_its_reward():
    env = make("grounding", num_envs=3, image_size=64, rewards=[{"name": "box_giou", "weight": 2.0}])
    env.reset(seed=0)
    x1, y1, x2, y2 = env.target_boxes[2].tolist()
    answers = ["<answer>[0, 0, 8, 8]</answer>", "nothing", f"<answer>[{x1}, {y1}, {x2}, {y2}]</answer>"]
    result = env.step(answers)
    giou = result.info["reward_components"]["box_giou"]
    torch.testing.assert_close(result.reward, 2.0 * giou)
    assert giou[1] == -1.0 and giou[2] == 1.0  # an unparsed answer scores GIoU's minimum, never NaN


def test_rewards_read_the_observation_the_answer_was_written_for():
    calls = []

    def bright(completions, image, instruction):
        calls.append((image.clone(), list(instruction)))
        return image.float().mean(dim=(1, 2, 3)) / 255.0

    REWARDS.register("test_brightness")(bright)
    try:
        env = make("grounding", num_envs=2, image_size=48, rewards=[{"name": "env"}, {"name": "test_brightness"}])
        obs = env.reset(seed=[4, 5])
        result = env.step(["a", "b"])
        seen, instructions = calls[0]
        assert torch.equal(seen, obs.image) and instructions == obs.instruction
        torch.testing.assert_close(
            result.info["reward_components"]["test_brightness"], obs.image.float().mean((1, 2, 3)) / 255
        )
    finally:
        REWARDS._items.pop("test_brightness")


def test_mistakes_are_named_when_the_env_is_built():
    with pytest.raises(ValueError, match=r"env.rewards: 'box_iou' needs \['target_box'\], which SvgEnv does not give"):
        make("svg", num_envs=1, rewards=[{"name": "env"}, {"name": "box_iou"}])
    with pytest.raises(ValueError, match=r"env.rewards: unknown reward\(s\) \['fromat'\]"):
        make("grounding", num_envs=1, rewards=[{"name": "fromat"}])
    with pytest.raises(ValueError, match=r"env.rewards: \['env'\] listed twice"):
        make("grounding", num_envs=1, rewards=[{"name": "env"}, {"name": "env", "weight": 2}])
    with pytest.raises(ValueError, match=r"env.rewards: unknown key\(s\) \['wieght'\]"):
        make("grounding", num_envs=1, rewards=[{"name": "format", "wieght": 1}])
    with pytest.raises(ValueError, match=r"env.rewards: reward 'format' has no option\(s\) \['tag'\]"):
        make("grounding", num_envs=1, rewards=[{"name": "format", "kwargs": {"tag": 1}}])
    with pytest.raises(ValueError, match="env.rewards: ReachEnv takes continuous actions"):
        make("reach", num_envs=1, rewards=[{"name": "env"}])


@pytest.fixture()
def records(tmp_path):
    Image.new("RGB", (32, 32), (240, 240, 240)).save(tmp_path / "a.png")
    rows = [
        {"image": "a.png", "question": "Find it.", "box": [4, 4, 20, 20]},
        {"image": "a.png", "question": "What colour?", "answer": "grey"},
        {"image": "a.png", "question": "Find both.", "boxes": [[1, 1, 9, 9], [12, 12, 30, 30]]},
    ]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return tmp_path


def test_dataset_records_hand_their_answers_and_boxes_to_the_mix(records):
    mix = [{"name": "env"}, {"name": "think_answer_format", "weight": 0.5},
           {"name": "format", "weight": 0.25, "kwargs": {"require_answer_tag": True}}]  # fmt: skip
    env = make("dataset", num_envs=3, path=records, image_size=32, split="all", shuffle=False, rewards=mix)
    plain = make("dataset", num_envs=3, path=records, image_size=32, split="all", shuffle=False)
    env.reset(seed=0)
    plain.reset(seed=0)
    answers = [f"<think>look</think>{a}" for a in plain.expert_action()]
    answers[1] = plain.expert_action()[1]  # no think block: no format bonus
    result, base = env.step(answers), plain.step(answers)
    c = result.info["reward_components"]
    assert c["think_answer_format"].tolist() == [1.0, 0.0, 1.0]
    assert c["format"][0] == 1.0 and c["format"][1] == 0.0  # a box in an answer tag: only the box record's answer
    torch.testing.assert_close(result.reward, base.reward + 0.5 * c["think_answer_format"] + 0.25 * c["format"])

    # Rewards over the records' own targets: a reward leaves out (NaN) the records without its target, and the
    # others are scaled up to the full weight (`rewards.combine`).
    mix = [{"name": "env"}, {"name": "box_giou", "weight": 1.0}, {"name": "detection_f1", "weight": 1.0}]
    env = make("dataset", num_envs=3, path=records, image_size=32, split="all", shuffle=False, rewards=mix)
    env.reset(seed=0)
    result = env.step(plain.expert_action())
    parts = {"env": torch.ones(3), "box_giou": torch.tensor([1.0, float("nan"), float("nan")]),
             "detection_f1": torch.tensor([float("nan"), float("nan"), 1.0])}  # fmt: skip
    torch.testing.assert_close(result.reward, combine(parts, {"env": 1.0, "box_giou": 1.0, "detection_f1": 1.0}))
    torch.testing.assert_close(result.reward, torch.full((3,), 3.0))


def test_a_reward_the_env_already_scores_or_a_world_nothing_applies_to_is_an_error(records):
    env = make("dataset", num_envs=3, path=records, image_size=32, split="all", shuffle=False,
               rewards=[{"name": "env"}, {"name": "box_iou"}])  # fmt: skip
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"env.rewards: \['box_iou'\] already score"):
        env.step(["a", "b", "c"])
    env = make("dataset", num_envs=3, path=records, image_size=32, split="all", shuffle=False,
               rewards=[{"name": "exact_match"}])  # fmt: skip
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"no listed reward applies to world\(s\) \[0, 2\]"):
        env.step(["a", "grey", "c"])


def test_the_mix_from_yaml_reaches_every_env_the_run_builds(records):
    cfg = load_config(None, ["env.name=dataset", f"env.options.path={records}", "env.options.split=all",
                             "env.rewards=[{name: env}, {name: think_answer_format, weight: 0.2}]"])  # fmt: skip
    env = make(cfg.env.name, num_envs=3, **cfg.env.make_options())
    env.reset(seed=[0, 1, 2])
    assert "think_answer_format" in env.step(["<think>a</think><answer>b</answer>"] * 3).info["reward_components"]
    with pytest.raises(ConfigError, match="env.rewards: unknown reward 'fromat'"):
        load_config(None, ["env.rewards=[{name: fromat}]"])
