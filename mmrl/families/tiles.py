"""Tiled layouts: Idefics3 (SmolVLM v1) and SmolVLM2, InternVL, LLaVA-OneVision.

An image becomes several crops of the vision tower's fixed size, each a `pixel_values` unit: Idefics3's grid of tiles
plus a global view, InternVL's tiles plus a thumbnail, LLaVA-OneVision's "anyres" grid plus a base view (one padded
tile an image when a prompt holds several). Each family's processor writes the tiles' placeholder text its own way.
"""

from __future__ import annotations

import math

import torch
from PIL import Image

from .core import Family, Vision, VLLMFacts, tokens_per_unit

# ---------------------------------------------------------------------------------------------- Idefics3 / SmolVLM


def _idefics3_vision(image_processor, images: list[Image.Image], settings: dict, per_row=None) -> Vision:
    """Idefics3 (SmolVLM v1): each image is split into rows x cols tiles plus a global view (one tile when not
    split); `pixel_values` `[tiles, 3, H, W]` with `pixel_attention_mask` `[tiles, H, W]`; each tile is
    `image_seq_len` `<image>` tokens, framed by `<fake_token_around_image>` and `<row_r_col_c>`/`<global-img>` tags
    as `Idefics3Processor.replace_image_token` writes them."""
    if not images:
        raise ValueError("no images")
    out = image_processor(images=[[image] for image in images], return_tensors="pt", return_row_col_info=True)
    seq = int(settings["image_seq_len"])
    rows = [r[0] for r in out["rows"]]
    cols = [c[0] for c in out["cols"]]
    units = torch.tensor([r * c + 1 if r or c else 1 for r, c in zip(rows, cols)], dtype=torch.long)
    keep = torch.arange(out["pixel_values"].shape[1]).unsqueeze(0) < units.unsqueeze(1)  # [I, Nmax] real tiles
    texts = []
    for r, c in zip(rows, cols):
        glob = "<fake_token_around_image><global-img>" + "<image>" * seq + "<fake_token_around_image>"
        if not (r or c):
            texts.append(glob)
            continue
        text = ""
        for i in range(r):
            text += "".join(f"<fake_token_around_image><row_{i + 1}_col_{j + 1}>" + "<image>" * seq for j in range(c))
            text += "\n"
        texts.append(text + "\n" + glob)
    return Vision(
        pixel_values=out["pixel_values"][keep],
        units=units,
        per_image={},
        per_unit={"pixel_attention_mask": out["pixel_attention_mask"][keep]},
        tokens=units * seq,
        texts=texts,
    )


def _idefics3_like(name: str, vllm: VLLMFacts | None = None) -> Family:
    return Family(
        name=name,
        image_token="<image>",
        template_image="<image>",
        vision=_idefics3_vision,
        features=tokens_per_unit("image_seq_len"),
        turn_start="<|im_start|>",
        turn_end="<end_of_utterance>",
        coordinates="0-1",
        batched_pixels=True,
        suppress=("<fake_token_around_image>", "<global-img>"),
        vllm=vllm or VLLMFacts(),
    )


# Idefics3 / SmolVLM (HuggingFaceTB/SmolVLM-Instruct chat template: "User:"/"Assistant:" turns closed by
# <end_of_utterance>). SmolVLM's grounding data (and Idefics3's) writes boxes relative, 0-1.
IDEFICS3 = _idefics3_like("idefics3")
# SmolVLM2 (SmolVLMForConditionalGeneration): Idefics3's image layout and prompt strings
# (`SmolVLMProcessor.replace_image_token` writes the same tiles and tags), its own model classes.
# vLLM builds transformers' SmolVLMProcessor, which imports num2words (for video frame timestamps).
SMOLVLM = _idefics3_like("smolvlm", VLLMFacts(modules=("num2words",)))


# ---------------------------------------------------------------------------------------------- InternVL


def _internvl_vision(image_processor, images: list[Image.Image], settings: dict, per_row=None) -> Vision:
    """InternVL: each image cropped to tiles plus a thumbnail (`crop_to_patches`, which `InternVLProcessor` turns
    on), `pixel_values` `[tiles, 3, H, W]`; an image is `<img>` + `<IMG_CONTEXT>` x (image_seq_length x tiles) +
    `</img>` in place of the template's `<IMG_CONTEXT>` (`InternVLProcessor.replace_image_token`)."""
    out = image_processor(images=images, crop_to_patches=True, return_tensors="pt")
    units = torch.as_tensor(out["num_patches"], dtype=torch.long).reshape(-1)
    seq = int(settings["image_seq_length"])
    return Vision(
        pixel_values=out["pixel_values"],
        units=units,
        per_image={},
        per_unit={},
        tokens=units * seq,
        texts=["<img>" + "<IMG_CONTEXT>" * (seq * int(n)) + "</img>" for n in units],
    )


# InternVL 3 (OpenGVLab/InternVL3-1B-hf: Qwen2.5's <|im_start|> / <|im_end|> turns). InternVL writes boxes as
# <box>[[x1, y1, x2, y2]]</box> normalised to 0-1000 (InternVL2 / 3 model cards, "grounding").
INTERNVL = Family(
    name="internvl",
    image_token="<IMG_CONTEXT>",
    template_image="<IMG_CONTEXT>",
    vision=_internvl_vision,
    features=tokens_per_unit("image_seq_length"),
    turn_start="<|im_start|>",
    turn_end="<|im_end|>",
    coordinates="0-1000",
    suppress=("<img>", "</img>"),
)


# ---------------------------------------------------------------------------------------------- LLaVA-OneVision


def _onevision_tiles(size: tuple[int, int], image_processor) -> int:
    """Tiles of a lone image: its anyres grid (the best of the grid pinpoints for its size) plus the base view."""
    from transformers.image_processing_utils import select_best_resolution

    tile = int(image_processor.size["height"])
    height, width = select_best_resolution(list(size), image_processor.image_grid_pinpoints)
    return (height // tile) * (width // tile) + 1


def _onevision_tokens(size: tuple[int, int], multi: bool, settings: dict, image_processor) -> int:
    """`LlavaOnevisionProcessor.replace_image_token`'s count: base features, then (a lone image) the unpadded grid
    features with one newline per row, pooled down past `anyres_max_N` tiles; (several images) base + 1 newline."""
    from transformers.image_processing_utils import select_best_resolution

    base = int(settings["num_image_tokens"])
    drop = 1 if settings.get("vision_feature_select_strategy") == "default" else 0
    if multi:
        return base + 1 - drop
    height, width = (int(v) for v in size)
    tile = int(image_processor.size["height"])
    best_height, best_width = select_best_resolution([height, width], image_processor.image_grid_pinpoints)
    side = int(math.sqrt(base))
    current_height, current_width = side * (best_height // tile), side * (best_width // tile)
    if width / height > current_width / current_height:
        new_height = int(round(height * (current_width / width), 7))
        current_height -= (current_height - new_height) // 2 * 2
    else:
        new_width = int(round(width * (current_height / height), 7))
        current_width -= (current_width - new_width) // 2 * 2
    unpadded, newlines = current_height * current_width, current_height
    most = int(settings.get("vision_aspect_ratio", "anyres_max_9").removeprefix("anyres_max_"))
    ratio = math.sqrt(current_height * current_width / (most * side**2))
    if ratio > 1.1:
        unpadded = int(current_height // ratio) * int(current_width // ratio)
        newlines = int(current_height // ratio)
    return unpadded + newlines + base - drop


def _onevision_vision(image_processor, images: list[Image.Image], settings: dict, per_row=None) -> Vision:
    """LLaVA-OneVision: a prompt's lone image is tiled "anyres" (its grid's tiles after a base view), each image of
    a prompt with several is one padded-square tile; `pixel_values` `[tiles, 3, H, W]` (the real tiles, padding
    dropped), `image_sizes` `[I, 2]` (original sizes) and `prompt_images` `[I]` (the images of its prompt)."""
    per_row = list(per_row) if per_row is not None else [len(images)]
    groups, start = [], 0
    for n in per_row:
        groups.append(images[start : start + n])
        start += n
    out = image_processor(images=[g for g in groups if g], return_tensors="pt")
    prompt_images = torch.tensor([n for n in per_row for _ in range(n)], dtype=torch.long)
    multi = prompt_images != 1
    sizes = out["image_sizes"].long()
    units = torch.tensor(
        [1 if m else _onevision_tiles(tuple(s.tolist()), image_processor) for s, m in zip(sizes, multi)],
        dtype=torch.long,
    )
    keep = torch.arange(out["pixel_values"].shape[1]).unsqueeze(0) < units.unsqueeze(1)  # [I, Pmax] real tiles
    tokens = torch.tensor(
        [_onevision_tokens(tuple(s.tolist()), bool(m), settings, image_processor) for s, m in zip(sizes, multi)],
        dtype=torch.long,
    )
    return Vision(
        pixel_values=out["pixel_values"][keep],
        units=units,
        per_image={"image_sizes": sizes, "prompt_images": prompt_images},
        per_unit={},
        tokens=tokens,
        texts=["<image>" * int(n) for n in tokens],
    )


def _onevision_features(units: torch.Tensor, per_image: dict, settings: dict, image_processor=None) -> torch.Tensor:
    sizes, counts = per_image["image_sizes"].tolist(), per_image["prompt_images"].tolist()
    return torch.tensor(
        [_onevision_tokens(tuple(s), n != 1, settings, image_processor) for s, n in zip(sizes, counts)],
        dtype=torch.long,
    )


def _onevision_forward_inputs(per_image: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`image_sizes` as stored, and `batch_num_images` (the images of each prompt, which the forward reads to tell a
    lone, tiled image from one of several) from each image's `prompt_images`."""
    counts, images = [], per_image["prompt_images"].tolist()
    first = 0
    while first < len(images):
        counts.append(images[first])
        first += max(images[first], 1)
    sizes = per_image["image_sizes"]
    return {"image_sizes": sizes, "batch_num_images": torch.tensor(counts, dtype=torch.long, device=sizes.device)}


# LLaVA-OneVision (llava-hf/llava-onevision-qwen2-0.5b-ov-hf: Qwen2's <|im_start|> / <|im_end|> turns, images
# before a message's text). Its grounding data (LLaVA-OneVision's, from LLaVA-1.5) writes boxes relative, 0-1.
LLAVA_ONEVISION = Family(
    name="llava_onevision",
    image_token="<image>",
    template_image="<image>",
    vision=_onevision_vision,
    features=_onevision_features,
    turn_start="<|im_start|>",
    turn_end="<|im_end|>",
    coordinates="0-1",
    forward_inputs=_onevision_forward_inputs,
    # vLLM's LLaVA-OneVision tiles every image "anyres" as a lone one; transformers' (and the training forward)
    # shows each image of a prompt with several as one base view: two-image prompts would differ.
    vllm=VLLMFacts(max_images=1),
)
