"""A `ModelConfig`'s options applied to a token policy (`VLMPolicy.fit` calls `apply_model_options`), in this order:

1. the generation backend (`generation_backend`, `vllm_gpu_memory_utilization`), the conversation length
   (`history_turns`) and the system prompt (`system_prompt`, a system turn the chat template renders);
2. the image-area range (`min_pixels`, `max_pixels`);
3. gradient checkpointing (`mmrl.policy.lora`);
4. `freeze_vision` and `freeze`: the parts kept fixed;
5. `lora.r > 0`: LoRA adapters (`mmrl.policy.lora.apply_lora`).

Call it after the action codec is attached (`add_action_tokens`), since LoRA needs to know the action tokens, and
before the optimiser is built. It is idempotent: a policy loaded from a LoRA checkpoint already carries its adapters
and gets no second set.
"""

from __future__ import annotations

from ...runtime.config import ModelConfig
from ..lora import apply_lora, enable_gradient_checkpointing, freeze_parts, freeze_vision, is_lora
from ..tokens import ModelHolder


def apply_model_options(policy: ModelHolder, cfg: ModelConfig) -> ModelHolder:
    """Apply a `ModelConfig`'s real-size options to a loaded token policy (see the module docstring for the order)."""
    policy.history_turns = cfg.history_turns
    if cfg.system_prompt and getattr(policy.family, "prompt", None) is not None:
        raise ValueError(f"model.system_prompt: a {policy.family.name} model has no chat template to put it in")
    policy.processor.system_prompt = cfg.system_prompt  # a system turn before every prompt (processing.chat)
    vllm = cfg.generation_backend in ("vllm", "vllm_process")  # both routes' engines take the memory share
    options = {"gpu_memory_utilization": cfg.vllm_gpu_memory_utilization} if vllm else {}
    if cfg.generation_backend != policy.generation_backend or options:
        policy.set_generation_backend(cfg.generation_backend, **options)
    if cfg.min_pixels or cfg.max_pixels:
        policy.processor.set_pixel_range(cfg.min_pixels, cfg.max_pixels)
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(policy)
    if cfg.freeze_vision:
        freeze_vision(policy)
    if cfg.freeze:
        freeze_parts(policy, cfg.freeze)
    if cfg.lora.r > 0 and not is_lora(policy):
        apply_lora(
            policy,
            r=cfg.lora.r,
            alpha=cfg.lora.alpha,
            dropout=cfg.lora.dropout,
            target_modules=cfg.lora.target_modules,
            vision=cfg.lora.vision,
            seed=cfg.seed,
        )
    return policy
