"""Policies: a Hugging Face VLM behind generate / logprobs verbs."""

from .processing import VisionTextProcessor
from .tiny import TINY_ARCHS, build_tiny
from .vlm import Rollout, Sampling, VLMPolicy, completion_mask_from_ids, masked_images, token_logprobs

__all__ = [
    "TINY_ARCHS",
    "Rollout",
    "Sampling",
    "VLMPolicy",
    "VisionTextProcessor",
    "build_tiny",
    "completion_mask_from_ids",
    "masked_images",
    "token_logprobs",
]
