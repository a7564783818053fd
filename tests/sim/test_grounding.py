"""The synthetic grounding task: unique targets, boxes that match the drawn pixels, and the reward."""

import pytest
import torch

import sim
from sim.tasks.grounding import COLOURS, KINDS, GroundingEnv


def _answer(box: list[float]) -> str:
    return f"<answer>[{', '.join(str(int(v)) for v in box)}]</answer>"


@pytest.fixture(scope="module")
def env():
    env = GroundingEnv(num_envs=32)
    env.reset(seed=0)
    return env


def test_instruction_names_exactly_one_shape(env):
    obs = env.reset(seed=0)
    for i, scene in enumerate(env.scenes):
        target = scene.target_shape
        assert obs.instruction[i] == f"Find the {target.colour} {target.kind}."
        assert target.kind in KINDS and target.colour in COLOURS
        matches = [s for s in scene.shapes if (s.kind, s.colour) == (target.kind, target.colour)]
        assert matches == [target], f"world {i}: the instruction names {len(matches)} shapes"
        assert 1 <= len(scene.shapes) <= env.max_shapes


def test_boxes_lie_in_the_image_and_match_the_target_pixels(env):
    obs = env.reset(seed=100)
    boxes = env.target_boxes  # [N, 4]
    size = env.image_size
    for i, scene in enumerate(env.scenes):
        x1, y1, x2, y2 = (int(v) for v in boxes[i].tolist())
        assert (x1, y1, x2, y2) == scene.target_shape.box
        assert 0 <= x1 < x2 <= size and 0 <= y1 < y2 <= size, f"world {i}: box {boxes[i].tolist()} leaves the image"
        assert env.min_size - 1 <= x2 - x1 <= env.max_size and env.min_size - 1 <= y2 - y1 <= env.max_size
        colour = torch.tensor(COLOURS[scene.target_shape.colour], dtype=torch.uint8)
        is_colour = (obs.image[i] == colour).all(-1)  # [H, W]
        inside = torch.zeros_like(is_colour)
        inside[y1:y2, x1:x2] = True
        # Tight: the target's pixels touch all four sides of the box ...
        in_box = is_colour[y1:y2, x1:x2]
        assert in_box[0].any() and in_box[-1].any() and in_box[:, 0].any() and in_box[:, -1].any()
        # ... and fill a good part of it (a triangle or diamond fills about half).
        assert in_box.float().mean() > 0.4, f"world {i}: box {boxes[i].tolist()} is mostly background"
        # Nothing of that colour in a one-pixel ring around the box: the box misses none of the target.
        ring = torch.zeros_like(is_colour)
        ring[max(y1 - 1, 0) : y2 + 1, max(x1 - 1, 0) : x2 + 1] = True
        ring &= ~inside
        assert not (is_colour & ring).any(), f"world {i}: target pixels outside box {boxes[i].tolist()}"


def test_perfect_answer_gets_full_reward():
    env = GroundingEnv(num_envs=8, iou_weight=2.0, format_weight=0.5)
    env.reset(seed=1)
    answers = [_answer(box) for box in env.target_boxes.tolist()]
    result = env.step(answers)
    torch.testing.assert_close(result.reward, torch.full((8,), 2.5))
    torch.testing.assert_close(result.info["reward_components"]["iou"], torch.ones(8))
    torch.testing.assert_close(result.info["reward_components"]["format"], torch.ones(8))
    assert result.info["success"].all()
    assert result.info["reasons"] == [""] * 8
    torch.testing.assert_close(result.info["pred_box"], env.target_boxes)
    torch.testing.assert_close(result.info["target_box"], env.target_boxes)
    assert result.terminated.all() and not result.truncated.any()


def test_garbage_gets_zero_with_a_reason():
    env = GroundingEnv(num_envs=4)
    env.reset(seed=2)
    result = env.step(["", "[1,2", "I think it is the red one", "<answer></answer>"])
    torch.testing.assert_close(result.reward, torch.zeros(4))
    assert all(reason for reason in result.info["reasons"]), result.info["reasons"]
    assert torch.isnan(result.info["pred_box"]).all()
    assert not result.info["success"].any()


def test_a_shifted_box_gets_partial_credit_and_no_format_loss():
    env = GroundingEnv(num_envs=4, iou_weight=1.0, format_weight=0.1)
    env.reset(seed=3)
    boxes = env.target_boxes  # [N, 4]
    width = boxes[:, 2] - boxes[:, 0]  # [N]
    shifted = boxes.clone()
    shifted[:, [0, 2]] += (width / 2).floor().unsqueeze(-1)
    result = env.step([_answer(b) for b in shifted.tolist()])
    iou = result.info["reward_components"]["iou"]
    assert ((iou > 0.2) & (iou < 0.8)).all(), iou
    torch.testing.assert_close(result.info["reward_components"]["format"], torch.ones(4))
    torch.testing.assert_close(result.reward, iou + 0.1)


def test_same_seed_same_world_and_different_seed_different_world():
    a = GroundingEnv(num_envs=4).reset(seed=5)
    b = GroundingEnv(num_envs=4).reset(seed=5)
    c = GroundingEnv(num_envs=4).reset(seed=6)
    assert torch.equal(a.image, b.image) and a.instruction == b.instruction
    # Seeds are seed + k, so seed 6 shifts the worlds of seed 5 by one.
    assert torch.equal(c.image[:3], a.image[1:])
    assert not torch.equal(c.image[3], a.image[0])


def test_group_of_equal_seeds_starts_from_one_state():
    env = GroundingEnv(num_envs=6)
    obs = env.reset(seed=[11, 11, 11, 12, 12, 12])
    groups = obs.image.view(2, 3, *obs.image.shape[1:])  # [B, G, H, W, 3]
    assert torch.equal(groups[:, 0], groups[:, 1]) and torch.equal(groups[:, 0], groups[:, 2])
    assert not torch.equal(groups[0, 0], groups[1, 0])


def test_stepping_an_ended_world_names_it():
    env = GroundingEnv(num_envs=3)
    with pytest.raises(RuntimeError, match=r"\[0, 1, 2\]"):
        env.step(["a", "b", "c"])
    env.reset(seed=0)
    env.step(["a", "b", "c"])
    env.reset(seed=[4], env_ids=[1])
    with pytest.raises(RuntimeError, match=r"worlds \[0, 2\]"):
        env.step(["a", "b", "c"])


def test_wrong_number_of_actions_is_refused():
    env = GroundingEnv(num_envs=3)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="2 actions for 3 worlds"):
        env.step(["a", "b"])


def test_make_rejects_a_typo_and_names_the_valid_options():
    with pytest.raises(ValueError, match="unknown option 'imag_size' for env 'grounding'") as err:
        sim.make("grounding", num_envs=2, imag_size=64)
    for valid in ("image_size", "max_shapes", "iou_weight", "device"):
        assert valid in str(err.value)
    assert "num_envs" not in str(err.value).split("valid:")[1]


def test_make_builds_with_options():
    env = sim.make("grounding", num_envs=2, image_size=48, max_size=20)
    obs = env.reset(seed=0)
    assert obs.image.shape == (2, 48, 48, 3)
    assert "grounding" in sim.ENVS


def test_target_boxes_is_a_copy():
    env = GroundingEnv(num_envs=2)
    env.reset(seed=0)
    boxes = env.target_boxes
    boxes.fill_(-1)
    assert (env.target_boxes >= 0).all()
