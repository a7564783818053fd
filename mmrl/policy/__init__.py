"""Policies: a Hugging Face VLM behind generate / logprobs verbs."""

from ..types import Completions, Rollout, Sampling, cat_rollouts
from .engines.backends import BACKENDS, GenerationBackend
from .lora import (
    apply_lora,
    apply_model_options,
    enable_gradient_checkpointing,
    find_vision_modules,
    freeze_vision,
    is_lora,
    merge_lora,
)
from .tokens import GenerationTarget, ModelHolder, completion_mask_from_ids, token_logprobs
from .vlm import VLMPolicy
from .vlm.action_codec import ActionCodec, add_action_tokens
from .vlm.processing import VisionTextProcessor
from .vlm.tiny import ALL_TINY_ARCHS, FAMILY_ARCHS, TINY_ARCHS, build_tiny

__all__ = [
    "BACKENDS",
    "ActionCodec",
    "Completions",
    "GenerationBackend",
    "GenerationTarget",
    "ModelHolder",
    "TINY_ARCHS",
    "FAMILY_ARCHS",
    "ALL_TINY_ARCHS",
    "Rollout",
    "Sampling",
    "VLMPolicy",
    "VisionTextProcessor",
    "add_action_tokens",
    "apply_lora",
    "apply_model_options",
    "build_tiny",
    "cat_rollouts",
    "completion_mask_from_ids",
    "enable_gradient_checkpointing",
    "find_vision_modules",
    "freeze_vision",
    "is_lora",
    "merge_lora",
    "token_logprobs",
]
