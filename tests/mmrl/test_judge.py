"""A judge model as a reward (`mmrl.methods.judge`): real tiny VLMs score answers; batching, cache, failures, training."""

from __future__ import annotations

import math

import pytest
import torch

import sim
from mmrl.methods.judge import Judge, RemoteJudge, read_score
from mmrl.policy.vision import to_pil
from mmrl.runtime.config import JudgeConfig
from mmrl.trainer import train

ANSWERS = ["<answer>[1, 2, 30, 40]</answer>", "no", "<svg viewBox='0 0 {w} {h}'><rect width='9'/></svg> " * 3]


def images(n: int, size: int = 56, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, size, size, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def by_hand(judge: Judge, image: torch.Tensor, instruction: str, answer: str) -> float:
    """The expected digit of one unpadded prompt, straight from the model's logits."""
    policy = judge.policy
    inputs = policy.processor([judge.prompt(instruction, answer)], [to_pil(image)])
    logits = policy.model(**policy._with_token_types(dict(inputs))).logits[0, -1].float()
    probs = torch.softmax(logits, -1)[[policy.processor.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]]
    return float((probs * torch.arange(10.0)).sum() / probs.sum() / 9)


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_expected_score_is_the_judges_digit_distribution_row_by_row(tiny_policy, arch):
    judge = Judge(JudgeConfig(batch_size=3), policy=tiny_policy(arch, seed=1))
    pictures = images(3)
    instructions = ["Find the red circle.", "Find {the} square.", "Draw it."]
    got = judge.score(pictures, instructions, ANSWERS)  # one padded batch of prompts of three lengths
    with torch.no_grad():
        want = [by_hand(judge, pictures[i], instructions[i], ANSWERS[i]) for i in range(3)]
    torch.testing.assert_close(got.scores, torch.tensor(want), atol=2e-5, rtol=0)
    assert got.reasons == ["", "", ""] and ((got.digit_mass > 0) & (got.digit_mass <= 1)).all()
    assert len(set(got.scores.tolist())) == 3  # the rows differ: the values compared are not one constant
    # Braces in answers and instructions are kept as written (an SVG answer is full of them).
    assert "viewBox='0 0 {w} {h}'" in judge.prompt("Draw {it}.", ANSWERS[2]) and "Draw {it}." in judge.prompt(
        "Draw {it}.", "x"
    )


def test_scores_are_cached_per_image_instruction_and_answer(tiny_policy):
    judge = Judge(JudgeConfig(batch_size=2, cache_size=3), policy=tiny_policy("qwen2_vl"))
    pictures = images(4)
    pictures[1] = pictures[0]  # world 1 shows world 0's image, and is given the same answer: one prompt
    answers = ["a", "a", "b", "c"]
    first = judge.score(pictures, ["Q"] * 4, answers)
    assert judge.forwards == 2 and first.scores[0] == first.scores[1]  # 3 distinct prompts in batches of 2
    again = judge.score(pictures, ["Q"] * 4, answers)
    assert judge.forwards == 2 and torch.equal(again.scores, first.scores)  # all cached: no forward
    judge.score(images(1, seed=5), ["Q"], ["d"])  # a fourth entry: the least recently used one leaves
    assert len(judge.cache) == 3
    judge.score(pictures[:1], ["Q"], ["a"])
    assert judge.forwards == 4


def test_failures_score_zero_with_the_reason_and_are_not_cached(tiny_policy):
    judge = Judge(JudgeConfig(max_prompt_tokens=150), policy=tiny_policy("qwen2_vl"))
    got = judge.score(images(2), ["Q", "Q"], ["short", "long " * 80])
    assert got.reasons[0] == "" and got.scores[1] == 0.0
    assert got.reasons[1].startswith("judge: prompt of ") and "judge.max_prompt_tokens=150" in got.reasons[1]

    broken = Judge(JudgeConfig(), policy=tiny_policy("qwen2_vl"))

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory")

    broken.policy.model.forward = out_of_memory
    got = broken.score(images(2), ["Q", "Q"], ["a", "b"])
    assert got.scores.tolist() == [0.0, 0.0] and got.reasons[0] == "judge failed: RuntimeError: CUDA out of memory"
    assert not broken.cache  # a transient failure is tried again next time


def test_generate_mode_reads_the_judges_greedy_reply(tiny_policy):
    assert read_score("Score: 7. Close.", 9) == (7 / 9, "")
    assert read_score("10 out of 10", 9)[0] == 0.0 and "no score in 0..9" in read_score("10 out of 10", 9)[1]
    assert read_score("", 5) == (0.0, "judge wrote no score in 0..5: ''")
    judge = Judge(JudgeConfig(mode="generate", max_new_tokens=4), policy=tiny_policy("qwen2_vl", seed=3))
    pictures, answers = images(2), ["a", "bb"]
    got = judge.score(pictures, ["Q", "Q"], answers)
    policy = judge.policy
    for i in range(2):  # the same reply, generated here one prompt at a time
        inputs = policy._with_token_types(
            dict(policy.processor([judge.prompt("Q", answers[i])], [to_pil(pictures[i])]))
        )
        out = policy.model.generate(**inputs, max_new_tokens=4, do_sample=False, pad_token_id=policy.pad_token_id)
        reply = policy.processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        assert (float(got.scores[i]), got.reasons[i]) == pytest.approx(read_score(reply, 9))


def test_a_judge_loads_from_a_model_folder_and_names_a_bad_one(tiny_policy, tmp_path):
    policy = tiny_policy("qwen2_vl", seed=2)
    policy.save_pretrained(tmp_path / "judge")
    loaded = Judge(JudgeConfig(model=str(tmp_path / "judge")))
    in_memory = Judge(JudgeConfig(), policy=policy)
    pictures = images(2)
    torch.testing.assert_close(
        loaded.score(pictures, ["Q", "R"], ["a", "b"]).scores, in_memory.score(pictures, ["Q", "R"], ["a", "b"]).scores
    )
    with pytest.raises(ValueError, match="judge.model: cannot load"):
        Judge(JudgeConfig(model=str(tmp_path / "missing")))


def test_config_mistakes_name_the_field():
    from mmrl.runtime.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="judge.rubric must contain {answer}"):
        load_config(None, ["judge.rubric='Rate it.'"])
    with pytest.raises(ConfigError, match="judge.max_score must be in 1..9"):
        load_config(None, ["judge.max_score=10"])
    with pytest.raises(ConfigError, match="judge"):
        load_config(None, ["judge.mode=vibes"])


def test_training_with_a_judge_adds_its_weighted_score_to_the_reward(tiny_policy, tiny_run_config, tmp_path):
    tiny_policy("qwen2_vl", seed=4).save_pretrained(tmp_path / "judge")
    cfg = tiny_run_config(
        tmp_path / "run", "trainer.total_steps=1", "trainer.eval_every=0", f"judge.model={tmp_path / 'judge'}",
        "judge.weight=0.5",
    )  # fmt: skip
    metrics = train(cfg)
    row = next(m for m in metrics if "loss/policy" in m)
    assert 0.0 < row["reward/judge"] < 1.0
    env = sim.make("grounding", num_envs=1, image_size=112)
    weights = {"iou": env.iou_weight, "format": env.format_weight}
    own = sum(w * row[f"reward/{name}"] for name, w in weights.items())
    assert math.isclose(row["reward/total"], own + 0.5 * row["reward/judge"], rel_tol=1e-5, abs_tol=1e-6)


def test_a_remote_judge_is_one_shared_actor_scoring_as_the_local_one(tiny_policy, tmp_path):
    ray = pytest.importorskip("ray")
    tiny_policy("qwen2_vl", seed=6).save_pretrained(tmp_path / "judge")
    cfg = JudgeConfig(model=str(tmp_path / "judge"), remote=True)
    started = not ray.is_initialized()
    try:
        first, second = RemoteJudge(cfg), RemoteJudge(cfg)
        assert first.actor._actor_id == second.actor._actor_id
        pictures = images(2)
        local = Judge(JudgeConfig(model=cfg.model))
        torch.testing.assert_close(
            first.score(pictures, ["Q", "R"], ["a", "b"]).scores, local.score(pictures, ["Q", "R"], ["a", "b"]).scores
        )
    finally:
        if started:
            ray.shutdown()
