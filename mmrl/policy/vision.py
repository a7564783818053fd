"""Image sizing for Qwen-family vision towers, and images pulled out of chat messages.

`qwen-vl-utils` provides these, but it imports torchvision at its top and there is no CPU build of torchvision
on the package index (the one there is a CUDA build that fails to import beside the CPU torch). We use it where it
imports and these equivalents where it does not; tests check the two agree where both run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from sim.tasks.records import fit_pixels

try:  # pragma: no cover - exercised only where torchvision works (GPU installs)
    import qwen_vl_utils as _qwen_vl_utils
except Exception:  # ImportError, or torchvision's own import errors on a CPU torch
    _qwen_vl_utils = None

HAS_QWEN_VL_UTILS = _qwen_vl_utils is not None


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280
):
    """The (height, width) a Qwen-VL processor resizes an image to.

    Both sides become multiples of `factor` (patch size x merge size), the area is brought within
    [min_pixels, max_pixels], and the aspect ratio is kept as closely as that allows.
    """
    if _qwen_vl_utils is not None:
        return _qwen_vl_utils.smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    w_bar, h_bar = fit_pixels(width, height, factor, min_pixels, max_pixels)  # the dataset env's copy (sim)
    return h_bar, w_bar


def to_pil(image: torch.Tensor | np.ndarray | Image.Image) -> Image.Image:
    """A PIL RGB image from a uint8 `[H, W, 3]` tensor or array, or a PIL image."""
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, torch.Tensor):
        image = image.detach().cpu().numpy()
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"expected a uint8 [H, W, 3] image, got {image.dtype} {tuple(image.shape)}")
    return Image.fromarray(image, mode="RGB")


def extract_images(messages: list[dict[str, Any]]) -> list[Image.Image]:
    """The images of a chat conversation in order of appearance (`{"type": "image", "image": ...}` entries)."""
    images = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            continue
        for part in content:
            if part.get("type") == "image" or "image" in part:
                if part.get("image") is None:
                    raise ValueError("an image entry in the messages carries no image")
                images.append(to_pil(part["image"]))
    return images
