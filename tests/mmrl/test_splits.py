"""Three splits: training seeds train, `trainer.eval_every`'s evaluations play the validation split (`val/*`), and
the scores before and after a run, the report and `mmrl eval` play the test split (`eval/*`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from mmrl.runtime.config import ConfigError, load_config
from mmrl.runtime.metrics import read_metrics
from mmrl.trainer import train


@pytest.fixture(scope="module")
def numbered(tmp_path_factory) -> Path:
    """Ten records "Question i?": records 0-4 train, 5-7 validate (val_fraction 0.3), 8-9 test (eval_fraction 0.2)."""
    folder = tmp_path_factory.mktemp("numbered")
    Image.new("RGB", (16, 16), (0, 0, 200)).save(folder / "a.png")
    lines = [json.dumps({"image": "a.png", "question": f"Question {i}?", "answer": str(i)}) for i in range(10)]
    (folder / "data.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "data.jsonl"


def dataset_options(path: Path) -> list[str]:
    return ["env.name=dataset", f"env.options={{path: {path}, eval_fraction: 0.2, val_fraction: 0.3, image_size: 32}}",
            "env.eval_metric=reward", "model.path=tiny:qwen2_vl", "model.prompt_template='{instruction}'",
            "sampling.max_new_tokens=4", "trainer.eval_episodes=6", "trainer.eval_batch_size=6"]  # fmt: skip


def test_each_evaluation_split_shows_its_own_records(numbered):
    from mmrl.policy import apply_model_options, load_policy
    from mmrl.stages.evaluate import held_out

    cfg = load_config(None, dataset_options(numbered))
    policy = apply_model_options(load_policy(cfg.model), cfg.model)
    shown = {}
    for split in ("validation", "test"):
        result = held_out(policy, cfg, split=split)
        assert result.split == split
        shown[split] = {int(text.split("Question ")[1].split("?")[0]) for text in result.instructions}
    assert shown == {"validation": {5, 6, 7}, "test": {8, 9}}  # 6 episodes: each record of the split, in turn


def test_mid_run_evaluations_score_validation_and_the_run_ends_on_test(numbered, tmp_path):
    cfg = load_config(None, [*dataset_options(numbered), "trainer.total_steps=2", "trainer.eval_every=1",
                             "algo.group_size=2", "trainer.prompts_per_step=2", "trainer.save_every=0",
                             "trainer.threads=1", f"output_dir={tmp_path}"])  # fmt: skip
    history = train(cfg)
    evals = [(m["step"], sorted({k.split("/")[0] for k in m if k != "step"})) for m in history
             if any(k.startswith(("val/", "eval/")) for k in m)]  # fmt: skip
    assert evals == [(0, ["eval"]), (1, ["val"]), (2, ["eval"])]
    assert read_metrics(tmp_path / "metrics.jsonl") == history
    scores = json.loads((tmp_path / "eval.json").read_text())
    assert scores["after"]["reward"] == history[-1]["eval/reward"]  # the report's score is the test split's


def test_training_with_eval_every_on_a_dataset_without_validation_records_is_refused_before_it_starts(
    numbered, tmp_path
):
    cfg = load_config(None, [*dataset_options(numbered), "env.options.val_fraction=0", "trainer.eval_every=5",
                             f"output_dir={tmp_path / 'run'}"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"^trainer.eval_every scores the validation split, .*val_fraction > 0"):
        train(cfg)
    assert not (tmp_path / "run").exists()  # refused before anything was written
    load_config(None, [*dataset_options(numbered), "trainer.eval_every=5"]).check_validation_split()
