"""PAPO's perception terms in the real trainer, and the monitoring pass that measures a baseline's perception KL.

The runs train a random tiny Qwen2-VL on `grounding_letters` (conftest), whose answers depend on the image.
"""

from __future__ import annotations

import contextlib
import io

import pytest

from mmrl.runtime.metrics import read_metrics
from mmrl.trainer import train

PAPO = ("algo.papo.gamma=0.02", "algo.papo.eta=0.03")
SAME_RUN = ("reward/total", "loss/policy", "grad_norm")


def _rows(cfg) -> list[dict]:
    with contextlib.redirect_stdout(io.StringIO()):
        train(cfg)
    return [m for m in read_metrics(cfg.output_dir + "/metrics.jsonl") if "loss/policy" in m]


def _cfg(tiny_run_config, path, letters_env, *overrides):
    return tiny_run_config(
        str(path), f"env.name={letters_env}", "trainer.total_steps=2", "trainer.eval_episodes=1",
        "algo.group_size=4", "trainer.prompts_per_step=2", "trainer.lr=0.05", *overrides,
    )  # fmt: skip


def test_papo_logs_its_terms_and_changes_the_update(tmp_path, tiny_run_config, letters_env):
    grpo = _rows(_cfg(tiny_run_config, tmp_path / "grpo", letters_env))
    papo = _rows(_cfg(tiny_run_config, tmp_path / "papo", letters_env, *PAPO))
    assert not any(key.startswith("papo/") for row in grpo for key in row)
    for row in papo:
        assert row["papo/kl"] > 0  # hiding 60% of the patches changes a random model's answers
        assert row["papo/entropy"] > 0 and row["papo/masked_entropy"] > 0
    # Same first rollout (same seed, same weights); the perception and entropy terms change the gradient.
    assert papo[0]["reward/total"] == pytest.approx(grpo[0]["reward/total"])
    assert papo[0]["grad_norm"] != pytest.approx(grpo[0]["grad_norm"], rel=1e-4)


def test_monitoring_measures_the_kl_without_changing_the_run(tmp_path, tiny_run_config, letters_env):
    grpo = _rows(_cfg(tiny_run_config, tmp_path / "grpo", letters_env))
    watched = _rows(_cfg(tiny_run_config, tmp_path / "watched", letters_env, "algo.papo.monitor=true"))
    papo = _rows(_cfg(tiny_run_config, tmp_path / "papo", letters_env, *PAPO))
    for got, want in zip(watched, grpo, strict=True):  # the monitoring pass takes no gradient and adds no loss
        for key in SAME_RUN:
            assert got[key] == pytest.approx(want[key], abs=1e-6), key
        assert got["papo/kl"] > 0
    # Before any update the two runs score the same rollout with the same masks: the same KL and entropies.
    for key in ("papo/kl", "papo/entropy", "papo/masked_entropy"):
        assert watched[0][key] == pytest.approx(papo[0][key], rel=1e-5), key
