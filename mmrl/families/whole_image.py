"""Whole-image layouts: Gemma 3, PaliGemma and Gemma 4.

Each image is one `pixel_values` unit. Gemma 3 and PaliGemma resize it to the vision tower's fixed size and read it
as a fixed number of soft tokens (Gemma 3's `mm_tokens_per_image`, PaliGemma's `image_seq_length`); Gemma 4 keeps its
aspect ratio within a budget of patches, so its soft tokens follow its size, and pads its patch rows to the budget.
"""

from __future__ import annotations

import torch
from PIL import Image

from .core import Family, Vision, VLLMFacts, tokens_per_unit

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


# Gemma 3 (google/gemma-3-4b-it model card; the chat template's <start_of_turn>user / model turns). It has no
# documented box format; PaliGemma's <locYYYY> tokens are 0-1023 bins, and Gemma 3 prompts in the wild ask for
# 0-1000 boxes, which is what we use.
GEMMA3 = Family(
    name="gemma3",
    image_token="<image_soft_token>",
    template_image="<start_of_image>",
    vision=_gemma3_vision,
    features=tokens_per_unit("image_seq_length"),
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


# ---------------------------------------------------------------------------------------------- Gemma 4


def _gemma4_vision(image_processor, images: list[Image.Image], settings: dict, per_row=None) -> Vision:
    """Gemma 4: each image resized, aspect ratio kept, to the largest size whose patches fit the budget
    (`max_soft_tokens` x `pooling_kernel_size`^2) with sides multiples of `pooling_kernel_size` x `patch_size`;
    `pixel_values` `[I, budget, 3*p*p]` (its patch rows, zero-padded to the budget) and `image_position_ids`
    `[I, budget, 2]` (each patch's column and row, -1 on padding); each image's patches pooled k x k into its soft
    tokens, written `<|image>` + `<|image|>` x tokens + `<image|>` in place of the template's `<|image|>`
    (`Gemma4Processor.replace_image_token`)."""
    out = image_processor(images=images, return_tensors="pt")
    tokens = torch.as_tensor(out["num_soft_tokens_per_image"], dtype=torch.long).reshape(-1)
    return Vision(
        pixel_values=out["pixel_values"],
        units=torch.ones(len(images), dtype=torch.long),
        per_image={"image_position_ids": out["image_position_ids"]},
        per_unit={},
        tokens=tokens,
        texts=["<|image>" + "<|image|>" * int(n) + "<image|>" for n in tokens],
    )


def _gemma4_features(units: torch.Tensor, per_image: dict, settings: dict, image_processor=None) -> torch.Tensor:
    real = (per_image["image_position_ids"] >= 0).all(-1).sum(-1)  # [I] patches that are not padding
    return real // int(image_processor.pooling_kernel_size) ** 2


# Gemma 4 (google/gemma-4-E2B-it; the Gemma 4 prompt-formatting guide: `<|turn>user` / `<|turn>model` turns closed by
# `<turn|>`, `<|image|>` where an image's soft tokens go, between `<|image>` and `<image|>`). Its EOS tokens are
# `<eos>`, `<turn|>` and `<|tool_response>` (generation_config.json). Its forward takes the image marks as
# `mm_token_type_ids` (bidirectional attention within an image on sliding-window layers where the checkpoint asks for
# it, `use_bidirectional_attention="vision"`). No box format is documented in a model card; Gemini's is 0-1000
# (as [y0, x0, y1, x1]), and "0-1000" (in the x0, y0, x1, y1 order our parsers read) is our choice, not confirmed.
GEMMA4 = Family(
    name="gemma4",
    image_token="<|image|>",
    template_image="<|image|>",
    vision=_gemma4_vision,
    features=_gemma4_features,
    turn_start="<|turn>",
    turn_end="<turn|>",
    coordinates="0-1000",
    suppress=("<|image>", "<image|>", "<|audio|>"),
    vllm=VLLMFacts(
        refused="no run of vLLM here has checked what it samples for Gemma 4 against the training forward (there is "
        "no vLLM in the main install, and the engine venv's tests do not cover it)"
    ),
)
