"""Multi-turn episodes as conversations (`model.history_turns`): earlier turns' images and sampled tokens in the
prompt, token in, token out, on the three tiny real architectures and a real multi-turn GUI env."""

from __future__ import annotations

import contextlib
import io
import math

import pytest
import torch

import sim
from mmrl.policy import TINY_ARCHS, Sampling
from mmrl.policy.vlm.demonstrations import (
    _demonstrated_turns,
    collect_demonstrations,
    supervised_batch,
    target_ids,
)
from mmrl.runtime.config import ConfigError, load_config
from mmrl.stages.cold_start import imitate
from mmrl.stages.rollout import collect_episodes
from mmrl.trainer import train
from mmrl.types import Demonstrations, Turn
from sim.base import Observation

SAMPLING = Sampling(max_new_tokens=6, temperature=1.0)


def unpadded(ids: torch.Tensor, mask: torch.Tensor) -> list[int]:
    return ids[mask.bool()].tolist()


def contains(seq: list[int], part: list[int]) -> bool:
    return any(seq[k : k + len(part)] == part for k in range(len(seq) - len(part) + 1))


def test_a_conversation_without_earlier_turns_is_the_plain_prompt(tiny_policy, grounding_obs):
    policy = tiny_policy("qwen2_vl")
    obs = grounding_obs("qwen2_vl", [0, 1], ["Find it.", "Find the yellow triangle left of the blue square."])
    plain = policy.encode(obs)
    conversation, counts = policy.encode_conversations(obs, [[], []])
    assert counts == [1, 1]
    for key in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw"):
        torch.testing.assert_close(conversation[key], plain[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_later_turns_hold_the_earlier_answers_token_for_token_and_their_images(arch, tiny_policy):
    policy = tiny_policy(arch, seed=1, prompt_template="{image} {instruction}")
    policy.history_turns = 2
    env = sim.make("gui_task", num_envs=4, image_size=112, max_episode_steps=4)
    torch.manual_seed(0)
    episodes = collect_episodes(policy, env, [5, 5, 6, 6], group_size=2, sampling=SAMPLING, max_turns=4)
    rollout, world, turn = episodes.rollout, episodes.world, episodes.turn
    counts = rollout.image_counts()
    assert turn.max() >= 2, "the episodes ended before a conversation formed"
    row_of = {(int(w), int(t)): r for r, (w, t) in enumerate(zip(world, turn))}
    patches = rollout.image_grid_thw.prod(-1).tolist()
    chunks = rollout.pixel_values.split(patches)
    first_image = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    checked = 0
    for (w, t), r in row_of.items():
        assert counts[r] == min(t, 2) + 1  # the kept turns' images, then the current one
        if t == 0:
            continue
        before = row_of[(w, t - 1)]
        prompt = unpadded(rollout.prompt_ids[r], rollout.prompt_mask[r])
        answer = unpadded(rollout.completion_ids[before], rollout.completion_mask[before])
        assert contains(prompt, answer), f"world {w} turn {t}: the previous answer is not in the prompt as sampled"
        # The previous turn's current image is this turn's last earlier image.
        last_before = chunks[int(first_image[before + 1]) - 1]
        shown = chunks[int(first_image[r]) + int(counts[r]) - 2]
        torch.testing.assert_close(shown, last_before, rtol=0, atol=0)
        checked += 1
    assert checked >= 4
    # The log-probs recorded while sampling are what the training forward computes for the same rows (images of
    # every turn at their places, positions after several images): the PPO ratio starts at 1.
    recomputed = policy.logprobs(rollout, temperature=SAMPLING.temperature).detach()
    mask = rollout.completion_mask
    torch.testing.assert_close(rollout.logprobs[mask], recomputed[mask], rtol=0, atol=1e-4)
    # Micro-batches of rows with different image counts stay self-contained.
    part = rollout.rows(3, len(rollout))
    got = policy.logprobs(part, temperature=SAMPLING.temperature).detach()
    torch.testing.assert_close(got[part.completion_mask], recomputed[3:][part.completion_mask], rtol=0, atol=1e-4)


def test_the_window_keeps_only_the_last_turns(tiny_policy, grounding_obs):
    policy = tiny_policy("qwen2_vl")
    obs = grounding_obs("qwen2_vl", [0])
    turns = [Turn(obs.image[0:1].clone(), f"step {k}", [1000 + k]) for k in range(3)]
    inputs, counts = policy.encode_conversations(obs, [turns])
    ids = inputs["input_ids"][0].tolist()
    assert counts == [4] and all(1000 + k in ids for k in range(3))
    text = policy.processor.tokenizer.decode(ids)
    assert text.index("step 0") < text.index("step 1") < text.index("step 2")


def test_a_tiny_run_with_conversations_trains(tiny_run_config, tmp_path):
    cfg = tiny_run_config(
        tmp_path, "env.name=gui_task", "env.options={image_size: 112, max_episode_steps: 3}", "model.history_turns=2",
        "trainer.total_steps=1", "trainer.eval_every=0", "env.eval_metric=reward",
    )  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        metrics = train(cfg)
    row = next(m for m in metrics if "loss/policy" in m)
    assert math.isfinite(row["loss/policy"]) and row["env/episode_steps"] > 1


def test_config_mistakes_name_the_field():
    with pytest.raises(ConfigError, match="model.history_turns must be >= 0"):
        load_config(None, ["model.history_turns=-1"])


def test_demonstrations_are_taught_in_the_conversation_they_were_played_in(tiny_policy):
    env = sim.make("gui_task", num_envs=2, image_size=112, tasks=["form"])  # forms take 4 steps
    images, instructions, labels, _, previous = collect_demonstrations(env, None, episodes=2)
    assert len(previous) == len(labels) and previous.count(-1) == 2  # one first step per episode
    chained = [m for m in range(len(labels)) if previous[m] >= 0 and previous[previous[m]] >= 0]
    assert chained, "no demonstration episode ran three steps"
    m = chained[0]
    assert instructions[previous[m]] == instructions[m]  # the same episode's task
    policy = tiny_policy("qwen2_vl", prompt_template="{image} {instruction}")
    policy.history_turns = 2
    turns = _demonstrated_turns(policy, images, instructions, labels, previous, m, keep=2)
    assert [t.answer_ids for t in turns] == [target_ids(policy, labels[previous[previous[m]]]),
                                             target_ids(policy, labels[previous[m]])]  # fmt: skip
    obs = Observation(image=images[m : m + 1], instruction=[instructions[m]])
    batch = supervised_batch(policy, obs, [labels[m]], [turns])
    prompt = unpadded(batch.prompt_ids[0], batch.prompt_mask[0])
    assert contains(prompt, target_ids(policy, labels[previous[m]])) and batch.image_counts().tolist() == [3]
    demos = Demonstrations(images, instructions, labels, 1.0, 2, {"previous": previous})
    losses = imitate(policy, demos, steps=3, batch_size=4, lr=1e-3)
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
