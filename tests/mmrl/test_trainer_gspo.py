"""GSPO in the real trainer: `algo.loss=gspo` alone trains with GSPO's own clip range and aggregation.

GSPO clips a sequence's ratio, the geometric mean of its token ratios, which stays far closer to 1 than a token's:
the paper clips it at 3e-4 / 4e-4 (https://arxiv.org/abs/2507.18071, section 5.1). PPO's 0.2 / 0.28 would leave it
unclipped. The run trains a random tiny Qwen2-VL on `grounding_letters` (conftest), whose dense reward gives GRPO a
gradient.
"""

from __future__ import annotations

import contextlib
import io

import pytest

from mmrl import algos
from mmrl.runtime.config import ConfigError
from mmrl.runtime.metrics import read_metrics
from mmrl.trainer import train

GSPO_RANGE = {"clip_low": 3e-4, "clip_high": 4e-4, "aggregation": "seq_mean_token_mean"}


def test_gspo_through_the_trainer_clips_at_its_own_sequence_range(tmp_path, tiny_run_config, letters_env, monkeypatch):
    gspo_loss, seen = algos.POLICY_LOSSES.get("gspo"), []

    def recording_gspo_loss(*args, **kwargs):
        seen.append({name: kwargs[name] for name in GSPO_RANGE})
        return gspo_loss(*args, **kwargs)

    monkeypatch.setitem(algos.POLICY_LOSSES._items, "gspo", recording_gspo_loss)  # what the objective is handed
    # Two epochs over one rollout: on the second the weights have moved, so the ratios leave 1; lr 1e-5 moves them by
    # more than 4e-4 and less than 0.2.
    cfg = tiny_run_config(
        tmp_path, f"env.name={letters_env}", "algo.loss=gspo", "algo.ppo_epochs=2", "algo.group_size=4",
        "trainer.total_steps=1", "trainer.eval_episodes=1", "trainer.lr=1e-5",
    )  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        train(cfg)
    rows = [m for m in read_metrics(tmp_path / "metrics.jsonl") if "loss/policy" in m]

    assert seen and all(call == GSPO_RANGE for call in seen), seen
    assert len(rows) == 1 and rows[0]["optimizer_steps"] == 2
    # Every token ratio, hence every sequence ratio (their geometric mean), stayed inside PPO's range: a clip binds
    # only because the range is GSPO's.
    assert 0.8 < rows[0]["ratio/min"] and rows[0]["ratio/max"] < 1.2, rows[0]
    assert rows[0]["clip_fraction"] > 0, rows[0]
    assert rows[0]["clip_fraction"] == pytest.approx(rows[0]["clip_fraction_low"] + rows[0]["clip_fraction_high"])


def test_gspo_with_a_ppo_sized_range_is_refused_before_the_run(tmp_path, tiny_run_config):
    with pytest.raises(ConfigError, match=r"algo.clip_low and algo.clip_high \(0.2 / 0.28\) .* algo.loss gspo"):
        tiny_run_config(tmp_path, "algo.loss=gspo", "algo.clip_low=0.2", "algo.clip_high=0.28")
    assert not (tmp_path / "metrics.jsonl").exists()
