"""A run whose every group is flat (equal rewards: zero advantage) for `FLAT_STEPS` steps in a row says so, once.

A random `tiny:qwen2_vl` scores 0 on every grounding sample (no box, no format), so all its groups are flat; with the
`grounding_letters` env (conftest: a dense reward on the letters written) its samples differ and nothing is said.
"""

from __future__ import annotations

import pytest

import mmrl.stages.collect as collect
from mmrl.runtime.metrics import read_metrics
from mmrl.trainer import train


@pytest.mark.parametrize("env", ["grounding", "letters"])
def test_flat_groups_are_named_once_with_the_tiny_models_cause(
    tmp_path, tiny_run_config, letters_env, capsys, monkeypatch, env
):
    monkeypatch.setattr(collect, "FLAT_STEPS", 2)  # 20 in a run; the same count at 2 in three steps
    overrides = ["trainer.total_steps=3", "trainer.save_every=0", "trainer.eval_episodes=2"]
    if env == "letters":
        overrides.append(f"env.name={letters_env}")
    train(tiny_run_config(tmp_path, *overrides))
    err = capsys.readouterr().err
    flat = [row["data/flat_groups"] for row in read_metrics(tmp_path / "metrics.jsonl") if "data/flat_groups" in row]
    warning = "warning: every group of the last 2 steps had equal rewards (data/flat_groups = 1)"
    if env == "grounding":
        assert flat == [1.0, 1.0, 1.0]
        assert err.count(warning) == 1  # at step 2, not again at step 3
        assert "model.path=tiny:qwen2_vl is random weights for plumbing: it scores about 0 and learns nothing" in err
    else:
        assert min(flat) < 1.0 and warning not in err


def test_estimators_that_do_not_compare_within_a_group_are_not_watched(tiny_run_config, tmp_path):
    assert collect.FlatGroupWatch(tiny_run_config(tmp_path)).watching
    for overrides in (["algo.group_size=1", "algo.advantage=reinforce_pp"], ["algo.advantage=gae"]):
        assert not collect.FlatGroupWatch(tiny_run_config(tmp_path, *overrides)).watching, overrides
