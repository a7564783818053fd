"""Curricula at both ends of a run: demonstrations at every level (`sft.all_levels`) and held-out scores per level
(`curriculum.eval_levels`), on the real jigsaw env and the tiny warm-start VLM."""

from __future__ import annotations

import re

import pytest
import torch

import sim
from mmrl.policy import load_policy
from mmrl.policy.vlm.demonstrations import merge_demonstrations
from mmrl.report import breakdown_lines, write_eval_report
from mmrl.runtime.config import load_config
from mmrl.stages.evaluate import EvalResult, evaluate, held_out

JIGSAW = "configs/jigsaw_tiny.yaml"
ANSWER = re.compile(r"<answer>\[([\d, ]*)\]</answer>")


@pytest.fixture(scope="module")
def jigsaw_policy():
    return load_policy(load_config(JIGSAW).model)


def test_demonstrations_come_from_every_level_when_asked(jigsaw_policy):
    env = sim.make("jigsaw", num_envs=4, image_size=96, grid=2)  # the curriculum's first level
    try:
        for all_levels, expected in ((True, [4] * 4 + [9] * 4), (False, [4] * 8)):
            cfg = load_config(JIGSAW, ["sft.episodes=8", "sft.label_noise=0", f"sft.all_levels={all_levels}"])
            demos = jigsaw_policy.demonstrations(env, cfg)
            assert [len(ANSWER.search(label).group(1).split(",")) for label in demos.labels] == expected
            assert demos.images.shape[0] == len(demos) == 8 and demos.extra["previous"] == [-1] * 8
            assert demos.success_rate == 1.0
    finally:
        env.close()


def test_merged_demonstrations_keep_each_episode_chain():
    image = torch.zeros(1, 4, 4, 3, dtype=torch.uint8)
    first = (image.expand(2, -1, -1, -1), ["a0", "a1"], ["x", "y"], 1.0, [-1, 0])  # one episode of 2 steps
    second = (image.expand(3, -1, -1, -1), ["b0", "c0", "b1"], ["p", "q", "r"], 0.5, [-1, -1, 0])  # 2 episodes
    images, instructions, labels, rate, previous = merge_demonstrations([(first, 1), (second, 2)])
    assert images.shape[0] == 5 and instructions == ["a0", "a1", "b0", "c0", "b1"] and labels == list("xypqr")
    assert previous == [-1, 0, -1, -1, 2]  # b1 follows b0, now at row 2
    assert rate == pytest.approx((1.0 * 1 + 0.5 * 2) / 3)


def test_held_out_scores_every_level_on_the_same_seeds(jigsaw_policy):
    cfg = load_config(JIGSAW, ["trainer.eval_episodes=6", "trainer.eval_batch_size=6"])
    metrics = held_out(jigsaw_policy, cfg).metrics
    for level in (2, 3):
        assert {f"success@grid={level}", f"reward@grid={level}"} <= set(metrics)
    # The last level is the config's own difficulty: the same seeds and greedy answers give the same scores.
    assert metrics["reward@grid=3"] == metrics["reward"] and metrics["success@grid=3"] == metrics["success"]
    at_two = evaluate(jigsaw_policy, "jigsaw", {**cfg.env.make_options(), "grid": 2}, episodes=6, batch_size=6)
    assert metrics["reward@grid=2"] == pytest.approx(at_two.metrics["reward"])
    plain = held_out(jigsaw_policy, load_config(JIGSAW, ["trainer.eval_episodes=6", "curriculum.eval_levels=false"]))
    assert not any("@grid=" in key for key in plain.metrics)
    assert plain.metrics["episodes@task=grid3"] == 6  # jigsaw names its task by grid


def test_breakdown_lines_show_each_level_and_task_at_each_point():
    cfg = load_config(JIGSAW)
    scores = {
        "initial": {"success": 0.0, "success@grid=2": 0.0, "success@grid=3": 0.0},
        "before": {"success": 0.01, "success@grid=2": 0.2, "success@grid=3": 0.01},
        "after": {"success": 0.05, "success@grid=2": 0.4, "success@grid=3": 0.05, "reward@grid=2": 0.5},
    }
    lines = breakdown_lines(cfg, scores)
    assert len(lines) == 2 and "at grid=2" in lines[0] and lines[0].endswith("0.000 -> 0.200 -> 0.400")
    assert "initial -> after demonstrations -> after RL" in lines[1]
    tasks = {"before": {"success@task=click-tab": 0.5}, "after": {"success@task=click-tab": 1.0}}
    assert breakdown_lines(cfg, tasks) == ["held-out success at task=click-tab (before -> after RL): 0.500 -> 1.000"]


def test_held_out_scores_each_task_of_a_multi_task_env(jigsaw_policy):
    # gui_task names each world's task; its per-task means are over that task's own episodes.
    metrics = evaluate(jigsaw_policy, "gui_task", {"image_size": 96}, episodes=6, batch_size=3).metrics
    counts = {k.split("=", 1)[1]: v for k, v in metrics.items() if k.startswith("episodes@task=")}
    assert sum(counts.values()) == 6 and len(counts) >= 2
    total = sum(metrics[f"reward@task={t}"] * n for t, n in counts.items())
    assert total / 6 == pytest.approx(metrics["reward"], abs=1e-5)


def test_eval_report_tables_each_task_and_keeps_videos_of_successes_and_failures(tmp_path):
    cfg = load_config(JIGSAW, ["checkpoint=ckpt", "trainer.eval_episodes=4"])
    metrics = {"success": 0.5, "reward": 0.75, "episodes@task=a": 2.0, "success@task=a": 1.0, "reward@task=a": 1.5,
               "episodes@task=b": 2.0, "success@task=b": 0.0, "reward@task=b": 0.0}  # fmt: skip
    frames = torch.randint(0, 255, (4, 3, 8, 8, 3), dtype=torch.uint8)
    result = EvalResult(metrics=metrics, images=frames[:, 0], instructions=["w0", "w1", "w2", "w3"], texts=[""] * 4,
                        info={}, frames=frames, success=torch.tensor([True, False, False, True]))  # fmt: skip
    path = write_eval_report(cfg, result, tmp_path, videos=1)
    text = path.read_text()
    assert "| a | 2 | 1.000 | 1.500 |" in text and "| b | 2 | 0.000 | 0.000 |" in text
    assert "| **all** | 4 | 0.500 | 0.750 |" in text
    assert "- success: [videos/success_0.gif](videos/success_0.gif), 'w0'" in text
    assert "- failure: [videos/failure_0.gif](videos/failure_0.gif), 'w1'" in text
    assert sorted(p.name for p in (tmp_path / "videos").iterdir()) == ["failure_0.gif", "success_0.gif"]
