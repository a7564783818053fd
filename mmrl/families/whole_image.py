"""Whole-image layouts: Gemma 3 and PaliGemma.

Each image is one `pixel_values` unit, resized to the vision tower's fixed size and read as a fixed number of soft
tokens (Gemma 3's `mm_tokens_per_image`, PaliGemma's `image_seq_length`).
"""

from __future__ import annotations

import torch
from PIL import Image

from .core import Family, Vision, VLLMFacts

# vLLM's CPU attention (`CPUAttentionBackend`) has no `supports_mm_prefix`: image tokens attend causally there.
_CPU_CAUSAL = (
    "vLLM's CPU attention attends every token causally (it has no bidirectional `mm_prefix` attention), where {what}: "
    "its samples' log-probs would not be the training forward's (about 1e-2 apart on the tiny model; on a GPU vLLM's "
    "FlashAttention has it)"
)

# ---------------------------------------------------------------------------------------------- Gemma 3


def _gemma3_vision(image_processor, images: list[Image.Image], settings: dict, per_row=None) -> Vision:
    """Gemma 3: `pixel_values` `[I, 3, H, W]` (one unit an image, no pan-and-scan), each image a fixed
    `image_seq_length` soft tokens (`mm_tokens_per_image` of the config; 256 in the released checkpoints), written
    `\\n\\n<start_of_image>` + soft tokens + `<end_of_image>\\n\\n` in place of the template's `<start_of_image>`."""
    out = image_processor(images=images, return_tensors="pt", do_pan_and_scan=False)
    n = int(settings["image_seq_length"])
    count = len(images)
    text = "\n\n<start_of_image>" + "<image_soft_token>" * n + "<end_of_image>\n\n"
    return Vision(
        pixel_values=out["pixel_values"],
        units=torch.ones(count, dtype=torch.long),
        per_image={},
        per_unit={},
        tokens=torch.full((count,), n, dtype=torch.long),
        texts=[text] * count,
    )


def _gemma3_features(units: torch.Tensor, per_image: dict, settings: dict, image_processor=None) -> torch.Tensor:
    return units * int(settings["image_seq_length"])


# Gemma 3 (google/gemma-3-4b-it model card; the chat template's <start_of_turn>user / model turns). It has no
# documented box format; PaliGemma's <locYYYY> tokens are 0-1023 bins, and Gemma 3 prompts in the wild ask for
# 0-1000 boxes, which is what we use.
GEMMA3 = Family(
    name="gemma3",
    image_token="<image_soft_token>",
    template_image="<start_of_image>",
    vision=_gemma3_vision,
    features=_gemma3_features,
    turn_start="<start_of_turn>",
    turn_end="<end_of_turn>",
    coordinates="0-1000",
    suppress=("<start_of_image>", "<end_of_image>"),
    # vLLM re-merges the "\n\n" around each image with the newlines next to it by looking them up (gemma3_mm.py).
    vllm=VLLMFacts(
        vocab=("\n", "\n\n", "\n\n\n", "\n\n\n\n"),
        cpu=_CPU_CAUSAL.format(what="Gemma 3 attends each image's tokens bidirectionally"),
    ),
)


# ---------------------------------------------------------------------------------------------- PaliGemma


def _paligemma_prompt(tokenizer, content: list[dict]) -> str:
    """What `PaliGemmaProcessor` writes for a prefix with images: every image's `<image>` first, then `<bos>`, the
    prefix's text and a newline (`prepare_inputs_layout`); the model continues with the suffix."""
    images = sum(1 for item in content if item["type"] == "image")
    text = "".join(item["text"] for item in content if item["type"] == "text")
    return "<image>" * images + tokenizer.bos_token + text + "\n"


def _paligemma_vision(image_processor, images: list[Image.Image], settings: dict, per_row=None) -> Vision:
    """PaliGemma: `pixel_values` `[I, 3, H, W]`, each image `image_seq_length` `<image>` tokens (the image
    processor's attribute, as `PaliGemmaProcessor` reads it; 256 at 224 px)."""
    out = image_processor(images=images, return_tensors="pt")
    n = int(image_processor.image_seq_length)
    count = len(images)
    return Vision(
        pixel_values=out["pixel_values"],
        units=torch.ones(count, dtype=torch.long),
        per_image={},
        per_unit={},
        tokens=torch.full((count,), n, dtype=torch.long),
        texts=["<image>" * n] * count,
    )


def _paligemma_features(units: torch.Tensor, per_image: dict, settings: dict, image_processor=None) -> torch.Tensor:
    return units * int(image_processor.image_seq_length)


# PaliGemma (google/paligemma-3b-pt-224; transformers' PaliGemmaProcessor): no chat template; the processor
# writes `<image>` x N + <bos> + prefix + "\n" and the model answers with the suffix, the prefix (images and
# text) attended bidirectionally, positions from 1. A single-turn model: a conversation is refused. Its boxes
# are <locYYYY> tokens (1024 bins of y0 x0 y1 x1, big_vision's README), a format our grounding parsers do not
# read; "0-1000" is the nearest relative convention and is what the demo's prompts ask for.
PALIGEMMA = Family(
    name="paligemma",
    image_token="<image>",
    template_image="<image>",
    vision=_paligemma_vision,
    features=_paligemma_features,
    turn_start="<bos>",
    turn_end="<eos>",
    coordinates="0-1000",
    prompt=_paligemma_prompt,
    prefix_lm=True,
    first_position=1,
    # vLLM inserts `<image>` x N + `<bos>` at the prompt's start itself and appends a "\n" (paligemma.py), one image
    # a prompt.
    vllm=VLLMFacts(
        image="",
        after_images="<bos>",
        vocab=("\n",),
        max_images=1,
        cpu=_CPU_CAUSAL.format(what="PaliGemma attends its whole prefix (images and text) bidirectionally"),
    ),
)
