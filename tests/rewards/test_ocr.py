"""OCR: RapidOCR reads text drawn with PIL, and the word-F1 reward scores it."""

from __future__ import annotations

import pytest
import torch

from rewards.ocr import ocr_similarity, ocr_text, text_f1, words


def test_text_f1_by_hand():
    predictions = ["Hello world", "hello hello world", "", "", "cats"]
    targets = ["hello, World!", "hello world", "", "something", "dogs"]
    # Row 2: common = min(2, 1) hello + 1 world = 2; precision 2/3, recall 2/2 -> F1 = 0.8.
    torch.testing.assert_close(text_f1(predictions, targets), torch.tensor([1.0, 0.8, 1.0, 0.0, 0.0]))
    assert words("Revenue (2024), EUR") == ["revenue", "2024", "eur"]
    with pytest.raises(ValueError):
        text_f1(["a"], [])


@pytest.fixture(scope="module")
def text_images() -> torch.Tensor:
    pytest.importorskip("rapidocr_onnxruntime")
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.truetype("DejaVuSans.ttf", 28)
    except OSError:
        pytest.skip("the DejaVu Sans font is not installed")
    image = Image.new("RGB", (256, 96), "white")
    draw = ImageDraw.Draw(image)
    draw.text((10, 10), "Hello World", fill="black", font=font)
    draw.text((10, 52), "Revenue 2024", fill=(40, 40, 160), font=font)
    blank = Image.new("RGB", (256, 96), "white")
    pixels = [torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8).view(96, 256, 3) for im in (image, blank)]
    return torch.stack(pixels)  # [2, H, W, 3]


def test_ocr_reads_rendered_text(text_images):
    texts = ocr_text(text_images)
    assert words(texts[0]) == ["hello", "world", "revenue", "2024"], texts
    assert texts[1] == ""
    scores = ocr_similarity(text_images[:1], ["Hello world, revenue 2025"])  # 3 of 4 words on each side
    torch.testing.assert_close(scores, torch.tensor([0.75]))
