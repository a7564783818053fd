"""A flow policy's (π0's) real-size options on the real tiny PI0: gradient checkpointing gives the same gradients and
replays the vision tower's and the expert's layers, a frozen vision tower or part gets no gradient while the rest
does, LoRA's vision side puts adapters on SigLIP, and what is not built for a flow policy is refused with its reason.
"""

import copy

import pytest
import torch

from mmrl.policy import check_run
from mmrl.policy.flow import FlowPolicy, FlowStats, build_tiny_flow
from mmrl.policy.flow.options import apply_flow_options
from mmrl.runtime.config import ConfigError, EnvConfig, LoRAConfig, ModelConfig, SFTConfig, TrainConfig
from mmrl.types import Sampling
from sim.base import Observation

STATS = ((0.0, 0.0, 0.0, 0.0), (0.1, 0.1, 0.2, 0.2), (0.1, -0.1), (0.5, 0.4))
VISION, PROJECTOR, LANGUAGE = (
    "model.vlm.vision_tower.",
    "model.vlm.multi_modal_projector.",
    "model.vlm.language_model.",
)


def _obs(n: int = 4, seed: int = 0) -> Observation:
    gen = torch.Generator().manual_seed(seed)
    return Observation(
        image=torch.randint(0, 256, (n, 2, 48, 48, 3), generator=gen, dtype=torch.uint8),
        instruction=[f"move the gripper to the {c} disc" for c in ("red", "green", "blue", "yellow")[:n]],
        proprio=torch.randn(n, 4, generator=gen) * 0.1,
    )


def _policy(**cfg):
    policy = build_tiny_flow(seed=0, stats=FlowStats(*STATS))
    return apply_flow_options(policy, ModelConfig(path="tiny:pi0", **cfg))


def _rollout(policy):
    policy.model.eval()
    rollout = policy.generate(_obs(), 2, Sampling(), generator=torch.Generator().manual_seed(0))
    policy.model.train()
    return rollout


def _loss(policy, rollout) -> torch.Tensor:
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5]).unsqueeze(-1)  # [R, 1]
    return -(policy.logprobs(rollout) * advantages).mean()


def _grads(policy) -> dict[str, torch.Tensor]:
    return {k: v.grad for k, v in policy.net.named_parameters() if v.grad is not None}


def test_gradient_checkpointing_gives_the_same_gradients_and_replays_the_vision_and_expert_layers():
    plain = build_tiny_flow(seed=0, stats=FlowStats(*STATS))
    checkpointed = apply_flow_options(copy.deepcopy(plain), ModelConfig(path="tiny:pi0", gradient_checkpointing=True))
    rollout = _rollout(plain)
    calls = {"vision": 0, "backbone": 0, "expert": 0}
    net = checkpointed.net.model
    layers = {
        "vision": next(m for n, m in net.vlm.vision_tower.named_modules() if n.endswith("layers.0")),
        "backbone": net.vlm.language_model.layers[0],
        "expert": net.dit.layers[0],
    }
    for name, layer in layers.items():  # the attention runs inside the layer's forward, replays included
        layer.self_attn.register_forward_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    for policy in (plain, checkpointed):
        policy.model.train()
        _loss(policy, rollout).backward()
    # Forward once each; the backward replays the vision tower's and the expert's layers, not the backbone's (whose
    # layers write the prompt cache the expert reads).
    assert calls == {"vision": 2, "backbone": 1, "expert": 2}
    expected, got = _grads(plain), _grads(checkpointed)
    assert expected.keys() == got.keys() and any(k.startswith(VISION) for k in got)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-7, msg=name)


def test_freeze_vision_and_freeze_parts_leave_the_expert_training():
    cases = {
        "freeze_vision": ({"freeze_vision": True}, (VISION, PROJECTOR)),
        "freeze language": ({"freeze": ["language"]}, (LANGUAGE,)),
        "freeze vision + projector": ({"freeze": ["vision", "projector"]}, (VISION, PROJECTOR)),
    }
    for case, (cfg, frozen) in cases.items():
        policy = _policy(**cfg)
        named = dict(policy.net.named_parameters())
        assert all(not v.requires_grad for k, v in named.items() if k.startswith(frozen)), case
        assert all(v.requires_grad for k, v in named.items() if not k.startswith(frozen)), case
        _loss(policy, _rollout(policy)).backward()
        grads = _grads(policy)
        assert not any(k.startswith(frozen) for k in grads), case
        assert any(k.startswith("model.dit.") for k in grads) and "action_out_proj.weight" in grads, case
        others = (VISION, LANGUAGE) if frozen != (LANGUAGE,) else (VISION,)
        assert all(any(k.startswith(p) for k in grads) for p in others if p not in frozen), case


def test_lora_vision_puts_adapters_on_siglip_and_its_projector():
    pytest.importorskip("peft")
    without = _policy(lora=LoRAConfig(r=4, target_modules="expert"))
    with_vision = _policy(lora=LoRAConfig(r=4, target_modules="expert", vision=True))
    adapters = lambda p: {k for k, v in p.net.named_parameters() if "lora_" in k and v.requires_grad}  # noqa: E731
    assert not any(k.startswith((VISION, PROJECTOR)) for k in adapters(without))
    vision = {k for k in adapters(with_vision) if k.startswith((VISION, PROJECTOR))}
    assert any(k.startswith(VISION) for k in vision) and any(k.startswith(PROJECTOR) for k in vision)
    assert adapters(with_vision) - vision == adapters(without)  # the expert's adapters as before
    _loss(with_vision, _rollout(with_vision)).backward()
    grads = _grads(with_vision)
    assert any(k.startswith(VISION) and "lora_B" in k and v.abs().sum() > 0 for k, v in grads.items())
    assert not any(k.startswith(LANGUAGE) for k in grads)  # no adapters on the backbone: nothing trains there


@pytest.mark.parametrize(
    ("cfg", "reason"),
    [
        ({"system_prompt": "You are a robot."}, "model.system_prompt: not built for flow policies.*no chat template"),
        ({"history_turns": 2}, "model.history_turns: not built for flow policies.*current observation only"),
        ({"generation_backend": "hf"}, "model.generation_backend: not built for flow policies.*own denoising loop"),
    ],
)
def test_options_that_make_no_sense_for_a_flow_policy_are_refused_with_the_reason(cfg, reason):
    with pytest.raises(ConfigError, match=reason):  # before anything loads
        check_run(TrainConfig(model=ModelConfig(path="tiny:pi0", **cfg)))


def test_freezing_every_part_of_a_pi0_is_no_config_mistake(tmp_path):
    """π0's action expert trains whatever `model.freeze` names, so the "nothing would train" refusal (a VLM's) lets
    a π0 through, named as tiny:pi0 or as a folder whose config.json says so (LeRobot's `"type": "pi0"` too)."""
    every = ["vision", "projector", "language"]
    check_run(TrainConfig(model=ModelConfig(path="tiny:pi0", freeze=every)))
    for config in ('{"model_type": "pi0"}', '{"type": "pi0"}'):
        (tmp_path / "config.json").write_text(config)
        assert check_run(TrainConfig(model=ModelConfig(path=str(tmp_path), freeze=every))) is FlowPolicy
    (tmp_path / "config.json").write_text('{"model_type": "qwen2_vl"}')
    with pytest.raises(ConfigError, match=r"model\.freeze: not built for VLM policies.*nothing to train"):
        check_run(TrainConfig(model=ModelConfig(path=str(tmp_path), freeze=every)))


def test_every_step_labels_are_for_a_pi0_only():
    check_run(TrainConfig(model=ModelConfig(path="tiny:pi0"), env=EnvConfig(name="reach"),
                          sft=SFTConfig(every_step=True, episodes=8)))  # fmt: skip
    with pytest.raises(ConfigError, match=r"sft\.every_step: not built for VLM policies.*flow policy's \(π0's\)"):
        check_run(TrainConfig(sft=SFTConfig(every_step=True, episodes=8)))
