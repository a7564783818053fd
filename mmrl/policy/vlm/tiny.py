"""Tiny real models built offline from the files in assets/ (no model hub).

The architectures are the real `transformers` classes at about 0.2-1 M parameters: Qwen2-VL, Qwen2.5-VL and Qwen3-VL
with the locally trained tokenizer in assets/tokenizer and each its family's released chat template from its folder
(`TINY_ARCHS`, written by `scripts/make_assets.py`), and the
other families (`FAMILY_ARCHS`: Gemma 3, Idefics3 / SmolVLM, SmolVLM2, Qwen3.5, PaliGemma, InternVL,
LLaVA-OneVision, GLM-4.1V, Gemma 4), each a folder laid out as the hub's less the weights,
with its own tokenizer, special tokens and chat template (`scripts/make_family_assets.py`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

from ...families import family_for
from .processing import VisionTextProcessor

ASSETS = Path(__file__).resolve().parents[3] / "assets"
TINY_ARCHS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")  # the Qwen-VL family, sharing assets/tokenizer
FAMILY_ARCHS = (
    "gemma3",
    "idefics3",
    "smolvlm",
    "qwen3_5",
    "paligemma",
    "internvl",
    "llava_onevision",
    "glm4v",
    "gemma4",
)  # one self-contained folder each
ALL_TINY_ARCHS = TINY_ARCHS + FAMILY_ARCHS


def tiny_processor(arch: str = "qwen2_vl") -> VisionTextProcessor:
    folder = ASSETS / "tiny_models" / arch
    if arch in FAMILY_ARCHS:
        return VisionTextProcessor.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(ASSETS / "tokenizer")
    tokenizer.chat_template = (folder / "chat_template.jinja").read_text()  # the family's own (Qwen3-VL's differs)
    image_processor = AutoImageProcessor.from_pretrained(folder)
    return VisionTextProcessor(tokenizer, image_processor, arch)


def tiny_model(arch: str = "qwen2_vl", seed: int = 0) -> tuple:
    """A randomly initialised tiny model of `arch` and its processor, the same for the same seed (`VLMPolicy.tiny`,
    `build_tiny`)."""
    if arch not in ALL_TINY_ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {', '.join(ALL_TINY_ARCHS)}")
    family_for(arch)  # a clear error where this transformers lacks the family's classes
    config = AutoConfig.from_pretrained(ASSETS / "tiny_models" / arch)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config)
        # Gemma 3 initialises its vision-to-text projection to zero (checkpoints carry trained weights): a random
        # tiny model would then ignore its images. Any weight matrix left all zero is drawn like the others.
        std = getattr(config.text_config, "initializer_range", 0.02)
        with torch.no_grad():
            for weight in model.parameters():
                if weight.dim() >= 2 and not weight.any():
                    weight.normal_(0.0, std)
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    return model, tiny_processor(arch)
