"""Policies: a Hugging Face VLM behind generate / logprobs verbs."""

from .action_codec import ActionCodec, add_action_tokens
from .processing import VisionTextProcessor
from .tiny import TINY_ARCHS, build_tiny
from .vlm import Rollout, Sampling, VLMPolicy, cat_rollouts, completion_mask_from_ids, masked_images, token_logprobs

__all__ = [
    "ActionCodec",
    "TINY_ARCHS",
    "Rollout",
    "Sampling",
    "VLMPolicy",
    "VisionTextProcessor",
    "add_action_tokens",
    "build_tiny",
    "cat_rollouts",
    "completion_mask_from_ids",
    "masked_images",
    "token_logprobs",
]
