"""A `ModelConfig`'s options applied to a flow policy (π0): sampling, checkpointing, frozen parts, LoRA.

What `mmrl.policy.vlm.options.apply_model_options` does for a VLM, for `FlowPolicy` (its `apply_options`), sharing
`mmrl.policy.lora`'s helpers where the operation is the same:

* `model.flow.noise_method` / `noise_level` / `steps`: the sampler's settings (null keeps the policy's);
* `model.gradient_checkpointing`: the vision tower's (SigLIP) and the action expert's layers recompute their
  activations in the backward pass. PaliGemma's language model keeps its own: its layers write the prompt's
  key/value cache that the expert reads, and a layer replayed in the backward pass would write it a second time
  (transformers drops the cache of a checkpointed layer for that reason); the expert's layers only read the
  prompt's part (their own keys are cropped after each pass), so they replay on the same cache;
* `model.freeze_vision`: SigLIP and its projector fixed (openpi's / LeRobot's `freeze_vision_encoder`, with the
  projector as for a VLM);
* `model.freeze`: parts fixed, "vision", "projector", "language" (PaliGemma's language model and its embeddings);
  the action expert and its projections are never frozen by it (LeRobot's `train_expert_only` is all three);
* `model.lora.r > 0`: LoRA on `model.lora.target_modules`' parts (`LORA_PARTS`), plus the vision tower's and
  projector's linear layers with `model.lora.vision`.
"""

from __future__ import annotations

import torch
from torch import nn

from ...runtime.schema import ConfigError
from ..lora import checkpoint_layers, freeze_parts, freeze_vision, require_peft, vision_linear_names
from .data import sampler_problem

# LoRA's parts of a PI0 model (`model.lora.target_modules`): where each part's linear layers live.
LORA_PARTS = {"backbone": "model.vlm.language_model.", "expert": "model.dit."}
LANGUAGE_PART = LORA_PARTS["backbone"]  # model.freeze's "language" in a PI0 model


def apply_flow_options(policy, cfg):
    """Set a flow policy's (`mmrl.policy.flow.FlowPolicy`) sampling from `model.flow.noise_level`,
    `model.flow.noise_method` and `model.flow.steps` (each left null keeps the policy's own, e.g. its folder's), apply
    checkpointing, frozen parts and LoRA (see the module docstring), and return the policy. What a flow policy lacks
    (`FlowPolicy.features`) is refused before it loads, by `FlowPolicy.check_config`.

    The sampling settings are attributes the sampler and the scorer read at each call, so applying them to a loaded
    policy is enough; a checkpoint saved afterwards carries them. Call it before the optimiser is built.
    """
    method = policy.noise_method if cfg.flow.noise_method is None else cfg.flow.noise_method
    level = policy.noise_level if cfg.flow.noise_level is None else float(cfg.flow.noise_level)
    steps = policy.num_steps if cfg.flow.steps is None else int(cfg.flow.steps)
    problem = sampler_problem(method, level, steps)  # the folder's own settings filled in
    if problem is not None:
        raise ConfigError(" ".join(problem))
    policy.noise_method, policy.noise_level, policy.num_steps = method, level, steps
    if method == "flow_noise":
        policy.attach_noise_head(seed=cfg.seed)  # before the optimiser is built: it trains the head's weights
    if cfg.gradient_checkpointing:
        enable_flow_checkpointing(policy)
    if cfg.freeze_vision:
        freeze_vision(policy)
    if cfg.freeze:
        freeze_parts(policy, cfg.freeze, language=LANGUAGE_PART)
    if cfg.lora.r > 0 and policy.model is policy.net:  # a policy loaded from a LoRA checkpoint has its adapters
        apply_flow_lora(
            policy, cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules, cfg.seed, cfg.lora.vision
        )
    return policy


def enable_flow_checkpointing(policy) -> None:
    """Gradient checkpointing on the vision tower's and the action expert's layers (see the module docstring for
    why not the backbone's language model). Active in training mode only, as for a VLM."""
    net = policy.net
    checkpoint_layers(net.model.vlm.vision_tower)
    checkpoint_layers(net.model.dit)
    for layer in net.model.dit.layers:
        # Its replay in the backward pass appends the expert's keys to the prompt's cache again, after the pass
        # cropped them: it sees the prompt's keys as in the forward, and the cache is not read afterwards.
        layer._can_checkpoint_with_cache = True


def apply_flow_lora(
    policy,
    r: int,
    alpha: int = 32,
    dropout: float = 0.0,
    parts: str = "all-linear",
    seed: int = 0,
    vision: bool = False,
):
    """Wrap the policy's model in PEFT LoRA adapters on the linear layers of `parts` (`model.lora.target_modules`:
    "backbone", "expert", "backbone,expert" or "all-linear" for both), and with `vision` on the vision tower's and
    its projector's too; everything else is frozen but Flow-Noise's head. `lora_A` draws from `seed` (PEFT draws it
    from the global generator)."""
    peft = require_peft()
    names = ["backbone", "expert"] if parts == "all-linear" else [p.strip() for p in parts.split(",") if p.strip()]
    bad = [name for name in names if name not in LORA_PARTS]
    if bad or not names:
        raise ValueError(f"model.lora.target_modules {parts!r}: a flow policy (π0) takes LoRA on its parts "
                         f"{', '.join(LORA_PARTS)} (comma-separated) or all-linear for both")  # fmt: skip
    prefixes = tuple(LORA_PARTS[name] for name in names)
    targets = [
        name for name, module in policy.net.named_modules() if isinstance(module, nn.Linear) and name.startswith(prefixes)
    ]  # fmt: skip
    if vision:
        targets += vision_linear_names(policy.net)
    config = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy.model = peft.get_peft_model(policy.model, config)
    train_noise_head(policy)
    return policy


def train_noise_head(policy) -> None:
    """Make Flow-Noise's head trainable again: PEFT freezes every base weight, and the head starts untrained, so it
    trains beside the adapters."""
    head = getattr(policy.net, "noise_head", None)
    if head is not None:
        head.requires_grad_(True)
