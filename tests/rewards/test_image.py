"""Image similarity rewards: hand-computed values on tiny images, SSIM against scikit-image, a tiny real CLIP."""

from __future__ import annotations

import pytest
import torch

from rewards import REWARDS
from rewards.image import (
    HFImageEncoder,
    code_length_reward,
    color_histogram_similarity,
    edge_similarity,
    embedding_similarity,
    grayscale,
    pixel_mse,
    pixel_similarity,
    ssim,
)


def solid(value: int | tuple[int, int, int], size: int = 8, rows: int = 1) -> torch.Tensor:
    color = torch.tensor(value if isinstance(value, tuple) else (value,) * 3, dtype=torch.uint8)
    return color.expand(rows, size, size, 3).clone()  # [R, H, W, 3]


def square(size: int = 32, lo: int = 8, hi: int = 24) -> torch.Tensor:
    image = solid(255, size)
    image[:, lo:hi, lo:hi] = 0
    return image  # [1, H, W, 3]: a black square on white


def test_registered_names():
    for name in ("pixel", "ssim", "edge", "color_histogram", "embedding", "code_length", "ocr"):
        assert name in REWARDS
    assert REWARDS.get("ssim") is ssim and REWARDS.get("pixel") is pixel_similarity


def test_pixel_metrics_by_hand():
    black, white = solid(0), solid(255)
    gray = solid(51)  # 0.2 on [0, 1]
    torch.testing.assert_close(pixel_mse(black, white), torch.tensor([1.0]))
    torch.testing.assert_close(pixel_similarity(black, white), torch.tensor([0.0]))
    torch.testing.assert_close(pixel_similarity(white, white), torch.tensor([1.0]))
    torch.testing.assert_close(pixel_mse(black, gray), torch.tensor([0.04]))
    # Half the pixels differ by 1.0 in one channel of three: MSE = 1/2 * 1/3.
    half = solid(0)
    half[:, :4, :, 0] = 255
    torch.testing.assert_close(pixel_mse(half, black), torch.tensor([1 / 6]))
    # uint8 and float inputs agree; a batch scores row by row.
    torch.testing.assert_close(pixel_mse(half.float() / 255, black.float() / 255), torch.tensor([1 / 6]))
    batch_a, batch_b = torch.cat([black, white, half]), torch.cat([white, white, black])
    torch.testing.assert_close(pixel_similarity(batch_a, batch_b), torch.tensor([0.0, 1.0, 5 / 6]))


def test_grayscale_uses_rec709_weights():
    red, green, blue = solid((255, 0, 0)), solid((0, 255, 0)), solid((0, 0, 255))
    torch.testing.assert_close(grayscale(red)[0, 0, 0], torch.tensor(0.2125))
    torch.testing.assert_close(grayscale(green)[0, 0, 0], torch.tensor(0.7154))
    torch.testing.assert_close(grayscale(blue.float() / 255)[0, 0, 0], torch.tensor(0.0721))


def test_ssim_by_hand():
    black, white = solid(0, 16), solid(255, 16)
    torch.testing.assert_close(ssim(square(), square()), torch.tensor([1.0]))
    # Constant images: variances and covariance are 0, so SSIM = (2 mx my + C1) / (mx^2 + my^2 + C1).
    # float32: E[x^2] - E[x]^2 leaves ~1e-7 of noise, against C2 = 9e-4, hence the tolerance.
    c1 = 0.01**2
    torch.testing.assert_close(ssim(black, white), torch.tensor([c1 / (1 + c1)]), atol=2e-4, rtol=0)
    expected = (2 * 0.2 + c1) / (0.04 + 1 + c1)
    torch.testing.assert_close(ssim(solid(51, 16), white), torch.tensor([expected]), atol=2e-4, rtol=0)
    # Inverting a pattern makes the covariance negative.
    assert ssim(square(), 255 - square()).item() < 0


def _structured(gen: torch.Generator) -> torch.Tensor:
    """Shapes, gradients and text-like strokes: what renders look like."""
    image = torch.full((64, 80, 3), 255, dtype=torch.uint8)
    image[10:30, 5:40] = torch.tensor([200, 30, 30], dtype=torch.uint8)
    yy, xx = torch.meshgrid(torch.arange(64), torch.arange(80), indexing="ij")
    circle = (yy - 40) ** 2 + (xx - 55) ** 2 < 15**2
    image[circle] = torch.tensor([20, 90, 220], dtype=torch.uint8)
    image[:, :, 1] = torch.maximum(image[:, :, 1], (xx * 3).clamp(max=255).to(torch.uint8))
    for row in range(45, 60, 4):
        image[row, 8:30] = 0
    noise = torch.randint(-12, 13, image.shape, generator=gen)
    return (image.int() + noise).clamp(0, 255).to(torch.uint8)


def test_ssim_matches_scikit_image():
    skimage_metrics = pytest.importorskip("skimage.metrics")
    gen = torch.Generator().manual_seed(0)
    noisy = torch.randint(0, 256, (3, 40, 56, 3), generator=gen, dtype=torch.uint8)
    blurred = (noisy.float() * 0.5 + 64 + torch.randn(noisy.shape, generator=gen) * 20).clamp(0, 255)
    structured = torch.stack([_structured(gen) for _ in range(3)])
    shifted = torch.roll(structured, shifts=(2, -3), dims=(1, 2))
    pairs = [
        (noisy, blurred.to(torch.uint8)),  # random
        (structured, shifted),  # structured, misaligned
        (structured, structured.flip(0)),  # structured, different
        (noisy[:, :11, :11], noisy.flip(0)[:, :11, :11]),  # smallest size scikit-image accepts (window 11)
    ]
    for a, b in pairs:
        ours = ssim(a, b)
        gray_a, gray_b = grayscale(a).double().numpy(), grayscale(b).double().numpy()
        expected = [
            skimage_metrics.structural_similarity(
                gray_a[i], gray_b[i], data_range=1.0, gaussian_weights=True, sigma=1.5, use_sample_covariance=False
            )
            for i in range(a.shape[0])
        ]
        torch.testing.assert_close(ours, torch.tensor(expected, dtype=torch.float32), atol=1e-3, rtol=0)


def test_ssim_grayscale_matches_scikit_image_rgb2gray():
    color = pytest.importorskip("skimage.color")
    image = _structured(torch.Generator().manual_seed(1))
    torch.testing.assert_close(grayscale(image[None])[0].double(), torch.from_numpy(color.rgb2gray(image.numpy())))


def test_ssim_batch_is_rowwise_and_permutes():
    gen = torch.Generator().manual_seed(2)
    a = torch.randint(0, 256, (9, 20, 20, 3), generator=gen, dtype=torch.uint8)  # more rows than one CPU chunk
    b = torch.randint(0, 256, (9, 20, 20, 3), generator=gen, dtype=torch.uint8)
    whole = ssim(a, b)
    one_by_one = torch.cat([ssim(a[i : i + 1], b[i : i + 1]) for i in range(9)])
    torch.testing.assert_close(whole, one_by_one)
    order = torch.randperm(9, generator=gen)
    torch.testing.assert_close(ssim(a[order], b[order]), whole[order])


def test_edge_similarity_by_hand():
    pytest.importorskip("cv2")
    blank = solid(255, 32)
    torch.testing.assert_close(edge_similarity(square(), square()), torch.tensor([1.0]))
    torch.testing.assert_close(edge_similarity(blank, blank), torch.tensor([1.0]))  # no edges on either side
    torch.testing.assert_close(edge_similarity(square(), blank), torch.tensor([0.0]))
    # A one-pixel shift is within the default tolerance; a far-away square shares no edge.
    shifted = torch.roll(square(), 1, dims=2)
    assert edge_similarity(square(), shifted).item() == pytest.approx(1.0)
    assert edge_similarity(square(), shifted, tolerance=0).item() < 0.9
    far = solid(255, 32)
    far[:, 26:30, 26:30] = 0
    torch.testing.assert_close(edge_similarity(square(lo=2, hi=8), far), torch.tensor([0.0]))


def test_color_histogram_by_hand():
    black, white = solid(0), solid(255)
    torch.testing.assert_close(color_histogram_similarity(black, white), torch.tensor([0.0]))
    torch.testing.assert_close(color_histogram_similarity(white, white), torch.tensor([1.0]))
    # Half black, half white against all white: each channel's histograms overlap in half the mass.
    half = solid(255)
    half[:, :4] = 0
    torch.testing.assert_close(color_histogram_similarity(half, white), torch.tensor([0.5]))
    # Position does not matter; only red differs in a red-vs-black image (G and B channels agree).
    torch.testing.assert_close(color_histogram_similarity(half, half.flip(1)), torch.tensor([1.0]))
    torch.testing.assert_close(color_histogram_similarity(solid((255, 0, 0)), black), torch.tensor([2 / 3]))


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="differ in shape"):
        ssim(solid(0, 8), solid(0, 9))
    with pytest.raises(ValueError, match=r"\[R, H, W, 3\]"):
        pixel_similarity(torch.zeros(2, 8, 8), torch.zeros(2, 8, 8))


def test_code_length_reward_by_hand():
    sources = ["x" * 10, "x" * 50, "x" * 100, "x" * 150, "x" * 400]
    # 1 - (max(0, L - 50) / 100)^2, clamped to [0, 1].
    torch.testing.assert_close(code_length_reward(sources, 100), torch.tensor([1.0, 1.0, 0.75, 0.0, 0.0]))
    lengths = torch.tensor([30.0, 30.0])
    torch.testing.assert_close(code_length_reward(lengths, torch.tensor([40.0, 60.0])), torch.tensor([0.9375, 1.0]))
    torch.testing.assert_close(code_length_reward(["x" * 100], 100, free_fraction=1.0), torch.tensor([1.0]))
    with pytest.raises(ValueError):
        code_length_reward(["x"], 0)


@pytest.fixture(scope="module")
def tiny_clip():
    transformers = pytest.importorskip("transformers")
    config = transformers.CLIPConfig(
        text_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "vocab_size": 64,
            "max_position_embeddings": 16,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 1,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        projection_dim=16,
    )
    torch.manual_seed(0)
    return transformers.CLIPModel(config).eval()


def test_embedding_similarity_with_tiny_clip(tiny_clip, tmp_path):
    encoder = HFImageEncoder(tiny_clip)
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(0, 256, (3, 48, 40, 3), generator=gen, dtype=torch.uint8)  # resized to the model's 32 px
    b = torch.randint(0, 256, (3, 48, 40, 3), generator=gen, dtype=torch.uint8)
    assert encoder(a).shape == (3, 16)
    torch.testing.assert_close(embedding_similarity(a, a, encoder), torch.ones(3))
    different = embedding_similarity(a, b, encoder)
    assert different.shape == (3,) and bool((different < 1 - 1e-4).all())
    # Row by row: permuting the pairs permutes the scores.
    order = torch.tensor([2, 0, 1])
    torch.testing.assert_close(embedding_similarity(a[order], b[order], encoder), different[order])
    # from_pretrained reads a saved checkpoint and its preprocessor settings.
    tiny_clip.save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text('{"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}')
    loaded = HFImageEncoder.from_pretrained(tmp_path)
    assert loaded.image_size == 32 and loaded.mean.tolist() == [0.5, 0.5, 0.5]
    torch.testing.assert_close(embedding_similarity(a, a, loaded), torch.ones(3))
