"""Tiny real models built offline from the files in assets/ (no model hub).

The architectures are the real `transformers` classes (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) at about 1 M parameters,
with the locally trained tokenizer in assets/tokenizer. `scripts/make_assets.py` writes those files.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

from .processing import VisionTextProcessor
from .vlm import VLMPolicy

ASSETS = Path(__file__).resolve().parents[2] / "assets"
TINY_ARCHS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def tiny_processor(arch: str = "qwen2_vl") -> VisionTextProcessor:
    tokenizer = AutoTokenizer.from_pretrained(ASSETS / "tokenizer")
    image_processor = AutoImageProcessor.from_pretrained(ASSETS / "tiny_models" / arch)
    return VisionTextProcessor(tokenizer, image_processor)


def build_tiny(arch: str = "qwen2_vl", seed: int = 0, **policy_kwargs) -> VLMPolicy:
    """A randomly initialised tiny model of `arch`, the same for the same seed."""
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {', '.join(TINY_ARCHS)}")
    config = AutoConfig.from_pretrained(ASSETS / "tiny_models" / arch)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config)
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    return VLMPolicy(model, tiny_processor(arch), **policy_kwargs)
