"""A dataset's own splits through the config as a user sets them (`env.options.hf_validation_split`,
`env.options.hf_test_split`): `trainer.eval_every` scores the named validation split, the run's report the named
test split."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from mmrl.runtime.config import load_config
from mmrl.runtime.metrics import read_metrics
from mmrl.trainer import train

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A hub repository folder with train (4 rows), validation (2) and test (3) shards; questions name their split."""
    repo = tmp_path_factory.mktemp("hub")
    (repo / "data").mkdir()
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (0, 0, 200)).save(buffer, format="PNG")
    for split, count in (("train", 4), ("validation", 2), ("test", 3)):
        table = pa.table({"image": pa.array([{"bytes": buffer.getvalue(), "path": None}] * count, IMAGE),
                          "question": [f"{split.capitalize()} question {i}?" for i in range(count)],
                          "answer": [str(i) for i in range(count)]})  # fmt: skip
        pq.write_table(table, repo / "data" / f"{split}-00000-of-00001.parquet")
    return repo


def options(repo) -> list[str]:
    return ["env.name=dataset", f"env.options.path={repo}", "env.options.hf_validation_split=validation",
            "env.options.hf_test_split=test", "env.options.image_size=32", "env.eval_metric=reward",
            "model.path=tiny:qwen2_vl", "model.prompt_template='{instruction}'", "sampling.max_new_tokens=4",
            "trainer.eval_episodes=4", "trainer.eval_batch_size=4"]  # fmt: skip


def test_each_evaluation_plays_its_named_split(hub):
    from mmrl.policy import apply_model_options, load_policy
    from mmrl.stages.evaluate import held_out

    cfg = load_config(None, options(hub))
    policy = apply_model_options(load_policy(cfg.model), cfg.model)
    for split, word in (("validation", "Validation"), ("test", "Test")):
        result = held_out(policy, cfg, split=split)
        assert result.split == split and {text.split(" question")[0] for text in result.instructions} == {word}


def test_eval_every_scores_the_named_validation_split(hub, tmp_path):
    cfg = load_config(None, [*options(hub), "trainer.total_steps=2", "trainer.eval_every=1", "algo.group_size=2",
                             "trainer.prompts_per_step=2", "trainer.save_every=0", "trainer.threads=1",
                             f"output_dir={tmp_path}"])  # fmt: skip
    cfg.check_validation_split()  # a named validation split is one: no val_fraction needed
    history = train(cfg)
    evals = [(m["step"], sorted({k.split("/")[0] for k in m if k != "step"})) for m in history
             if any(k.startswith(("val/", "eval/")) for k in m)]  # fmt: skip
    assert evals == [(0, ["eval"]), (1, ["val"]), (2, ["eval"])]  # mid-run: validation; before and after: test
    assert read_metrics(tmp_path / "metrics.jsonl") == history
    assert json.loads((tmp_path / "eval.json").read_text())["after"]["reward"] == history[-1]["eval/reward"]
