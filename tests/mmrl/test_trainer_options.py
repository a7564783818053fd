"""The trainer applies the real-size options of `model.*` and `trainer.*`: LoRA, a frozen vision tower, micro-batches
packed by a token budget, and env workers (Ray actors when `env.workers > 0`)."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from mmrl.trainer import train


def _run(cfg):
    with contextlib.redirect_stdout(io.StringIO()):
        return train(cfg)


def _step_rows(history):
    return [m for m in history if "loss/policy" in m]


def test_token_budget_gives_the_loss_of_row_micro_batches(tmp_path, tiny_run_config, letters_env):
    """Packing by tokens (and trimming each slice's padding) changes how the batch is cut, never the loss."""
    common = (f"env.name={letters_env}", "trainer.total_steps=2", "algo.group_size=4", "trainer.micro_batch_size=8")
    rows = _step_rows(_run(tiny_run_config(tmp_path / "rows", *common)))
    budget = _step_rows(_run(tiny_run_config(tmp_path / "budget", *common, "trainer.token_budget=60")))
    for a, b in zip(rows, budget):
        assert a["loss/policy"] == pytest.approx(b["loss/policy"], rel=1e-4, abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)


def test_lora_and_frozen_vision_train_only_what_they_should(tmp_path, tiny_run_config, letters_env):
    pytest.importorskip("peft")
    from mmrl.policy import load_policy
    from mmrl.policy.lora import is_lora

    cfg = tiny_run_config(
        tmp_path, f"env.name={letters_env}", "trainer.total_steps=1", "model.lora.r=4", "model.freeze_vision=true",
        "trainer.lr=1e-2",
    )  # fmt: skip
    start = load_policy(cfg.model)
    history = _run(cfg)
    assert _step_rows(history)[0]["grad_norm"] > 0
    trained = load_policy(cfg.model, checkpoint=tmp_path / "checkpoints" / "step_00000001")
    assert is_lora(trained)
    from mmrl.policy.lora import merge_lora

    merged = merge_lora(trained).model.state_dict()
    base = start.model.state_dict()
    vision = [k for k in base if ".visual." in k or k.startswith("visual.") or "model.visual" in k]
    assert vision, "found no vision weights to compare"
    assert all(torch.equal(base[k], merged[k]) for k in vision), "the frozen vision tower moved"
    moved = [k for k in base if k in merged and not torch.equal(base[k], merged[k])]
    assert moved, "LoRA training changed nothing"


def test_env_workers_run_the_env_in_ray_actors(tmp_path, tiny_run_config):
    pytest.importorskip("ray")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        local = _step_rows(_run(tiny_run_config(tmp_path / "local", "trainer.total_steps=1")))
        remote = _step_rows(_run(tiny_run_config(tmp_path / "ray", "trainer.total_steps=1", "env.workers=2")))
    finally:
        ray.shutdown()
    assert local[0]["reward/total"] == pytest.approx(remote[0]["reward/total"])
    assert local[0]["loss/policy"] == pytest.approx(remote[0]["loss/policy"], rel=1e-5, abs=1e-7)


def test_rollout_workers_generate_what_the_trainer_generates_in_process(tmp_path, tiny_run_config, letters_env):
    """`trainer.rollout_workers=2`: two Ray actors with synced policy copies collect the shards; the run equals the
    in-process run with the same generation_shards, step by step and in its final weights. The env's rewards vary and
    the lr is large, so the weights move every step: a worker left with stale weights would sample differently."""
    pytest.importorskip("ray")
    import ray

    from mmrl.policy import load_policy

    common = (
        f"env.name={letters_env}", "trainer.total_steps=3", "algo.group_size=4", "trainer.generation_shards=2",
        "trainer.threads=1", "trainer.lr=1e-2",
    )  # fmt: skip
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        local_cfg = tiny_run_config(tmp_path / "local", *common)
        remote_cfg = tiny_run_config(tmp_path / "ray", *common, "trainer.rollout_workers=2")
        local, remote = _step_rows(_run(local_cfg)), _step_rows(_run(remote_cfg))
    finally:
        ray.shutdown()
    assert len(local) == len(remote) == 3
    assert all(row["grad_norm"] > 0 for row in local)
    for a, b in zip(local, remote):
        assert a["reward/total"] == pytest.approx(b["reward/total"], abs=1e-6)
        assert a["loss/policy"] == pytest.approx(b["loss/policy"], rel=1e-5, abs=1e-7)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    final = "checkpoints/step_00000003"
    start = load_policy(local_cfg.model).model.state_dict()
    mine = load_policy(local_cfg.model, checkpoint=tmp_path / "local" / final).model.state_dict()
    theirs = load_policy(remote_cfg.model, checkpoint=tmp_path / "ray" / final).model.state_dict()
    assert any(not torch.equal(start[k], mine[k]) for k in mine), "training moved no weight"
    for key, value in mine.items():
        torch.testing.assert_close(theirs[key], value, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "overrides, message",
    [(("trainer.rollout_workers=-1",), "trainer.rollout_workers must be >= 0"),
     (("trainer.rollout_workers=1", "env.workers=1"), "trainer.rollout_workers and env.workers"),
     (("trainer.rollout_workers=2",), "needs trainer.generation_shards set to a multiple of 2"),
     (("trainer.rollout_workers=1", "trainer.rollout_timeout_s=0"), "trainer.rollout_timeout_s must be > 0")],
)  # fmt: skip
def test_bad_rollout_worker_settings_are_named(tmp_path, tiny_run_config, overrides, message):
    with pytest.raises(ValueError, match=message):
        _run(tiny_run_config(tmp_path, "trainer.total_steps=1", *overrides))
