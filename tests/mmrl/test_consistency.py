"""TTRV's label-free rewards and GRPO-CARE's EMA reference on real episodes, tokens and a tiny real VLM; the three
consistency presets (TTRV, ACRE, GRPO-CARE) log what they promise in a shrunk run."""

from __future__ import annotations

import contextlib
import io
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import sim
from mmrl.algos.consistency import care_bonus
from mmrl.methods.consistency import CareReference, answer_token_mask, with_vote_rewards
from mmrl.runtime.config import ConfigError, load_config
from mmrl.stages.rollout import collect_episodes
from mmrl.trainer import train
from mmrl.types import Rollout, Sampling

REPO = Path(__file__).resolve().parents[2]
CHOICES = {"path": str(REPO / "assets" / "datasets" / "shapes_mc"), "reward": "multiple_choice", "image_size": 64}
SHRINK = [
    "sft.episodes=0", "algo.group_size=2", "trainer.prompts_per_step=2", "trainer.total_steps=1",
    "trainer.eval_episodes=2", "trainer.eval_batch_size=2", "trainer.threads=1", "sampling.max_new_tokens=8",
]  # fmt: skip


@pytest.fixture(scope="module")
def episodes(tiny_policy):
    """Two groups of G=3 real episodes on the multiple-choice questions, their texts replaced by chosen answers."""
    policy = tiny_policy("qwen2_vl", prompt_template="{instruction}")
    env = sim.make("dataset", num_envs=6, **CHOICES)
    torch.manual_seed(0)
    played = collect_episodes(policy, env, [0, 0, 0, 1, 1, 1], 3, Sampling(max_new_tokens=4))
    texts = ["<answer>A</answer>", "(A)", "<answer>B</answer>", "C", "no answer", "<answer>c</answer>"]
    return policy, replace(played, rollout=replace(played.rollout, texts=texts))


def test_vote_rewards_replace_the_env_reward_whatever_the_labels(episodes):
    _, played = episodes
    cfg = load_config(REPO / "configs" / "ttrv_tiny.yaml", ["algo.group_size=3"])
    shaped = with_vote_rewards(played, cfg.algo)
    # Group 0 answers A, A, B; group 1 answers C, nothing, C (G=3: certainty 1 + log(p) / log 3).
    c = lambda p: 1 + math.log(p) / math.log(3)  # noqa: E731
    vote = torch.tensor([2 / 3, 2 / 3, 1 / 3, 2 / 3, 0.0, 2 / 3])
    certainty = torch.tensor([c(2 / 3), c(2 / 3), 0.0, c(2 / 3), 0.0, c(2 / 3)])
    torch.testing.assert_close(shaped.returns(), vote + 0.5 * certainty)
    torch.testing.assert_close(shaped.components["ttrv_vote"], vote)
    assert "multiple_choice" in shaped.components  # the labels' score stays, for the logs only
    relabelled = replace(played, step_rewards=torch.rand(played.step_rewards.shape))
    torch.testing.assert_close(with_vote_rewards(relabelled, cfg.algo).returns(), shaped.returns())
    off = replace(cfg.algo, label_free="off")
    assert with_vote_rewards(played, off) is played


def test_vote_rewards_refuse_episodes_of_several_turns(tiny_policy):
    policy = tiny_policy("qwen2_vl", prompt_template="{instruction}")
    env = sim.make("dataset", num_envs=2, consistency="measure", **CHOICES)
    played = collect_episodes(policy, env, [0, 0], 2, Sampling(max_new_tokens=2))
    cfg = load_config(REPO / "configs" / "ttrv_tiny.yaml", ["algo.group_size=2"])
    with pytest.raises(ValueError, match="several turns"):
        with_vote_rewards(played, cfg.algo)


def written(rollout: Rollout, tokenizer, texts: list[str]) -> Rollout:
    """`rollout` (its prompts and images) completed by `texts` instead of what was sampled."""
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids))
    return replace(
        rollout,
        completion_ids=torch.tensor([row + [0] * (width - len(row)) for row in ids]),
        completion_mask=torch.tensor([[k < len(row) for k in range(width)] for row in ids]),
        logprobs=torch.zeros(len(ids), width),
        texts=texts,
    )


def test_answer_token_mask_covers_the_answer_tag_content(episodes):
    policy, played = episodes
    tokenizer = policy.processor.tokenizer
    texts = ["<think>round and red</think><answer>circle</answer>", "no tags at all"] * 3
    rollout = written(played.rollout, tokenizer, texts)
    mask = answer_token_mask(rollout, tokenizer)
    assert tokenizer.decode(rollout.completion_ids[0][mask[0]].tolist()).strip() == "circle"
    assert not mask[1].any()


def test_care_reference_scores_answers_and_follows_the_policy(episodes):
    policy, played = episodes
    tokenizer = policy.processor.tokenizer
    texts = ["I see it. <answer>A</answer>"] * 3 + ["<answer>B</answer>", "none", "<answer>B</answer>"]
    rollout = written(played.rollout, tokenizer, texts)
    care = CareReference(policy, decay=0.5, coef=0.5, group_size=3, micro_batch_size=4)
    consistency = care.consistency(rollout)
    mask = answer_token_mask(rollout, tokenizer)
    with torch.no_grad():
        logprobs = policy.logprobs(rollout)
    expected = torch.where(mask, logprobs, 0.0).sum(-1) / mask.sum(-1).clamp_min(1)
    torch.testing.assert_close(consistency, torch.where(mask.any(-1), expected.exp(), 0.0))
    assert consistency[4] == 0 and (consistency[mask.any(-1)] > 0).all()

    success = torch.tensor([True, True, True, True, False, True])
    shaped, metrics = care.shape(replace(played, rollout=rollout, success=success))
    bonus = care_bonus(consistency, success, group_size=3, coef=0.5)
    torch.testing.assert_close(shaped.returns(), played.returns() + bonus)
    torch.testing.assert_close(metrics["care/bonus_rate"], (bonus > 0).float().mean())

    before = [p.detach().clone() for p in care.policy.model.parameters()]
    with torch.no_grad():
        moved = [p.add(1.0) for p in policy.model.parameters()]
        for p, m in zip(policy.model.parameters(), moved):
            p.copy_(m)
    care.follow(policy)
    for p, b, m in zip(care.policy.model.parameters(), before, moved):
        torch.testing.assert_close(p, (b + m) / 2)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.sub_(1.0)  # the module-scoped policy back as it was


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["algo.care.coef=0.5", "algo.kl_coef=0.1"], "algo.care.coef"),
        (["algo.label_free=ttrv", "algo.difficulty_low=0.1"], "algo.label_free"),
        (["algo.label_free=ttrv", "algo.care.coef=0.5"], "algo.care.coef"),
        (["algo.care.ema_decay=1.5"], "algo.care.ema_decay"),
        (["algo.ttrv.entropy_coef=-1"], "algo.ttrv.entropy_coef"),
    ],
)
def test_config_refuses_inconsistent_options_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field):
        load_config(REPO / "configs" / "dataset_tiny.yaml", overrides)


@pytest.mark.parametrize(
    "preset, keys",
    [
        ("ttrv_tiny.yaml", ("reward/ttrv_vote", "reward/ttrv_certainty", "reward/multiple_choice")),
        ("acre_tiny.yaml", ("reward/consistent", "reward/multiple_choice")),
        ("grpo_care_tiny.yaml", ("care/consistency", "care/bonus", "care/bonus_rate")),
    ],
)
def test_consistency_presets_log_their_terms(preset, keys, tmp_path):
    cfg = load_config(REPO / "configs" / preset, [*SHRINK, f"output_dir={tmp_path}"])
    with contextlib.redirect_stdout(io.StringIO()):
        metrics = train(cfg)
    row = next(m for m in metrics if "loss/policy" in m)
    for key in keys:
        assert key in row and math.isfinite(row[key]), key
    if preset == "ttrv_tiny.yaml":  # the reward is the votes', never the labels'
        assert math.isclose(row["reward/total"], row["reward/ttrv_vote"] + 0.5 * row["reward/ttrv_certainty"],
                            rel_tol=1e-5, abs_tol=1e-6)  # fmt: skip
    if preset == "acre_tiny.yaml":
        assert row["env/episode_steps"] == 2.0
