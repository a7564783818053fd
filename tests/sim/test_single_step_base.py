"""`SingleStepImageEnv`: the base of grounding, gui_click, dataset and the render envs, tested with a toy subclass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sim
from sim.base import SingleStepImageEnv
from sim.check import check_vec_env
from sim.render.envs import SvgEnv
from sim.tasks.dataset import DatasetEnv
from sim.tasks.grounding import GroundingEnv

COLOURS = ("red", "green", "blue")
RGB = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}


class ColourEnv(SingleStepImageEnv):
    """Name the colour of a plain image; the target box is the whole image."""

    def __init__(self, num_envs: int, image_size: int = 8, device: str = "cpu"):
        super().__init__(num_envs, image_size, device)
        self.colours = [""] * num_envs
        self.draws = 0

    def draw_worlds(self, ids, seeds):
        self.draws += 1
        images = np.zeros((len(ids), self.image_size, self.image_size, 3), dtype=np.uint8)
        for row, (i, seed) in enumerate(zip(ids, seeds)):
            self.colours[i] = COLOURS[seed % 3]
            images[row] = RGB[self.colours[i]]
            images[row, 0, 0] = seed % 256  # every seed draws its own image (the contract checker asks for that)
        boxes = np.tile([0, 0, self.image_size, self.image_size], (len(ids), 1))
        return images, [f"Name the colour ({i})." for i in ids], boxes

    def score(self, texts):
        right = torch.tensor([t == c for t, c in zip(texts, self.colours)], dtype=torch.float32)
        return right, {"reward_components": {"right": right}, "reasons": [""] * len(texts), "success": right > 0}


def test_the_toy_env_keeps_the_contract():
    check_vec_env(ColourEnv(4), seed=0)


def test_reset_draws_only_the_named_worlds_and_returns_all():
    env = ColourEnv(3)
    obs = env.reset(seed=[0, 1, 2])
    assert [tuple(obs.image[k, 1, 1].tolist()) for k in range(3)] == [RGB["red"], RGB["green"], RGB["blue"]]
    again = env.reset(seed=[4], env_ids=[2])  # seed 4 -> green, world 2 only
    assert tuple(again.image[2, 1, 1].tolist()) == RGB["green"]
    assert torch.equal(again.image[:2], obs.image[:2]) and again.instruction[:2] == obs.instruction[:2]
    assert env.reset(seed=0, env_ids=[]).image.shape == (3, 8, 8, 3)  # nothing to draw: no call of the hook
    assert env.draws == 2


def test_returned_tensors_are_fresh_copies():
    env = ColourEnv(2)
    obs = env.reset(seed=0)
    obs.image.zero_()
    env.target_boxes.zero_()
    assert env._images.sum() > 0 and env.target_boxes.sum() > 0


def test_step_scores_ends_every_episode_and_refuses_a_second_step():
    env = ColourEnv(2)
    env.reset(seed=[0, 1])
    result = env.step(["red", "blue"])
    assert result.reward.tolist() == [1.0, 0.0] and result.reward.dtype == torch.float32
    assert result.terminated.all() and not result.truncated.any()
    assert result.info["success"].tolist() == [True, False]
    with pytest.raises(RuntimeError, match=r"worlds \[0, 1\] have ended"):
        env.step(["red", "red"])
    env.reset(seed=[2], env_ids=[1])
    with pytest.raises(RuntimeError, match=r"worlds \[0\] have ended"):  # world 1 may go on, world 0 not
        env.step(["red", "blue"])


def test_never_reset_worlds_and_bad_actions_are_refused():
    env = ColourEnv(2)
    with pytest.raises(RuntimeError, match="never reset"):
        env.step(["red", "red"])
    env.reset(seed=0)
    with pytest.raises(ValueError, match="got 1 actions for 2 worlds"):
        env.step(["red"])
    with pytest.raises(ValueError, match="list of 2 strings"):
        env.step("red")
    with pytest.raises(ValueError, match="num_envs must be an int >= 1"):
        ColourEnv(0)


def test_the_four_families_stand_on_it():
    for cls in (
        GroundingEnv,
        DatasetEnv,
        SvgEnv,
        sim.ENVS.get("gui_click"),
        sim.ENVS.get("chart"),
        sim.ENVS.get("cad"),
    ):
        assert issubclass(cls, SingleStepImageEnv), cls
        assert "reset" not in vars(cls), f"{cls.__name__} re-implements reset"
    # DatasetEnv's own step is the base's for plain questions (`super().step`) and adds ACRE's re-asked turn with
    # `consistency` on (tests/sim/test_choices.py), so it is left out here.
    for cls in (GroundingEnv, sim.ENVS.get("gui_click")):
        assert "step" not in vars(cls), f"{cls.__name__} re-implements step"
    assert not hasattr(SvgEnv(1), "target_boxes")  # render envs have no boxes
