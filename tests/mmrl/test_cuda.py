"""The training step on a CUDA device (`-m gpu`): the tiny model on the GPU, every tensor the step builds (old
log-probs, advantages, masks, image rows) meeting the scores on the device they are on.

Two such mix-ups (CPU advantages against CUDA ratios; a CPU `arange` against CUDA image counts) broke the first
real-size run on an H200 and nothing on the CPU could show them. Here on the CPU these tests skip; `_two_steps`
also runs on the CPU in `test_the_gpu_checks_run_here_on_the_cpu`, so the overrides themselves stay valid.
All four (the three text variants and the multi-turn VLA) passed on an H200 (2026-11-26).
"""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.trainer import train

VARIANTS = {
    "grpo": (),
    "epochs_kl_papo_correction": (
        "algo.ppo_epochs=2",
        "algo.kl_coef=0.1",
        "algo.papo.gamma=0.1",
        "algo.old_logprobs=recompute",
        "algo.rollout_correction=token_truncate",
    ),
    "critic": ("algo.advantage=gae", "algo.ppo_epochs=2"),
    # Step 1 decodes in the main thread (compiled on CUDA), step 2 in the prefetching thread from a copy made after
    # that compile: on an H100 this failed inside torch's CUDA graph trees until the copy stopped compiling.
    "pipelined_static": ("trainer.max_staleness=1", "model.generation_backend=static"),
}


# A VLA (action tokens) over multi-turn episodes of the toy point-reach env, with a cold start and the critic.
VLA = (
    "model.path=tiny:qwen3_vl", "model.prompt_template='{image} {instruction}'", "model.action_bins=16",
    "env.options={}", "env.eval_metric=success", "sft.episodes=8", "sft.steps=3", "sft.batch_size=8",
    "algo.advantage=gae", "trainer.lr=1e-3",
)  # fmt: skip


def _two_steps(tmp_path, tiny_run_config, tiny_policy, env, device, overrides) -> list[dict]:
    cfg = tiny_run_config(
        tmp_path, f"env.name={env}", "trainer.total_steps=2", f"model.device={device}", *overrides
    )  # fmt: skip
    policy = None  # a VLA is built by the trainer, which adds its action tokens
    if cfg.model.action_bins == 0:
        policy = tiny_policy("qwen2_vl", seed=0, prompt_template=cfg.model.prompt_template)
        policy.model.to(device)
    rows = [m for m in train(cfg, policy=policy) if "reward/total" in m]
    assert [m["step"] for m in rows] == [1, 2]
    for m in rows:
        for key in ("loss/policy", "grad_norm", "clip_fraction"):
            assert m[key] is not None and math.isfinite(m[key]), f"step {m['step']}: {key} = {m[key]}"
    return rows


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_two_steps_on_cuda(tmp_path, tiny_run_config, tiny_policy, letters_env, variant):  # pragma: no cover - GPU
    _two_steps(tmp_path, tiny_run_config, tiny_policy, letters_env, "cuda", VARIANTS[variant])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_vla_two_steps_on_cuda(tmp_path, tiny_run_config, tiny_policy, point_env):  # pragma: no cover - GPU
    _two_steps(tmp_path, tiny_run_config, tiny_policy, point_env, "cuda", VLA)


def test_the_gpu_checks_run_here_on_the_cpu(tmp_path, tiny_run_config, tiny_policy, letters_env, point_env):
    _two_steps(tmp_path, tiny_run_config, tiny_policy, letters_env, "cpu", VARIANTS["epochs_kl_papo_correction"])
    _two_steps(tmp_path / "critic", tiny_run_config, tiny_policy, letters_env, "cpu", VARIANTS["critic"])
    _two_steps(tmp_path / "piped", tiny_run_config, tiny_policy, letters_env, "cpu", VARIANTS["pipelined_static"])
    _two_steps(tmp_path / "vla", tiny_run_config, tiny_policy, point_env, "cpu", VLA)
