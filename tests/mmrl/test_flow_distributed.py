"""FSDP2 under torchrun for a flow policy: two CPU processes (gloo) train the tiny π0 on reach as one process
generating the same two shards does (`generation_shards=2`, the seed of each half the same), the way
tests/mmrl/test_distributed.py checks VLMs. The expert's gradient reaches the backbone through the prompt's
key/value cache, which FSDP's hooks do not see (`FlowPolicy.in_root_call`): a wrong gathering shows up as an error or
as weights that differ. Heavy (two launches, about a minute on two cores): `-m slow`."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
import yaml

from tests.mmrl.test_distributed import torchrun, training_rows

RUN = {
    "model": {"path": "tiny:pi0"},
    "env": {"name": "reach", "options": {"image_size": 64, "camera": "ego"}, "eval_metric": "success"},
    "sft": {"episodes": 8, "steps": 2, "batch_size": 8},
    "algo": {"group_size": 2},
    # 4 prompts x 2 samples: 4 rows per process in micro-batches of 3 + 1, 8 rows in one process in 3 + 3 + 2.
    "trainer": {"total_steps": 2, "prompts_per_step": 4, "micro_batch_size": 3, "lr": 1e-3, "eval_episodes": 2,
                "eval_batch_size": 2, "save_every": 1, "threads": 1},
}  # fmt: skip
COMPARED = ("loss/policy", "grad_norm", "reward/total")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "algo"),
    [
        ({}, {}),
        # Flow-Noise's head and a critic with GAE (its gradients averaged over the processes), two epochs.
        ({"flow": {"noise_method": "flow_noise"}},
         {"advantage": "gae", "ppo_epochs": 2, "old_logprobs": "recompute", "critic": {"lr": 0.01}}),
        # LoRA on both parts: the adapters are what FSDP shards and reduces, and lora/ what rank 0 saves.
        ({"lora": {"r": 4, "target_modules": "backbone,expert"}}, {}),
    ],
    ids=["flow_sde", "flow_noise_gae", "lora"],
)  # fmt: skip
def test_two_processes_train_the_tiny_pi0_as_one_process_with_two_shards(tmp_path, model, algo):
    from mmrl.policy.flow import FlowPolicy
    from mmrl.runtime.checkpoint import latest_checkpoint
    from mmrl.runtime.config import load_config
    from mmrl.trainer import train

    pytest.importorskip("mujoco")
    run = {**RUN, "model": {**RUN["model"], **model}, "algo": {**RUN["algo"], **algo}}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run))
    two, one = tmp_path / "two", tmp_path / "one"
    torchrun(tmp_path / "two.log", "-m", "mmrl", "train", str(config), f"output_dir={two}")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        train(load_config(config, [f"output_dir={one}"]), generation_shards=2)
    got, want = training_rows(two), training_rows(one)
    assert [m["step"] for m in got] == [m["step"] for m in want] == [1, 2]
    for g, w in zip(got, want):
        for key in COMPARED + (("critic/grad_norm",) if algo.get("advantage") else ()):
            assert g[key] == pytest.approx(w[key], rel=1e-4, abs=1e-6), f"step {w['step']}: {key}"
        assert g["grad_norm"] > 0.01  # a real gradient
    # The final weights agree (to float32's reduction order, through Adam), and moved far more than that.
    start = FlowPolicy.from_pretrained(one / "cold_start").model.state_dict()
    ends = [FlowPolicy.from_pretrained(latest_checkpoint(d)).model.state_dict() for d in (one, two)]
    assert ends[0].keys() == ends[1].keys() == start.keys()
    assert max(float((ends[0][k] - ends[1][k]).abs().max()) for k in start) < 1e-4
    assert max(float((ends[0][k] - start[k]).abs().max()) for k in start) > 1e-3
    if model.get("flow"):
        assert any(k.startswith("noise_head.") for k in start)
    if model.get("lora"):
        assert sum("lora_" in k for k in start) > 0
    assert all(torch.isfinite(v).all() for v in ends[1].values())
