"""Multiple-choice questions about freshly drawn shapes: right answers from the scene, chance without looking."""

import re
from collections import Counter

import numpy as np
import pytest
import torch

import sim
from sim.tasks.grounding import COLOURS
from sim.tasks.questions import LETTERS, ShapeQuestionsEnv


def _chosen(instruction: str, letter: str) -> str:
    """The option text a letter names in an instruction."""
    return dict(re.findall(r"\(([A-E])\) (\w+)", instruction))[letter]


def test_contract_with_garbage_and_with_the_experts_answers():
    env = sim.make("shape_questions", num_envs=4, image_size=64)
    sim.check_vec_env(env, seed=0)  # garbage answers
    env.reset(seed=0)
    sim.check_vec_env(env, seed=0, actions=env.expert_action())


def test_the_right_option_is_what_the_image_shows():
    env = ShapeQuestionsEnv(num_envs=300, image_size=64)
    obs = env.reset(seed=11)
    answers = env.expert_action()
    result = env.step(answers)
    assert result.info["success"].all() and result.info["reasons"] == [""] * 300
    torch.testing.assert_close(result.reward, torch.ones(300))
    seen = Counter(result.info["task"])
    assert set(seen) == {"colour", "shape", "count"} and min(seen.values()) > 60, seen
    for instruction, answer, scene, image in zip(obs.instruction, answers, env.scenes, obs.image):
        option = _chosen(instruction, answer[len("<answer>") : -len("</answer>")])
        if instruction.startswith("How many"):
            assert option == str(len(scene.shapes))
        elif instruction.startswith("What colour is the"):
            kind = instruction.split()[4].rstrip("?")
            (shape,) = [s for s in scene.shapes if s.kind == kind]  # a kind the image holds once
            assert option == shape.colour
            x1, y1, x2, y2 = shape.box  # and the pixels there have that colour
            pixels = image[y1:y2, x1:x2].reshape(-1, 3)
            assert (pixels == torch.tensor(COLOURS[option], dtype=torch.uint8)).all(-1).any()
        else:
            colour = instruction.split()[3].rstrip("?")
            (shape,) = [s for s in scene.shapes if s.colour == colour]
            assert option == shape.kind


def test_an_answer_that_does_not_look_is_at_chance():
    env = ShapeQuestionsEnv(num_envs=400, image_size=64)
    for letter in LETTERS:  # the right letter is spread over the options
        env.reset(seed=500)
        assert float(env.step([f"<answer>{letter}</answer>"] * 400).reward.mean()) < 0.33
    # The best answer from the question's text alone: its most frequent right option text, per question.
    obs = env.reset(seed=500)
    texts = [_chosen(i, a[8:9]) for i, a in zip(obs.instruction, env.expert_action())]
    stems = [i.split("?")[0] for i in obs.instruction]
    best = sum(max(Counter(t for s2, t in zip(stems, texts) if s2 == s).values()) for s in set(stems))
    assert best / 400 < 0.42  # an upper bound: the prior fitted on the very questions it is scored on


def test_same_seed_same_world_and_the_scene_is_groundings():
    a, b = ShapeQuestionsEnv(num_envs=3, image_size=64), ShapeQuestionsEnv(num_envs=3, image_size=64)
    oa, ob = a.reset(seed=[4, 9, 4]), b.reset(seed=[4, 9, 4])
    assert torch.equal(oa.image, ob.image) and oa.instruction == ob.instruction
    assert oa.instruction[0] == oa.instruction[2] and torch.equal(oa.image[0], oa.image[2])
    grounding = sim.make("grounding", num_envs=1, image_size=64, min_size=10, max_size=21)
    assert np.array_equal(grounding.reset(seed=9).image[0].numpy(), oa.image[1].numpy())


def test_wrong_and_malformed_answers_score_zero_with_a_reason():
    env = ShapeQuestionsEnv(num_envs=3, image_size=64)
    obs = env.reset(seed=2)
    right = env.expert_action()
    wrong = next(x for x in LETTERS[:4] if f"<answer>{x}</answer>" != right[0])
    result = env.step([f"<answer>{wrong}</answer>", "I cannot tell", "<answer>Z</answer>"])
    assert result.reward.tolist() == [0.0, 0.0, 0.0]
    assert result.info["reasons"][0] == f"picked ({wrong}) {_chosen(obs.instruction[0], wrong)}"
    assert result.info["reasons"][1] and result.info["reasons"][2]


def test_expert_noise_and_only_the_asked_kinds():
    env = ShapeQuestionsEnv(num_envs=400, image_size=64, questions=["colour", "shape"])
    env.reset(seed=0)
    noisy = env.step(env.expert_action(noise=0.5, generator=torch.Generator().manual_seed(0)))
    assert 0.4 < float(noisy.reward.mean()) < 0.6
    assert Counter(noisy.info["task"])["count"] < 20  # only the scenes with neither a unique kind nor colour


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"questions": []}, "questions must be"),
        ({"questions": ["size"]}, "questions must be"),
        ({"questions": "colour"}, "questions must be"),
        ({"max_shapes": 5}, "max_shapes <= 4"),
        ({"min_shapes": 1}, "2 <= min_shapes"),
    ],
)
def test_bad_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ShapeQuestionsEnv(num_envs=1, **kwargs)


def test_expert_needs_reset_and_a_generator_for_noise():
    env = ShapeQuestionsEnv(num_envs=2)
    with pytest.raises(RuntimeError, match="never reset"):
        env.expert_action()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="Generator"):
        env.expert_action(noise=0.2)
