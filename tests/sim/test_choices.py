"""The dataset env's re-asked multiple-choice questions (ACRE): two turns, shuffled options, consistency rewards."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rewards.consistency import LETTERS, split_options
from rewards.parse import parse_choice
from sim import check_vec_env
from sim.tasks.choices import shuffle_order
from sim.tasks.dataset import REPO, DatasetEnv

CHOICES = REPO / "assets" / "datasets" / "shapes_mc"


def make(consistency: str, num_envs: int = 4, **kwargs) -> DatasetEnv:
    return DatasetEnv(num_envs, path=CHOICES, reward="multiple_choice", consistency=consistency, **kwargs)


def wrong_letter(env: DatasetEnv, k: int) -> str:
    right = env.records[env._record_ids[k]].answer
    return next(letter for letter in "ABC" if letter != right)


def question_of(instruction: str) -> str:
    """The question with its options, without the quoted reasoning and the answer hint."""
    return instruction.split(" Your reasoning")[0].split(" Answer with")[0]


def picked_option(instruction: str, answer: str) -> str:
    return split_options(question_of(instruction))[1][LETTERS.index(parse_choice(answer).letter)]


def test_contract_holds_for_both_turns():
    check_vec_env(make("acre"), seed=0)


def test_acre_rewards_a_right_answer_only_when_the_shuffled_re_ask_keeps_it():
    env = make("acre", acre_partial=0.5)
    obs = env.reset(seed=[3, 3, 5, 5])
    right = env.expert_action()
    first = [f"It must be this one. {right[0]}", right[1], f"<answer>{wrong_letter(env, 2)}</answer>", right[3]]
    result = env.step(first)
    torch.testing.assert_close(result.reward, torch.zeros(4))  # ACRE pays at the end
    assert not result.terminated.any() and env.max_episode_steps == 2
    torch.testing.assert_close(result.info["reward_components"]["multiple_choice"], torch.tensor([1.0, 1.0, 0.0, 1.0]))
    torch.testing.assert_close(result.info["success"], torch.tensor([True, True, False, True]))
    again = result.obs.instruction
    stem, options = split_options(question_of(obs.instruction[0]))
    assert again[0].startswith(stem) and "Your reasoning: It must be this one." in again[0]
    assert split_options(question_of(again[0]))[1] != options  # the options moved
    assert sorted(split_options(question_of(again[0]))[1]) == sorted(options)
    # The expert re-answers the option each first answer picked; world 3 then switches to another option.
    second = env.expert_action()
    for k in range(4):
        assert picked_option(again[k], second[k]) == picked_option(obs.instruction[k], first[k])
    other = next(letter for letter in "ABC" if letter != parse_choice(second[3]).letter)
    result = env.step([second[0], second[1], second[2], f"<answer>{other}</answer>"])
    assert result.terminated.all()
    torch.testing.assert_close(result.reward, torch.tensor([1.0, 1.0, 0.0, 0.5]))
    torch.testing.assert_close(result.info["reward_components"]["consistent"], torch.tensor([1.0, 1.0, 1.0, 0.0]))
    torch.testing.assert_close(result.info["reward_components"]["multiple_choice"], torch.zeros(4))
    assert not result.info["success"].any()  # success is the first answer's, counted at the first turn
    assert result.info["reasons"][3] and not result.info["reasons"][0]
    with pytest.raises(RuntimeError, match="ended"):
        env.step(second)


def test_measure_keeps_the_first_answers_reward_and_only_logs_consistency():
    env = make("measure", num_envs=2)
    env.reset(seed=[7, 8])
    right = env.expert_action()
    result = env.step(right)
    torch.testing.assert_close(result.reward, torch.ones(2))
    result = env.step(["<answer>Z</answer>", env.expert_action()[1]])
    torch.testing.assert_close(result.reward, torch.zeros(2))
    torch.testing.assert_close(result.info["reward_components"]["consistent"], torch.tensor([0.0, 1.0]))


def test_shuffles_are_seeded_and_never_the_identity():
    orders = [shuffle_order(seed, 0, 3) for seed in range(50)]
    assert all(sorted(o) == [0, 1, 2] and o != [0, 1, 2] for o in orders)
    assert orders == [shuffle_order(seed, 0, 3) for seed in range(50)]
    assert len({tuple(o) for o in orders}) > 1


def test_consistency_needs_multiple_choice_records_with_inline_options(tmp_path):
    with pytest.raises(ValueError, match="multiple_choice"):
        DatasetEnv(2, consistency="acre")  # the default sample: boxes, points, counts, colours
    data = tmp_path / "data.jsonl"
    image = CHOICES.parent / "shapes_qa_480" / "images" / "000.png"
    data.write_text(f'{{"image": "{image}", "question": "Which one?", "answer": "A"}}\n' * 3)
    with pytest.raises(ValueError, match="line 1: field 'question'.*options"):
        DatasetEnv(2, path=data, reward="multiple_choice", consistency="measure", eval_fraction=0.0)
    with pytest.raises(ValueError, match="consistency must be"):
        make("twice")


def test_the_shipped_choice_dataset_is_what_its_script_writes(tmp_path):
    script = REPO / "scripts" / "make_choice_dataset.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path)], check=True, capture_output=True)
    assert (tmp_path / "data.jsonl").read_bytes() == (CHOICES / "data.jsonl").read_bytes()
