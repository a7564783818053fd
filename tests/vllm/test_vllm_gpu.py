"""The colocated vllm backend on a CUDA GPU (`-m gpu`; not run on the CPU machines, where vLLM has no sleep mode).

Sleep mode frees the engine's weights and KV cache between generations (what the trainer asks for before each
synchronous update), and waking re-syncs the weights: samples after an optimiser step taken while the engine slept
still score as the training forward does. float32, tolerance 1e-3 (GPU kernels; the CPU tests see about 1e-6).
"""

from __future__ import annotations

import pytest
import torch

import sim
from mmrl.policy import build_tiny
from mmrl.types import Sampling

SAMPLING = Sampling(max_new_tokens=8, temperature=0.9)


@pytest.mark.gpu
def test_sleep_frees_the_engines_memory_and_waking_resyncs_the_weights():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here")
    policy = build_tiny("qwen2_vl", seed=0, prompt_template="{instruction} Answer as <answer>[x1,y1,x2,y2]</answer>.")
    policy.model.to("cuda")
    policy.set_generation_backend("vllm", gpu_memory_utilization=0.2, max_model_len=1024, enforce_eager=True)
    assert policy.backend.enable_sleep_mode  # on by default where the platform has it
    obs = sim.make("grounding", num_envs=2, image_size=112).reset(seed=[0, 1]).select([0, 0, 1, 1])

    def check(rollout):
        ids = torch.tensor(policy.suppress_token_ids)
        policy._restrict = lambda logits: logits.index_fill(-1, ids.to(logits.device), float("-inf"))
        try:
            with torch.no_grad():
                want = policy.logprobs(rollout, temperature=SAMPLING.temperature)
        finally:
            del policy._restrict
        mask = rollout.completion_mask
        torch.testing.assert_close(rollout.logprobs[mask], want[mask], rtol=0, atol=1e-3)

    torch.manual_seed(0)
    rollout = policy.generate(obs, group_size=2, sampling=SAMPLING)
    check(rollout)
    free_awake = torch.cuda.mem_get_info()[0]
    policy.backend.sleep()
    assert torch.cuda.mem_get_info()[0] > free_awake  # weights and KV cache released
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
    (-policy.logprobs(rollout, temperature=SAMPLING.temperature)[rollout.completion_mask].mean()).backward()
    optimizer.step()
    torch.manual_seed(1)
    check(policy.generate(obs, group_size=2, sampling=SAMPLING))  # woken, re-synced with the new weights
    policy.close()
