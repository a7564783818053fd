"""Vision helpers: image sizing agrees with transformers and qwen-vl-utils; images come out of messages in order."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as transformers_smart_resize

from mmrl.policy import vision
from mmrl.policy.vision import extract_images, smart_resize, to_pil

# Every side is over half of the largest factor: see the transformers test for what happens below that.
SIDES = (17, 20, 27, 28, 29, 56, 100, 112, 128, 224, 333, 500, 1000, 1999, 4000)
LIMITS = (  # (factor, min_pixels, max_pixels): Qwen2-VL's defaults, the tiny Qwen3-VL's, and a tight budget
    (28, 56 * 56, 28 * 28 * 1280),
    (32, 64 * 64, 512 * 512),
    (28, 28 * 28 * 4, 28 * 28 * 16),
)


@pytest.fixture
def local_smart_resize(monkeypatch):
    """`smart_resize` with qwen-vl-utils hidden, so the module's own code runs even where qwen-vl-utils imports."""
    monkeypatch.setattr(vision, "_qwen_vl_utils", None)
    return smart_resize


def grid(sides=SIDES):
    for (height, width), (factor, lo, hi) in itertools.product(itertools.product(sides, sides), LIMITS):
        if max(height, width) / min(height, width) <= 200:
            yield height, width, factor, lo, hi


def test_smart_resize_agrees_with_transformers(local_smart_resize):
    """The processor that really resizes our images is transformers'; the sizes must match it over the grid.

    transformers' copy drops the `max(factor, ...)` floor qwen-vl-utils puts on the first rounding, which matters
    only for a side of at most factor / 2 (rounded to 0 there, to one factor here), so the grid starts above it.
    """
    checked = 0
    for height, width, factor, lo, hi in grid():
        want = transformers_smart_resize(height, width, factor=factor, min_pixels=lo, max_pixels=hi)
        got = local_smart_resize(height, width, factor=factor, min_pixels=lo, max_pixels=hi)
        assert got == want, f"{height}x{width} factor {factor} pixels [{lo}, {hi}]: {got} != {want}"
        checked += 1
    assert checked > 500


def test_smart_resize_meets_its_contract(local_smart_resize):
    for height, width, factor, lo, hi in grid():
        h, w = local_smart_resize(height, width, factor=factor, min_pixels=lo, max_pixels=hi)
        assert h % factor == 0 and w % factor == 0 and h >= factor and w >= factor
        assert h * w >= lo, f"{height}x{width} -> {h}x{w}"
        if min(h, w) > factor:  # a side held at one factor may leave a very long image over budget
            assert h * w <= hi, f"{height}x{width} -> {h}x{w}"


def test_smart_resize_refuses_extreme_aspect_ratios(local_smart_resize):
    with pytest.raises(ValueError, match="aspect ratio"):
        local_smart_resize(10, 2010)


@pytest.mark.skipif(
    not vision.HAS_QWEN_VL_UTILS,
    reason="qwen-vl-utils imports torchvision at its top; torchvision has no CPU build (GPU installs only)",
)
def test_smart_resize_agrees_with_qwen_vl_utils(local_smart_resize):
    qwen_vl_utils = pytest.importorskip("qwen_vl_utils", reason="qwen-vl-utils needs torchvision")
    # qwen-vl-utils keeps a side shorter than factor / 2 at one factor, as this module does: include such sides.
    for height, width, factor, lo, hi in grid(sides=(1, 5, 13, 14, *SIDES)):
        want = tuple(qwen_vl_utils.smart_resize(height, width, factor=factor, min_pixels=lo, max_pixels=hi))
        got = local_smart_resize(height, width, factor=factor, min_pixels=lo, max_pixels=hi)
        if min(want) == 0:  # qwen-vl-utils 0.0.14 floors the short side of a long thin image to 0 px under a
            assert got == tuple(v or factor for v in want)  # tight budget; an image needs one patch row at least
            continue
        assert got == want, f"{height}x{width} factor {factor} pixels [{lo}, {hi}]: {got} != {want}"


def test_smart_resize_matches_what_the_tiny_processor_produces(tiny_policy):
    """The patch grid the image processor emits is the smart_resize size divided into 14 px patches."""
    processor = tiny_policy("qwen2_vl").processor.image_processor
    gen = np.random.default_rng(0)
    for height, width in ((60, 90), (112, 112), (200, 57)):
        image = Image.fromarray(gen.integers(0, 256, (height, width, 3), dtype=np.uint8))
        grid_thw = processor(images=[image], return_tensors="pt")["image_grid_thw"][0].tolist()
        h, w = smart_resize(height, width, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
        assert grid_thw == [1, h // 14, w // 14]


def test_extract_images_keeps_the_order_of_appearance():
    red, green, blue = (np.full((4, 4, 3), c, dtype=np.uint8) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255)))
    messages = [
        {"role": "system", "content": "You look at pictures."},
        {"role": "user", "content": [{"type": "image", "image": red}, {"type": "text", "text": "and"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {"role": "user", "content": [{"image": torch.from_numpy(green)}, {"type": "image", "image": blue}]},
    ]
    images = extract_images(messages)
    assert [img.getpixel((0, 0)) for img in images] == [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    assert all(img.mode == "RGB" for img in images)


def test_extract_images_refuses_an_image_entry_without_an_image():
    with pytest.raises(ValueError, match="no image"):
        extract_images([{"role": "user", "content": [{"type": "image"}]}])


def test_to_pil_accepts_uint8_tensors_arrays_and_pil_images():
    array = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    for image in (array, torch.from_numpy(array), Image.fromarray(array).convert("RGBA")):
        out = to_pil(image)
        assert out.mode == "RGB" and out.size == (3, 2)
        np.testing.assert_array_equal(np.asarray(out), array)


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((4, 4, 3), dtype=np.float32),  # floats in [0, 1] would silently turn black
        torch.zeros(4, 4, 3, dtype=torch.int64),
        np.zeros((4, 4), dtype=np.uint8),  # no channel axis
        np.zeros((3, 4, 4), dtype=np.uint8),  # channels first
        np.zeros((4, 4, 4), dtype=np.uint8),  # RGBA as an array
    ],
)
def test_to_pil_refuses_anything_but_uint8_hwc_rgb(bad):
    with pytest.raises(ValueError, match="uint8"):
        to_pil(bad)
