"""Rendering model-written code to images, sandboxed: `render`, `render_batch`, and `render_similarity`.

>>> result = render("svg", '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>', size=64)  # doctest: +SKIP
>>> result.image.shape, result.reason  # doctest: +SKIP
(torch.Size([64, 64, 3]), '')

Kinds: `"svg"` (cairosvg), `"chart"` (Python code that draws with matplotlib and leaves its figure open; see
`rewards.render.chart`) and `"cad"` (a build123d script; the part in `result`, else `part`, else the last shape or
`BuildPart` it made, is drawn shaded from fixed views; see `rewards.render.cad`). Every render runs in a sandbox
(`rewards.render.sandbox` documents what it enforces) on a pool of warm worker processes, `DEFAULT_WORKERS` per
kind, started on first use and kept for the life of the process. A failed, refused, hung or oversized render is a `RenderResult` with `image=None` and the reason; nothing
here raises because of what a source contains.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from rewards.catalog import REWARDS
from rewards.render.pool import (
    DEFAULT_WORKERS,
    KINDS,
    RenderPool,
    RenderResult,
    as_size,
    default_pool,
    network_namespace_available,
    shutdown_pools,
)

__all__ = [
    "DEFAULT_WORKERS",
    "KINDS",
    "RenderPool",
    "RenderResult",
    "network_namespace_available",
    "render",
    "render_batch",
    "render_similarity",
    "shutdown_pools",
    "stack_renders",
]


def render(
    kind: str,
    source: str,
    size: int | tuple[int, int] = 256,
    *,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    **options: Any,
) -> RenderResult:
    """Renders one source in the sandbox.

    >>> script = "from build123d import *\nresult = Box(10, 20, 5) - Cylinder(3, 5)\n"
    >>> result = render("cad", script, size=(512, 256), views=("front", "iso"))  # doctest: +SKIP
    >>> result.image.shape, result.reason  # doctest: +SKIP
    (torch.Size([256, 512, 3]), '')

    Args:
        kind: `"svg"`, `"chart"` or `"cad"`.
        source: the SVG text, the chart code, or the build123d script. A CAD script's result is the variable
            `result`, else `part`, else the last build123d shape or `BuildPart` (with a solid) it assigned; it
            needs no file path.
        size: output `(W, H)` in pixels, or one int for a square.
        timeout: wall-clock (and CPU-time) limit in seconds.
        memory_mb: memory a render may use on top of the warm worker's.
        **options: renderer options (`rewards.render.svg.OPTIONS`, `rewards.render.chart.OPTIONS`,
            `rewards.render.cad.OPTIONS`: `views`, `normalize`, `background`, ...). An unknown one raises
            TypeError naming the valid ones; a bad value raises ValueError.

    Returns:
        The result: `image` `[H, W, 3]` uint8, or None and the reason.
    """
    return render_batch(kind, [source], size, timeout=timeout, memory_mb=memory_mb, **options)[0]


def render_batch(
    kind: str,
    sources: Sequence[str],
    size: int | tuple[int, int] = 256,
    *,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    **options: Any,
) -> list[RenderResult]:
    """Renders R sources on the process-wide pool for `kind`, in parallel across its workers.

    For another number of workers, use a `RenderPool` of your own (`with RenderPool("svg", workers=4) as pool:
    pool.render_batch(...)`).

    Args:
        kind: `"svg"`, `"chart"` or `"cad"`.
        sources: R sources.
        size: output `(W, H)` in pixels, or one int for a square.
        timeout: wall-clock (and CPU-time) limit per render, in seconds.
        memory_mb: memory a render may use on top of the warm worker's.
        **options: renderer options.

    Returns:
        R results, in the order of `sources`.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown render kind {kind!r}; valid: {', '.join(KINDS)}")
    return default_pool(kind).render_batch(sources, size, timeout=timeout, memory_mb=memory_mb, **options)


def stack_renders(results: Sequence[RenderResult], size: int | tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacks results into one batch, zeros where a render failed.

    Args:
        results: R results, all rendered at `size`.
        size: their `(W, H)`, or one int.

    Returns:
        images: `[R, H, W, 3]` uint8 (all-black rows for failed renders).
        ok: `[R]` bool, True where the render succeeded.
    """
    width, height = as_size(size)
    images = torch.zeros(len(results), height, width, 3, dtype=torch.uint8)  # [R, H, W, 3]
    ok = torch.tensor([r.image is not None for r in results], dtype=torch.bool)  # [R]
    for i, r in enumerate(results):
        if r.image is not None:
            images[i] = r.image
    return images, ok


def render_similarity(
    kind: str,
    sources: Sequence[str],
    targets: torch.Tensor,
    *,
    metric: str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = "ssim",
    timeout: float = 10.0,
    pool: RenderPool | None = None,
) -> tuple[torch.Tensor, list[str]]:
    """Renders each source and scores it against its target image; a failed render scores 0.0.

    Not registered in `REWARDS` (it also returns the reasons); a task renders once and passes the images to the
    registered similarities, or calls this.

    Args:
        kind: `"svg"`, `"chart"` or `"cad"`.
        sources: R sources.
        targets: `[R, H, W, 3]` uint8 target images; renders are made at their size.
        metric: an image metric registered in `REWARDS` (`"ssim"`, `"pixel"`, `"edge"`, `"color_histogram"`) or a
            callable `(images_a, images_b) -> [R]`.
        timeout: per-render limit in seconds.
        pool: the pool to render on; None uses the process-wide one for `kind`.

    Returns:
        scores: `[R]` float32, 0.0 where the render failed.
        reasons: R strings, "" where the render succeeded.
    """
    if targets.dim() != 4 or targets.shape[0] != len(sources) or targets.shape[-1] != 3:
        raise ValueError(f"targets must be [R={len(sources)}, H, W, 3], got {tuple(targets.shape)}")
    size = (int(targets.shape[2]), int(targets.shape[1]))
    score = REWARDS.get(metric) if isinstance(metric, str) else metric
    if pool is None:
        results = render_batch(kind, sources, size, timeout=timeout)
    else:
        results = pool.render_batch(sources, size, timeout=timeout)
    images, ok = stack_renders(results, size)
    scores = score(images, targets).to(torch.float32)  # [R]
    return torch.where(ok, scores, torch.zeros_like(scores)), [r.reason for r in results]
