"""Patch-grid layouts: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 and GLM-4.xV.

Each image is resized onto a grid of vision patches within a pixel budget (Qwen-VL's `smart_resize`), and every
`pixel_values` row is one patch; an image's tokens are its grid's patches merged `merge_size`^2 to one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from PIL import Image

from .core import Family, Vision, VLLMFacts


def _grid_vision(token: str) -> Callable[[Any, list[Image.Image], dict, list[int] | None], Vision]:
    """Qwen2-VL / 2.5-VL / 3-VL (and GLM-4.xV, which shares their vision layout): `pixel_values`
    `[patches, C*T*p*p]`, `image_grid_thw` `[I, 3]`; an image is `t*h*w / merge**2` `token`s (Qwen's template writes
    one `<|image_pad|>` between `<|vision_start|>`/`<|vision_end|>`, GLM's one `<|image|>` between
    `<|begin_of_image|>`/`<|end_of_image|>`)."""

    def vision(image_processor, images: list[Image.Image], settings: dict, per_row=None) -> Vision:
        out = image_processor(images=images, return_tensors="pt")
        grid = out["image_grid_thw"]  # [I, 3]
        merge = int(getattr(image_processor, "merge_size", 2))
        tokens = grid.prod(-1) // merge**2
        return Vision(
            pixel_values=out["pixel_values"],
            units=grid.prod(-1),
            per_image={"image_grid_thw": grid},
            per_unit={},
            tokens=tokens,
            texts=[token * int(n) for n in tokens],
        )

    return vision


_QWEN_VISION = _grid_vision("<|image_pad|>")


def _grid_features(units: torch.Tensor, per_image: dict, settings: dict, image_processor=None) -> torch.Tensor:
    return per_image["image_grid_thw"].prod(-1) // int(settings.get("merge_size", 2)) ** 2


def _qwen(name: str, coordinates: str, vllm: VLLMFacts | None = None) -> Family:
    return Family(
        name=name,
        image_token="<|image_pad|>",
        template_image="<|image_pad|>",
        vision=_QWEN_VISION,
        features=_grid_features,
        turn_start="<|im_start|>",
        turn_end="<|im_end|>",
        coordinates=coordinates,
        mrope=True,
        patch_rows=True,
        pixel_bounds=True,
        vllm=vllm or VLLMFacts(),
    )


# Qwen2-VL answers boxes in 0-1000 relative coordinates; Qwen2.5-VL in absolute pixels of the resized image
# (Qwen2.5-VL technical report, sec. 2.2.1 "native resolution ... actual dimensions"); Qwen3-VL back to 0-1000
# (Qwen3-VL model card, "Grounding: relative coordinates 0-1000").
QWEN2_VL = _qwen("qwen2_vl", "0-1000")
QWEN2_5_VL = _qwen("qwen2_5_vl", "pixels")
QWEN3_VL = _qwen("qwen3_vl", "0-1000")
# Qwen3.5: Qwen3-VL's vision stack and tokens in a hybrid (Gated DeltaNet + attention) language model; its
# coordinates are taken as Qwen3-VL's 0-1000 (no Qwen3.5 model card documents them).
# vLLM's CPU build runs its Gated DeltaNet layers in bfloat16 only ("CPU GDN attention requires BF16"), and its
# kernel refuses head sizes 16 ("multiples of 32") and 32 ("Unexpected head dim size"); 64 and 128 ran.
QWEN3_5 = _qwen(
    "qwen3_5",
    "0-1000",
    VLLMFacts(
        cpu_dtypes=("bfloat16",),
        cpu_config=(("linear_key_head_dim", (64, 128)), ("linear_value_head_dim", (64, 128))),
    ),
)

# GLM-4.1V (zai-org/GLM-4.1V-9B-Thinking: `[gMASK]<sop>`, then `<|user|>` / `<|assistant|>` turns with no closing
# token: the model ends its answer with `<|user|>`, `<|observation|>` or `<|endoftext|>`, its EOS tokens), Qwen2-VL's
# vision layout and M-RoPE. Boxes `<|begin_of_box|>[x1, y1, x2, y2]<|end_of_box|>` relative, taken as 0-1000 (the
# GLM-V README's grounding examples).
GLM4V = Family(
    name="glm4v",
    image_token="<|image|>",
    template_image="<|image|>",
    vision=_grid_vision("<|image|>"),
    features=_grid_features,
    turn_start="<|user|>",
    turn_end="<|user|>",  # no closing token: an answer ends where the model opens the next turn (an EOS of its)
    coordinates="0-1000",
    mrope=True,
    patch_rows=True,
    pixel_bounds=True,
    suppress=("<|begin_of_image|>", "<|end_of_image|>"),
    # vLLM builds the text attention's q/k/v biases only where `text_config.attention_bias` says so (zai-org's
    # config.json does); transformers' Glm4vTextConfig has no such field (its attention always has them).
    vllm=VLLMFacts(engine_config=(("text_config.attention_bias", True),)),
)
