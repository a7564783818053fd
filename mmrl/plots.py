"""Pictures of a run: the reward curve and held-out predictions drawn on their images."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from PIL import Image, ImageDraw


def reward_curve(metrics: list[dict], path: str | Path, keys: tuple[str, ...] = ("reward/total",)) -> Path:
    """Plot training reward (raw and smoothed) and held-out scores against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    for key in keys:
        pts = [(m["step"], m[key]) for m in metrics if m.get(key) is not None]
        if not pts:
            continue
        steps, values = zip(*pts)
        ax.plot(steps, values, alpha=0.3, lw=1)
        k = max(1, len(values) // 20)
        smooth = [
            sum(values[max(0, i - k + 1) : i + 1]) / len(values[max(0, i - k + 1) : i + 1]) for i in range(len(values))
        ]
        ax.plot(steps, smooth, lw=2, label=f"{key} (train)")
    for prefix, split, style in (("val/", "validation", "s:"), ("eval/", "test", "o--")):  # during / around the run
        evals = sorted({k for m in metrics for k in m if k.startswith(prefix) and k != f"{prefix}episodes"})
        for key in evals[:3]:
            pts = [(m["step"], m[key]) for m in metrics if m.get(key) is not None]
            if pts:
                steps, values = zip(*pts)
                ax.plot(steps, values, style, lw=1.5, label=f"{key} ({split})")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def box_grid(
    images: torch.Tensor,
    target_boxes: torch.Tensor,
    pred_boxes: torch.Tensor,
    captions: list[str],
    path: str | Path,
    columns: int = 8,
    scale: int = 2,
) -> Path:
    """A grid of images with the true box (green) and the predicted box (magenta; none if unparsed).

    Args:
        images: `[N, H, W, 3]` uint8.
        target_boxes: `[N, 4]` xyxy pixels.
        pred_boxes: `[N, 4]` xyxy pixels, NaN rows where nothing parsed.
        captions: N short strings drawn under each image.
    """
    n, h, w, _ = images.shape
    rows = math.ceil(n / columns)
    cap_h = 14
    canvas = Image.new("RGB", (columns * w * scale, rows * (h * scale + cap_h)), "white")
    draw = ImageDraw.Draw(canvas)
    for i in range(n):
        x0, y0 = (i % columns) * w * scale, (i // columns) * (h * scale + cap_h)
        tile = Image.fromarray(images[i].cpu().numpy()).resize((w * scale, h * scale), Image.NEAREST)
        canvas.paste(tile, (x0, y0))
        for box, colour in ((target_boxes[i], (0, 170, 0)), (pred_boxes[i], (230, 0, 230))):
            if torch.isfinite(box).all():
                x1, y1, x2, y2 = (float(v) * scale for v in box)
                draw.rectangle([x0 + x1, y0 + y1, x0 + x2 - 1, y0 + y2 - 1], outline=colour, width=2)
        draw.text((x0 + 2, y0 + h * scale + 1), captions[i][:28], fill=(0, 0, 0))
    canvas.save(path)
    return Path(path)


def _upscale(frame: torch.Tensor, scale: int) -> Image.Image:
    image = Image.fromarray(frame.cpu().numpy())
    return image.resize((image.width * scale, image.height * scale), Image.NEAREST)


def episode_gif(
    frames: torch.Tensor,
    path: str | Path,
    success: torch.Tensor | None = None,
    columns: int = 4,
    scale: int = 2,
    ms_per_frame: int = 250,
) -> Path:
    """An animated GIF of K episodes side by side, one tile each, framed green (success) or red at the end.

    Args:
        frames: `[K, S+1, H, W, 3]` uint8, every observation of each episode (a finished episode's last frame repeats).
        success: `[K]` bool, colours each tile's frame once its episode is over.
    """
    k, steps, h, w, _ = frames.shape
    columns = min(columns, k)
    rows = math.ceil(k / columns)
    pad = 3
    tile_w, tile_h = w * scale + 2 * pad, h * scale + 2 * pad
    images = []
    for t in range(steps):
        canvas = Image.new("RGB", (columns * tile_w, rows * tile_h), "white")
        draw = ImageDraw.Draw(canvas)
        for i in range(k):
            x, y = (i % columns) * tile_w, (i // columns) * tile_h
            if success is not None and t == steps - 1:
                colour = (40, 170, 60) if bool(success[i]) else (210, 40, 40)
                draw.rectangle([x, y, x + tile_w - 1, y + tile_h - 1], fill=colour)
            canvas.paste(_upscale(frames[i, t], scale), (x + pad, y + pad))
        images.append(canvas)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    durations = [ms_per_frame] * (steps - 1) + [ms_per_frame * 6]  # linger on the outcome
    images[0].save(path, save_all=True, append_images=images[1:], duration=durations, loop=0)
    return path


def frame_strip(frames: torch.Tensor, path: str | Path, title: str = "", scale: int = 2, max_frames: int = 10) -> Path:
    """One episode's observations in a row (`[S+1, H, W, 3]` uint8), evenly subsampled to at most `max_frames`."""
    steps = frames.shape[0]
    picks = sorted({round(i * (steps - 1) / max(max_frames - 1, 1)) for i in range(min(max_frames, steps))})
    h, w = frames.shape[1] * scale, frames.shape[2] * scale
    cap_h = 14 if title else 0
    canvas = Image.new("RGB", (len(picks) * (w + 2), h + cap_h + 12), "white")
    draw = ImageDraw.Draw(canvas)
    if title:
        draw.text((2, 1), title, fill="black")
    for j, t in enumerate(picks):
        canvas.paste(_upscale(frames[t], scale), (j * (w + 2), cap_h))
        draw.text((j * (w + 2) + 2, cap_h + h), f"t={t}", fill="black")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)
    return path
