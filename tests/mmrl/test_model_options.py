"""`model.freeze` (vision encoder, projector, language model separately) and `model.min_pixels`/`max_pixels`."""

from __future__ import annotations

import pytest
import torch

from mmrl.policy import TINY_ARCHS, Sampling, apply_model_options, check_run
from mmrl.policy.lora import FREEZE_PARTS, part_parameters
from mmrl.runtime.config import ConfigError, LoRAConfig, ModelConfig, TrainConfig


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_the_three_parts_cover_the_model_and_freeze_alone(arch, tiny_policy, grounding_obs):
    policy = tiny_policy(arch, seed=0)
    split = part_parameters(policy.model)
    names = {n for part in split.values() for n in part}
    assert names == {n for n, _ in policy.model.named_parameters()}  # every parameter in exactly one part
    assert sum(len(p) for p in split.values()) == len(names)
    assert all(split[part] for part in FREEZE_PARTS)
    assert all("merger" in n for n in split["projector"]) and all("visual" in n for n in split["vision"])
    obs = grounding_obs(arch, [0, 0])
    torch.manual_seed(0)
    rollout = policy.generate(obs, 2, Sampling(max_new_tokens=4))
    for part in FREEZE_PARTS:
        policy = tiny_policy(arch, seed=0)
        apply_model_options(policy, ModelConfig(freeze=[part]))
        policy.logprobs(rollout).sum().backward()
        for name, param in part_parameters(policy.model)[part].items():
            assert not param.requires_grad and param.grad is None, (part, name)
        others = [p for other in FREEZE_PARTS if other != part for p in part_parameters(policy.model)[other].values()]
        assert all(p.requires_grad for p in others) and any(
            p.grad is not None and p.grad.abs().sum() > 0 for p in others
        )


def test_freeze_mistakes_name_the_field():
    with pytest.raises(ConfigError, match=r"model\.freeze.*unknown part"):
        ModelConfig(freeze=["encoder"])
    with pytest.raises(ConfigError, match=r"model\.freeze.*nothing to train"):  # a VLM's refusal, before it loads
        check_run(TrainConfig(model=ModelConfig(freeze=["vision", "projector", "language"])))
    lora = LoRAConfig(r=4)  # LoRA trains
    check_run(TrainConfig(model=ModelConfig(freeze=["vision", "projector", "language"], lora=lora)))


def test_pixel_bounds_set_the_image_tokens_and_the_policy_stays_consistent(tiny_policy, grounding_obs):
    from mmrl.policy import Sampling

    obs = grounding_obs("qwen2_vl", [0, 0])
    counts = {}
    for bounds in ((0, 0), (0, 56 * 56), (200_000, 0)):
        policy = tiny_policy("qwen2_vl", seed=0)
        apply_model_options(policy, ModelConfig(min_pixels=bounds[0], max_pixels=bounds[1]))
        torch.manual_seed(0)
        rollout = policy.generate(obs, 2, Sampling(max_new_tokens=4))
        counts[bounds] = int((rollout.prompt_ids[0] == policy.processor.image_token_id).sum())
        mask = rollout.completion_mask
        torch.testing.assert_close(rollout.logprobs[mask], policy.logprobs(rollout).detach()[mask], rtol=0, atol=1e-4)
    assert counts[(0, 56 * 56)] < counts[(0, 0)] < counts[(200_000, 0)]
    assert counts[(0, 56 * 56)] <= 56 * 56 // (14 * 2) ** 2  # at most area / (patch * merge)^2 tokens
    with pytest.raises(ConfigError, match=r"model\.min_pixels"):
        ModelConfig(min_pixels=10_000, max_pixels=100)
