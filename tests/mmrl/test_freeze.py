"""`model.freeze`: the vision encoder, its projector and the language model frozen separately."""

from __future__ import annotations

import pytest
import torch

from mmrl.config import ConfigError, ModelConfig
from mmrl.policy import TINY_ARCHS, Sampling, apply_model_options
from mmrl.policy.options import FREEZE_PARTS, part_parameters


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
    with pytest.raises(ConfigError, match=r"model\.freeze.*nothing would train"):
        ModelConfig(freeze=["vision", "projector", "language"])
    ModelConfig(freeze=["vision", "projector", "language"], lora_r=4)  # LoRA adapters still train
