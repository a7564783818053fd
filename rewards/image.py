"""Image similarity rewards: batched tensor functions over pairs of images.

Every function takes two batches of the same shape, `[R, H, W, 3]`, either uint8 in [0, 255] or floating point in
[0, 1] (what `rewards.render` returns is uint8), and returns `[R]` float32 scores where higher means more alike.
Pairs are row by row: `images_a[i]` is compared with `images_b[i]`.

Greyscale, where a metric needs it, is Rec. 709 luma on the [0, 1] values, `0.2125 R + 0.7154 G + 0.0721 B`, the
weights of scikit-image's `rgb2gray`, so `ssim` here equals `skimage.metrics.structural_similarity` applied to
`rgb2gray` images.

Registered in `rewards.REWARDS` as `pixel`, `ssim`, `edge`, `color_histogram`, `embedding` and `code_length`.
Optional dependencies are imported inside the functions that need them: OpenCV for `edge_similarity`,
transformers for `HFImageEncoder`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F

from rewards.catalog import REWARDS

GRAY_WEIGHTS = (0.2125, 0.7154, 0.0721)
"""Rec. 709 luma weights, as scikit-image's `rgb2gray`."""

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _check_images(images: torch.Tensor) -> None:
    if images.dim() != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must be [R, H, W, 3], got {tuple(images.shape)}")


def as_float_images(images: torch.Tensor) -> torch.Tensor:
    """`[R, H, W, 3]` uint8 (0-255) or float (0-1) -> float32 in [0, 1]."""
    _check_images(images)
    if images.dtype == torch.uint8:
        return images.to(torch.float32) / 255.0
    if not images.is_floating_point():
        raise ValueError(f"images must be uint8 or floating point, got {images.dtype}")
    return images.to(torch.float32)


def as_uint8_images(images: torch.Tensor) -> torch.Tensor:
    """`[R, H, W, 3]` uint8 or float in [0, 1] -> uint8 (floats are clamped and rounded)."""
    if images.dtype == torch.uint8:
        return images
    return (as_float_images(images).clamp(0, 1) * 255).round().to(torch.uint8)


def grayscale(images: torch.Tensor) -> torch.Tensor:
    """Rec. 709 luma of `[R, H, W, 3]` images -> `[R, H, W]` float32 in [0, 1]."""
    weights = torch.tensor(GRAY_WEIGHTS, dtype=torch.float32, device=images.device)
    if images.dtype == torch.uint8:  # fold the 1/255 into the weights: one pass less over the pixels
        _check_images(images)
        return images.to(torch.float32) @ (weights / 255.0)  # [R, H, W]
    return as_float_images(images) @ weights  # [R, H, W]


def _pair(images_a: torch.Tensor, images_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if images_a.shape != images_b.shape:
        raise ValueError(f"image batches differ in shape: {tuple(images_a.shape)} and {tuple(images_b.shape)}")
    return as_float_images(images_a), as_float_images(images_b)


def pixel_mse(images_a: torch.Tensor, images_b: torch.Tensor) -> torch.Tensor:
    """Mean squared difference over pixels and channels, on [0, 1] values.

    Args:
        images_a: `[R, H, W, 3]` uint8 or float in [0, 1].
        images_b: `[R, H, W, 3]`, same shape.

    Returns:
        `[R]` float32 in [0, 1]: 0 for identical images, 1 for black against white.
    """
    a, b = _pair(images_a, images_b)
    return (a - b).square().flatten(1).mean(1)  # [R]


@REWARDS.register("pixel")
def pixel_similarity(images_a: torch.Tensor, images_b: torch.Tensor) -> torch.Tensor:
    """`1 - pixel_mse`: 1 for identical images, 0 for black against white.

    Args:
        images_a: `[R, H, W, 3]` uint8 or float in [0, 1].
        images_b: `[R, H, W, 3]`, same shape.

    Returns:
        `[R]` float32 in [0, 1].
    """
    return 1.0 - pixel_mse(images_a, images_b)  # [R]


def _gaussian_kernel(sigma: float, radius: int) -> torch.Tensor:
    x = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-0.5 * (x / sigma) ** 2)
    return (kernel / kernel.sum()).to(torch.float32)  # [2r+1], scipy.ndimage.gaussian_filter1d's weights


def _symmetric_index(n: int, radius: int) -> torch.Tensor:
    """Indices that pad a length-n axis by `radius` on each side, mirroring with the edge repeated (d c b a | a b c d).

    This is scipy.ndimage's mode "reflect" (numpy's "symmetric"), also for `radius > n`, where it keeps folding.
    """
    i = torch.arange(-radius, n + radius) % (2 * n)
    return torch.where(i < n, i, 2 * n - 1 - i)  # [n + 2r]


@REWARDS.register("ssim")
def ssim(
    images_a: torch.Tensor,
    images_b: torch.Tensor,
    *,
    sigma: float = 1.5,
    truncate: float = 3.5,
    k1: float = 0.01,
    k2: float = 0.03,
) -> torch.Tensor:
    """Structural similarity of the greyscale images, with a Gaussian window (Wang et al. 2004).

    The settings are scikit-image's `structural_similarity(a, b, data_range=1.0, gaussian_weights=True, sigma=1.5,
    use_sample_covariance=False)` (the Wang et al. choices): an 11 x 11 window (radius `int(truncate * sigma +
    0.5)` = 5), borders mirrored as scipy's "reflect", and the mean taken over the map without its outer `radius`
    pixels. Images of 2 * radius + 1 pixels or fewer along a side (which scikit-image refuses) average the whole map.
    https://ece.uwaterloo.ca/~z70wang/publications/ssim.pdf

    Args:
        images_a: `[R, H, W, 3]` uint8 or float in [0, 1].
        images_b: `[R, H, W, 3]`, same shape.
        sigma: Gaussian standard deviation in pixels.
        truncate: window radius in standard deviations.
        k1: luminance constant, `C1 = (k1 * 1.0) ** 2`.
        k2: contrast constant, `C2 = (k2 * 1.0) ** 2`.

    Returns:
        `[R]` float32 in [-1, 1]; 1 for identical images.
    """
    if images_a.shape != images_b.shape:
        raise ValueError(f"image batches differ in shape: {tuple(images_a.shape)} and {tuple(images_b.shape)}")
    _check_images(images_a)
    radius = int(truncate * sigma + 0.5)
    kernel = _gaussian_kernel(sigma, radius).to(images_a.device)
    if images_a.device.type != "cpu":
        return _ssim_rows(images_a, images_b, kernel, radius, k1, k2)
    # On CPU, the dozen elementwise passes over the maps are memory-bound: in chunks of about 2**18 pixels per image
    # map the working set stays in cache: faster than one pass over a large batch, and the same numbers.
    chunk = max(1, (1 << 18) // (images_a.shape[1] * images_a.shape[2]))
    parts = [
        _ssim_rows(images_a[i : i + chunk], images_b[i : i + chunk], kernel, radius, k1, k2)
        for i in range(0, images_a.shape[0], chunk)
    ]
    return torch.cat(parts) if parts else torch.zeros(0)  # [R]


def _ssim_rows(
    images_a: torch.Tensor, images_b: torch.Tensor, kernel: torch.Tensor, radius: int, k1: float, k2: float
) -> torch.Tensor:
    """`ssim` on one chunk of rows."""
    x, y = grayscale(images_a), grayscale(images_b)  # [R, H, W]
    _, height, width = x.shape
    # The five maps to filter, built channels-last: OpenCV-free depthwise convolution on CPU is several times faster
    # in that layout than in the default one.
    rows = _symmetric_index(height, radius).to(x.device)
    cols = _symmetric_index(width, radius).to(x.device)
    x, y = x.index_select(1, rows).index_select(2, cols), y.index_select(1, rows).index_select(2, cols)
    padded = torch.stack([x, y, x * x, y * y, x * y], -1).permute(0, 3, 1, 2)  # [R, 5, H+2r, W+2r] channels-last
    # Separable filter, one group per map: along rows, then along columns.
    mu = F.conv2d(padded, kernel.view(1, 1, 1, -1).expand(5, 1, 1, -1), groups=5)  # [R, 5, H+2r, W]
    mu = F.conv2d(mu, kernel.view(1, 1, -1, 1).expand(5, 1, -1, 1), groups=5)  # [R, 5, H, W]
    if height > 2 * radius and width > 2 * radius:  # scikit-image averages the map without its border
        mu = mu[:, :, radius : height - radius, radius : width - radius]
    mu_x, mu_y, mu_xx, mu_yy, mu_xy = mu.unbind(1)  # each [R, h, w]
    c1, c2 = k1**2, k2**2
    # SSIM = (2 mx my + C1)(2 cov + C2) / ((mx^2 + my^2 + C1)(var_x + var_y + C2)), with cov = E[xy] - mx my and
    # var_x + var_y = E[x^2] + E[y^2] - (mx^2 + my^2): the same algebra with fewer passes over the maps.
    mean_product = mu_x * mu_y
    mean_squares = torch.addcmul(mu_x * mu_x, mu_y, mu_y)
    numerator = (2 * mean_product + c1) * (2 * (mu_xy - mean_product) + c2)
    denominator = (mean_squares + c1) * (mu_xx + mu_yy - mean_squares + c2)
    ssim_map = numerator / denominator  # [R, h, w]
    return ssim_map.flatten(1).mean(1)  # [R]


@REWARDS.register("edge")
def edge_similarity(
    images_a: torch.Tensor,
    images_b: torch.Tensor,
    *,
    low_threshold: float = 100.0,
    high_threshold: float = 200.0,
    tolerance: int = 1,
) -> torch.Tensor:
    """F1 of the two images' Canny edge maps, an edge pixel matching an edge within `tolerance` pixels.

    Precision is the share of A's edge pixels that lie within `tolerance` (Chebyshev distance) of one of B's, recall
    the reverse, and the score their harmonic mean. Two images without edges score 1; one without edges against one
    with them scores 0. Canny (OpenCV, on the uint8 Rec. 709 greyscale) runs image by image, as OpenCV has no batched
    Canny; the matching is batched.

    Args:
        images_a: `[R, H, W, 3]` uint8 or float in [0, 1].
        images_b: `[R, H, W, 3]`, same shape.
        low_threshold: Canny hysteresis low threshold (on 0-255 intensities).
        high_threshold: Canny hysteresis high threshold.
        tolerance: how far, in pixels, a matching edge may be.

    Returns:
        `[R]` float32 in [0, 1].
    """
    import cv2
    import numpy as np

    if images_a.shape != images_b.shape:
        raise ValueError(f"image batches differ in shape: {tuple(images_a.shape)} and {tuple(images_b.shape)}")
    gray = (torch.cat([grayscale(images_a), grayscale(images_b)]) * 255).round().to(torch.uint8).cpu().numpy()
    edges = np.stack([cv2.Canny(g, low_threshold, high_threshold) > 0 for g in gray])  # [2R, H, W]
    edges = torch.from_numpy(edges).to(images_a.device).float()
    size = 2 * tolerance + 1
    near = F.max_pool2d(edges.unsqueeze(1), size, stride=1, padding=tolerance).squeeze(1) > 0  # [2R, H, W]
    r = images_a.shape[0]
    edges_a, edges_b = edges[:r] > 0, edges[r:] > 0
    near_a, near_b = near[:r], near[r:]
    count_a, count_b = edges_a.flatten(1).sum(1).float(), edges_b.flatten(1).sum(1).float()  # [R]
    precision = (edges_a & near_b).flatten(1).sum(1) / count_a.clamp(min=1)
    recall = (edges_b & near_a).flatten(1).sum(1) / count_b.clamp(min=1)
    f1 = 2 * precision * recall / (precision + recall).clamp(min=1e-12)
    both_empty = (count_a == 0) & (count_b == 0)
    return torch.where(both_empty, torch.ones_like(f1), f1).to(torch.float32)  # [R]


@REWARDS.register("color_histogram")
def color_histogram_similarity(images_a: torch.Tensor, images_b: torch.Tensor, *, bins: int = 32) -> torch.Tensor:
    """Histogram intersection of the per-channel colour histograms, averaged over R, G and B.

    Each channel's 0-255 values fall in `bins` equal bins; the normalised histograms `p`, `q` score
    `sum(min(p, q))` = `1 - 0.5 * |p - q|_1`. Position is ignored: this rewards the right palette in the right
    proportions.

    Args:
        images_a: `[R, H, W, 3]` uint8 or float in [0, 1].
        images_b: `[R, H, W, 3]`, same shape.
        bins: bins per channel (256 must be a multiple of it).

    Returns:
        `[R]` float32 in [0, 1]: 1 for the same colour distribution, 0 for disjoint ones (black against white).
    """
    if images_a.shape != images_b.shape:
        raise ValueError(f"image batches differ in shape: {tuple(images_a.shape)} and {tuple(images_b.shape)}")
    if not 1 <= bins <= 256 or 256 % bins:
        raise ValueError(f"bins must divide 256, got {bins}")
    pair = torch.cat([as_uint8_images(images_a), as_uint8_images(images_b)])  # [2R, H, W, 3]
    index = (pair.long() * bins // 256).permute(0, 3, 1, 2).flatten(2)  # [2R, 3, H*W]
    counts = torch.zeros(*index.shape[:2], bins, dtype=torch.float32, device=pair.device)
    counts.scatter_add_(2, index, torch.ones_like(index, dtype=torch.float32))  # [2R, 3, bins]
    hist = counts / index.shape[-1]
    r = images_a.shape[0]
    return torch.minimum(hist[:r], hist[r:]).sum(-1).mean(-1)  # [R]


class ImageEncoder(Protocol):
    """Anything that maps a batch of images to one embedding per image."""

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """`[R, H, W, 3]` uint8 or float in [0, 1] -> `[R, D]` float."""
        ...


@REWARDS.register("embedding")
def embedding_similarity(images_a: torch.Tensor, images_b: torch.Tensor, encoder: ImageEncoder) -> torch.Tensor:
    """Cosine similarity of the two images' embeddings (CLIP, SigLIP, DINO: any `ImageEncoder`).

    Both batches go through the encoder in one call.

    Args:
        images_a: `[R, H, W, 3]` uint8 or float in [0, 1].
        images_b: `[R, H, W, 3]`, same shape.
        encoder: a callable `[N, H, W, 3] -> [N, D]`, e.g. `HFImageEncoder.from_pretrained(path)`.

    Returns:
        `[R]` float32 in [-1, 1].
    """
    if images_a.shape != images_b.shape:
        raise ValueError(f"image batches differ in shape: {tuple(images_a.shape)} and {tuple(images_b.shape)}")
    embeddings = encoder(torch.cat([images_a, images_b])).to(torch.float32)  # [2R, D]
    a, b = embeddings.chunk(2)
    return F.cosine_similarity(a, b, dim=-1)  # [R]


class HFImageEncoder:
    """An `ImageEncoder` over a transformers model with `get_image_features` (CLIPModel, SiglipModel, ...).

    Images are resized (bilinear, antialiased) to the model's square input as a whole, without the processor's crop,
    which could cut off the part of a render that differs, and normalised with the processor's mean and std.

    Args:
        model: the model; put it in eval mode and on its device first.
        image_size: input side in pixels; None reads `model.config.vision_config.image_size`.
        mean: per-channel normalisation mean; None: CLIP's, or 0.5 for SigLIP models.
        std: per-channel normalisation std; None: CLIP's, or 0.5 for SigLIP models.
        batch_size: images per forward pass.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        image_size: int | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        batch_size: int = 64,
    ):
        config = getattr(model, "config", None)
        model_type = str(getattr(config, "model_type", ""))
        siglip = model_type.startswith("siglip")
        if image_size is None:
            image_size = int(config.vision_config.image_size)  # type: ignore[union-attr]
        self.model = model
        self.image_size = image_size
        self.mean = torch.tensor(mean if mean is not None else (0.5,) * 3 if siglip else CLIP_MEAN)
        self.std = torch.tensor(std if std is not None else (0.5,) * 3 if siglip else CLIP_STD)
        self.batch_size = batch_size

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike[str], *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
    ) -> HFImageEncoder:
        """Loads a CLIP/SigLIP-style model (AutoModel) and, if the folder has one, its preprocessor_config.json."""
        from transformers import AutoModel

        model = AutoModel.from_pretrained(path, dtype=dtype) if dtype is not None else AutoModel.from_pretrained(path)
        model = model.to(device).eval()
        if not hasattr(model, "get_image_features"):
            raise ValueError(f"{type(model).__name__} from {path} has no get_image_features")
        mean = std = None
        image_size = None
        config_file = os.path.join(os.fspath(path), "preprocessor_config.json")
        if os.path.isfile(config_file):
            with open(config_file) as f:
                pre = json.load(f)
            mean, std = pre.get("image_mean"), pre.get("image_std")
            size = pre.get("crop_size") or pre.get("size")
            if isinstance(size, dict):
                size = size.get("height") or size.get("shortest_edge")
            image_size = int(size) if size else None
        return cls(model, image_size=image_size, mean=mean, std=std)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """`[N, H, W, 3]` uint8 or float in [0, 1] -> `[N, D]` image features."""
        parameter = next(self.model.parameters())
        out = []
        for start in range(0, images.shape[0], self.batch_size):
            chunk = images[start : start + self.batch_size]
            _check_images(chunk)
            # [n, 3, H, W] as a channels-last view. Resizing uint8 before converting uses PyTorch's vectorised uint8
            # antialias kernel, much faster on CPU than resizing floats, and differs by at most 1/255.
            x = chunk.permute(0, 3, 1, 2).to(parameter.device)
            if x.shape[-2:] != (self.image_size, self.image_size):
                size = (self.image_size, self.image_size)
                x = F.interpolate(
                    x if x.dtype == torch.uint8 else x.float(), size=size, mode="bilinear", antialias=True
                )
            # (x / 255 - mean) / std as one scale and shift, in place, on a contiguous copy (broadcasting over the
            # channels-last view is several times slower).
            scale = 1.0 / (self.std * (255.0 if x.dtype == torch.uint8 else 1.0))
            shift = self.mean / self.std
            x = x.contiguous().float()  # the layout change on the uint8 data, before it is 4x larger
            x.mul_(scale.view(1, 3, 1, 1).to(x.device)).sub_(shift.view(1, 3, 1, 1).to(x.device))
            features = self.model.get_image_features(pixel_values=x.to(parameter.dtype))
            if not isinstance(features, torch.Tensor):  # some transformers versions return a model output
                embeds = getattr(features, "image_embeds", None)
                features = embeds if embeds is not None else features.pooler_output
            out.append(features)
        return torch.cat(out)  # [N, D]


@REWARDS.register("code_length")
def code_length_reward(
    sources: Sequence[str] | torch.Tensor,
    reference_lengths: torch.Tensor | Sequence[float] | float,
    *,
    free_fraction: float = 0.5,
) -> torch.Tensor:
    """A shorter-is-better term for generated code, relative to a reference length (RLRF-style).

    `1 - (max(0, L - free_fraction * L_ref) / L_ref) ** 2`, clamped to [0, 1]: full reward up to `free_fraction`
    of the reference length, then a quadratic fall to 0 at `(1 + free_fraction) * L_ref`, and 0 beyond (the clamp
    keeps one runaway sample from outweighing the similarity terms). The form follows the length reward of RLRF,
    "Rendering-Aware Reinforcement Learning for Vector Graphics Generation" (Rodriguez et al., 2025,
    https://arxiv.org/abs/2505.20793), which rewards compact SVG against the ground-truth length.

    Args:
        sources: R generated sources (lengths in characters), or `[R]` lengths in any unit (e.g. tokens).
        reference_lengths: `[R]` reference lengths in the same unit, or one number for all rows; must be > 0.
        free_fraction: share of the reference length that costs nothing.

    Returns:
        `[R]` float32 in [0, 1].
    """
    if isinstance(sources, torch.Tensor):
        lengths = sources.to(torch.float32)
    else:
        lengths = torch.tensor([len(s) for s in sources], dtype=torch.float32)  # [R]
    reference = torch.as_tensor(reference_lengths, dtype=torch.float32).expand_as(lengths)  # [R]
    if not bool((reference > 0).all()) or not math.isfinite(free_fraction):
        raise ValueError("reference lengths must be > 0")
    excess = (lengths - free_fraction * reference).clamp(min=0) / reference
    return (1 - excess.square()).clamp(0.0, 1.0)  # [R]
