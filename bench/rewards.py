"""Renders scored per second: mmrl's sandboxed SVG pipeline against a naive serial loop, on the same SVGs.

The work: N generated SVGs (about 150 elements each: rectangles, circles, ellipses, Bezier paths and polygons, with
linear and radial gradients, fill and stroke opacity), each rendered at 256 x 256 and scored with SSIM against its
own target image (the same drawing with some elements moved and recoloured, rendered beforehand on both sides).

* **mmrl**: a warm `RenderPool` (`--workers` sandboxed workers, each render in a fresh confined child) renders the
  batch, then `rewards.ssim` scores it in one batched call (torch, `--threads` threads).
* **naive**: in-process, one SVG at a time: `cairosvg.svg2png` -> PIL decode -> `skimage.color.rgb2gray` ->
  `skimage.metrics.structural_similarity` (the same SSIM settings). No sandbox, no batching.

Rounds alternate the two sides, so a slow phase of a noisy machine hits both; the table gives medians and the ratio.
Both sides' scores are compared (they must agree within 1e-3). With `--clip`, it also times a tiny random CLIP's
`embedding_similarity` batched against one pair at a time; with `--scaling`, sandboxed renders alone with one worker
and with `--workers` (the pool scales with free cores: on a busy machine it cannot). With `--cad`, build123d scripts
(`CAD_PARTS`, cycled to `--n`) rendered at 256 x 256 through a warm `cad` pool against a fresh `python -c` process
per script (the naive way: each pays the build123d import; same renderer code, loaded by path; `--cad-naive` of them).

    .venv/bin/python bench/rewards.py [--n 64] [--repeats 3] [--workers 2] [--threads 1] [--clip] [--scaling]
                                      [--cad] [--cad-naive 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

import torch  # noqa: E402

from rewards.image import HFImageEncoder, embedding_similarity, ssim  # noqa: E402
from rewards.render import RenderPool, stack_renders  # noqa: E402

SIZE = 256


# -------------------------------------------------------------------------------------------------------- THE WORK
def make_svg(seed: int, elements: int = 150, *, jitter: int | None = None) -> str:
    """A drawing of `elements` shapes with gradients and opacity; `jitter` moves and recolours some of them."""
    rng = random.Random(seed)
    moved = random.Random(jitter) if jitter is not None else None

    def color() -> str:
        return f"#{rng.randrange(1 << 24):06x}"

    defs = []
    for g in range(6):
        stops = "".join(
            f'<stop offset="{k / 2:.2f}" stop-color="{color()}" stop-opacity="{rng.uniform(0.4, 1):.2f}"/>'
            for k in range(3)
        )
        if g % 2:
            defs.append(
                f'<radialGradient id="g{g}" cx="{rng.random():.2f}" cy="{rng.random():.2f}">{stops}</radialGradient>'
            )
        else:
            defs.append(
                f'<linearGradient id="g{g}" x2="{rng.random():.2f}" y2="{rng.random():.2f}">{stops}</linearGradient>'
            )
    shapes = []
    for i in range(elements):
        x, y = rng.uniform(0, 256), rng.uniform(0, 256)
        fill = f"url(#g{rng.randrange(6)})" if rng.random() < 0.4 else color()
        if moved is not None and moved.random() < 0.2:  # the target differs here
            x, y, fill = (x + moved.uniform(-20, 20)) % 256, (y + moved.uniform(-20, 20)) % 256, color()
        style = (
            f'fill="{fill}" fill-opacity="{rng.uniform(0.3, 1):.2f}" stroke="{color()}" '
            f'stroke-width="{rng.uniform(0, 3):.1f}" stroke-opacity="{rng.uniform(0.2, 1):.2f}"'
        )
        kind = i % 5
        if kind == 0:
            shapes.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{rng.uniform(4, 60):.1f}" height="{rng.uniform(4, 60):.1f}" rx="{rng.uniform(0, 8):.1f}" {style}/>'
            )
        elif kind == 1:
            shapes.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{rng.uniform(2, 30):.1f}" {style}/>')
        elif kind == 2:
            shapes.append(
                f'<ellipse cx="{x:.1f}" cy="{y:.1f}" rx="{rng.uniform(2, 40):.1f}" ry="{rng.uniform(2, 25):.1f}" {style}/>'
            )
        elif kind == 3:
            c = [rng.uniform(-40, 40) for _ in range(6)]
            shapes.append(
                f'<path d="M{x:.1f} {y:.1f} c{c[0]:.1f} {c[1]:.1f} {c[2]:.1f} {c[3]:.1f} {c[4]:.1f} {c[5]:.1f} '
                f's{c[1]:.1f} {c[0]:.1f} {c[3]:.1f} {c[2]:.1f}z" {style}/>'
            )
        else:
            points = " ".join(
                f"{(x + rng.uniform(-30, 30)) % 256:.1f},{(y + rng.uniform(-30, 30)) % 256:.1f}" for _ in range(5)
            )
            shapes.append(f'<polygon points="{points}" {style}/>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{SIZE}" height="{SIZE}" viewBox="0 0 256 256">'
        f"<defs>{''.join(defs)}</defs>{''.join(shapes)}</svg>"
    )


# ---------------------------------------------------------------------------------------------------- THE SIDES
def cairosvg_render(svg: str) -> bytes:
    """The naive render: cairosvg to PNG bytes, in-process."""
    import cairosvg

    return cairosvg.svg2png(bytestring=svg.encode(), output_width=SIZE, output_height=SIZE, background_color="white")


def naive_scores(svgs: list[str], target_grays: list) -> tuple[list[float], float, float]:
    """cairosvg + scikit-image SSIM, one at a time, in-process. Returns scores, render seconds, SSIM seconds."""
    import cairosvg
    import numpy as np
    from PIL import Image
    from skimage.color import rgb2gray
    from skimage.metrics import structural_similarity

    scores, render_s, ssim_s = [], 0.0, 0.0
    for svg, target in zip(svgs, target_grays):
        start = time.perf_counter()
        png = cairosvg.svg2png(
            bytestring=svg.encode(), output_width=SIZE, output_height=SIZE, background_color="white"
        )
        image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
        middle = time.perf_counter()
        scores.append(
            structural_similarity(
                rgb2gray(image), target, data_range=1.0, gaussian_weights=True, sigma=1.5, use_sample_covariance=False
            )
        )
        ssim_s += time.perf_counter() - middle
        render_s += middle - start
    return scores, render_s, ssim_s


def mmrl_scores(pool: RenderPool, svgs: list[str], targets: torch.Tensor) -> tuple[list[float], float, float, int]:
    """Sandboxed pool render, then one batched SSIM. Returns scores, render seconds, SSIM seconds, failures."""
    start = time.perf_counter()
    results = pool.render_batch(svgs, SIZE, timeout=30)
    images, ok = stack_renders(results, SIZE)
    middle = time.perf_counter()
    scores = ssim(images, targets)
    end = time.perf_counter()
    return scores.tolist(), middle - start, end - middle, int((~ok).sum())


def group_rates(pool: RenderPool, n: int, group: int, elements: int, repeats: int) -> dict[str, float]:
    """The RL reward workload: n predictions, `group` per target, targets given as SVG sources (scored/s).

    Each round is a fresh batch: n // group targets and `group` perturbed drawings of each (what a policy writes).
    naive: per pair, cairosvg renders the target and the prediction, then scikit-image's SSIM (a reward function
    that loops over its pairs). mmrl: one `render_batch` of the targets, each once (what the render envs do: one
    target render per seed, shared by its group), and the predictions, then one batched SSIM.
    """
    from skimage.color import rgb2gray

    samples: dict[str, list[float]] = {"mmrl": [], "naive": []}
    diff = 0.0
    for round_ in range(repeats):
        base = 10_000 * (round_ + 1)
        target_svgs = [make_svg(base + b, elements) for b in range(n // group)]
        preds = [make_svg(base + i // group, elements, jitter=base + i) for i in range(n // group * group)]
        order = ("mmrl", "naive") if round_ % 2 == 0 else ("naive", "mmrl")
        for side in order:
            start = time.perf_counter()
            if side == "mmrl":
                results = pool.render_batch(target_svgs + preds, SIZE, timeout=30)
                images, ok = stack_renders(results, SIZE)
                if not bool(ok.all()):
                    raise RuntimeError(f"renders failed: {[r.reason for r in results if not r.ok][:3]}")
                targets = images[: len(target_svgs)].repeat_interleave(group, dim=0)
                mmrl = ssim(images[len(target_svgs) :], targets).tolist()
            else:
                import cairosvg
                import numpy as np
                from PIL import Image

                def render(svg: str) -> np.ndarray:
                    png = cairosvg.svg2png(
                        bytestring=svg.encode(), output_width=SIZE, output_height=SIZE, background_color="white"
                    )
                    return rgb2gray(np.asarray(Image.open(io.BytesIO(png)).convert("RGB")))

                naive, _, _ = naive_scores(preds, [render(target_svgs[i // group]) for i in range(len(preds))])
            samples[side].append(len(preds) / (time.perf_counter() - start))
            print(f"  group round {round_ + 1} {side:6s} {samples[side][-1]:7.1f} scored/s")
        diff = max(diff, max(abs(a - b) for a, b in zip(mmrl, naive)))
    ratios = [m / v for m, v in zip(samples["mmrl"], samples["naive"])]
    rates = {side: statistics.median(v) for side, v in samples.items()}
    print(
        f"RL reward workload ({len(preds)} predictions, {group} per SVG target, targets as sources): mmrl "
        f"{rates['mmrl']:.1f}/s, naive {rates['naive']:.1f}/s, ratio {rates['mmrl'] / rates['naive']:.2f}x "
        f"(per round {min(ratios):.2f}-{max(ratios):.2f}); max |SSIM difference| {diff:.1e}"
    )
    return {**rates, "ratio": rates["mmrl"] / rates["naive"], "max_ssim_difference": diff}


def clip_rates(n: int, repeats: int) -> dict[str, float]:
    """Tiny random CLIP: batched `embedding_similarity` against one pair per call (pairs per second)."""
    from transformers import CLIPConfig, CLIPModel

    small = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2}
    config = CLIPConfig(
        text_config={**small, "vocab_size": 64, "max_position_embeddings": 16, "bos_token_id": 0, "eos_token_id": 1},
        vision_config={**small, "image_size": 224, "patch_size": 32},
        projection_dim=32,
    )
    torch.manual_seed(0)
    encoder = HFImageEncoder(CLIPModel(config).eval())
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, 256, (n, SIZE, SIZE, 3), dtype=torch.uint8, generator=gen)
    b = torch.randint(0, 256, (n, SIZE, SIZE, 3), dtype=torch.uint8, generator=gen)
    embedding_similarity(a[:2], b[:2], encoder)  # warm-up
    batched, single = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        embedding_similarity(a, b, encoder)
        batched.append(n / (time.perf_counter() - start))
        start = time.perf_counter()
        for i in range(n):
            embedding_similarity(a[i : i + 1], b[i : i + 1], encoder)
        single.append(n / (time.perf_counter() - start))
    return {"batched": statistics.median(batched), "one_at_a_time": statistics.median(single)}


CAD_PARTS = {
    "box": "from build123d import *\nresult = Box(40, 30, 10)\n",
    "drilled_plate": (
        "from build123d import *\nwith BuildPart() as p:\n    Box(60, 40, 6)\n"
        "    with GridLocations(40, 20, 2, 2):\n        Hole(3)\n"
    ),
    "filleted_boss": (
        "from build123d import *\nwith BuildPart() as p:\n    Box(40, 30, 10)\n"
        "    fillet(p.edges().filter_by(Axis.Z), 4)\n    with Locations((0, 0, 5)):\n"
        "        Cylinder(8, 20, align=(Align.CENTER, Align.CENTER, Align.MIN))\n    Hole(4)\n"
    ),
    "bracket": (
        "from build123d import *\nwith BuildPart() as p:\n    with BuildSketch():\n        with BuildLine():\n"
        "            Polyline((0, 0), (40, 0), (40, 5), (5, 5), (5, 30), (0, 30), close=True)\n        make_face()\n"
        "    extrude(amount=20)\n    with Locations(Location((25, 5, 10), (90, 0, 0))):\n        Hole(3)\n"
    ),
}
"""A few small parts, from a plain box to booleans and fillets."""

_CAD_NAIVE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("cad", sys.argv[1])
cad = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cad)
import build123d  # noqa: F401  (what a process per script pays)
sys.stdout.write(str(len(cad.render(sys.stdin.read(), int(sys.argv[2]), int(sys.argv[2]), {}))))
"""


def cad_rates(n: int, workers: int, naive: int, repeats: int) -> dict[str, float]:
    """CAD renders per second: a warm sandboxed pool against a fresh process per script."""
    scripts = [list(CAD_PARTS.values())[i % len(CAD_PARTS)] for i in range(n)]
    renderer = Path(__file__).resolve().parents[1] / "rewards" / "render" / "cad.py"
    with RenderPool("cad", workers=workers) as pool:
        started = time.perf_counter()
        warm = pool.render_batch(scripts[: 2 * workers], SIZE, timeout=60)  # start and warm every worker
        print(f"cad pool of {workers} started in {time.perf_counter() - started:.1f} s")
        if not all(r.ok for r in warm):
            raise RuntimeError(f"cad renders failed: {[r.reason for r in warm if not r.ok]}")
        pooled = []
        for _ in range(repeats):
            start = time.perf_counter()
            results = pool.render_batch(scripts, SIZE, timeout=30)
            pooled.append(n / (time.perf_counter() - start))
            assert all(r.ok for r in results), [r.reason for r in results if not r.ok]
        per_part = {}
        for name, script in CAD_PARTS.items():  # one at a time: latency through the pool, per part
            seconds = [pool.render_batch([script], SIZE, timeout=30)[0].seconds for _ in range(5)]
            per_part[name] = 1000 * statistics.median(seconds)
    start = time.perf_counter()
    for script in scripts[:naive]:
        subprocess.run(
            [sys.executable, "-c", _CAD_NAIVE, str(renderer), str(SIZE)],
            input=script,
            text=True,
            capture_output=True,
            check=True,
        )
    rates = {"pool": statistics.median(pooled), "process_per_script": naive / (time.perf_counter() - start)}
    print(
        f"cad renders at {SIZE} px (iso): pool of {workers} {rates['pool']:.1f}/s, fresh process per script "
        f"{rates['process_per_script']:.2f}/s, ratio {rates['pool'] / rates['process_per_script']:.0f}x; "
        "latency per part through the pool (ms, median of 5): "
        + ", ".join(f"{k} {v:.0f}" for k, v in per_part.items())
    )
    return {**rates, **{f"ms_{k}": v for k, v in per_part.items()}}


# ----------------------------------------------------------------------------------------------------------- MAIN
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=64, help="SVGs per round (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, sides alternating (default 3)")
    parser.add_argument("--workers", type=int, default=2, help="sandbox workers (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the batched SSIM (default 1)")
    parser.add_argument("--elements", type=int, default=150, help="shapes per SVG (default 150)")
    parser.add_argument(
        "--group", type=int, default=0, help="also time the RL reward workload: G predictions per SVG target (0: off)"
    )
    parser.add_argument("--clip", action="store_true", help="also time batched vs one-at-a-time CLIP similarity")
    parser.add_argument("--scaling", action="store_true", help="also time renders alone with 1 worker and --workers")
    parser.add_argument("--cad", action="store_true", help="also time CAD renders: pool vs a process per script")
    parser.add_argument("--cad-naive", type=int, default=4, help="scripts for the process-per-script side (default 4)")
    parser.add_argument("--json", type=Path, help="write every sample and the summary here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()

    from skimage.color import rgb2gray

    svgs = [make_svg(seed, args.elements) for seed in range(args.n)]
    target_svgs = [make_svg(seed, args.elements, jitter=1000 + seed) for seed in range(args.n)]
    print(f"{args.n} SVGs, {statistics.mean(len(s) for s in svgs) / 1000:.1f} kB each, {args.elements} elements")
    pool = RenderPool("svg", workers=args.workers)
    try:
        started = time.perf_counter()
        target_results = pool.render_batch(target_svgs, SIZE, timeout=30)  # also starts and warms the workers
        print(f"pool of {args.workers} started and rendered the targets in {time.perf_counter() - started:.1f} s")
        targets, ok = stack_renders(target_results, SIZE)
        if not bool(ok.all()):
            print("some targets failed to render:", {r.reason for r in target_results if not r.ok})
            return 1
        target_grays = [rgb2gray(t.numpy()) for t in targets]
        samples: dict[str, list[dict[str, float]]] = {"mmrl": [], "naive": []}
        for round_ in range(args.repeats):
            order = ("mmrl", "naive") if round_ % 2 == 0 else ("naive", "mmrl")
            for side in order:
                if side == "mmrl":
                    scores, render_s, ssim_s, failed = mmrl_scores(pool, svgs, targets)
                    if failed:
                        print(f"  {failed} renders failed")
                    mmrl_last = scores
                else:
                    scores, render_s, ssim_s = naive_scores(svgs, target_grays)
                    naive_last = scores
                total = render_s + ssim_s
                samples[side].append({"per_s": args.n / total, "render_s": render_s, "ssim_s": ssim_s})
                print(
                    f"  round {round_ + 1} {side:6s} {args.n / total:7.1f} scored/s  (render {render_s:.2f} s, ssim {ssim_s:.3f} s)"
                )
        if args.group:
            group_summary = group_rates(pool, args.n, args.group, args.elements, args.repeats)
    finally:
        pool.close()
    diff = max(abs(a - b) for a, b in zip(mmrl_last, naive_last))

    def median(side: str, key: str) -> float:
        return statistics.median(s[key] for s in samples[side])

    print(f"\n{'pipeline':44s} {'scored/s':>9s} {'render ms':>10s} {'ssim ms':>8s}   (medians, per SVG)")
    rows = {
        "mmrl (sandbox pool + batched torch SSIM)": "mmrl",
        "naive (cairosvg + skimage SSIM, serial)": "naive",
    }
    for label, side in rows.items():
        print(
            f"{label:44s} {median(side, 'per_s'):9.1f} {1000 * median(side, 'render_s') / args.n:10.1f} "
            f"{1000 * median(side, 'ssim_s') / args.n:8.2f}"
        )
    ratio = median("mmrl", "per_s") / median("naive", "per_s")
    ratios = [m["per_s"] / n["per_s"] for m, n in zip(samples["mmrl"], samples["naive"])]
    print(
        f"ratio mmrl/naive: {ratio:.2f}x (per round {min(ratios):.2f}-{max(ratios):.2f}); max |SSIM difference| {diff:.1e}"
    )
    summary = {"ratio": ratio, "max_ssim_difference": diff}
    if args.group:
        summary["group"] = group_summary
    if args.clip:
        rates = clip_rates(args.n, args.repeats)
        clip_ratio = rates["batched"] / rates["one_at_a_time"]
        print(
            f"tiny CLIP embedding similarity: batched {rates['batched']:.1f} pairs/s, one at a time "
            f"{rates['one_at_a_time']:.1f} pairs/s, ratio {clip_ratio:.2f}x"
        )
        summary["clip"] = {**rates, "ratio": clip_ratio}
    if args.scaling:
        rates = {}
        for workers in sorted({1, args.workers}):
            for label, per_child in (("fresh child per render", 1), ("warm child", None)):
                with RenderPool("svg", workers=workers, renders_per_child=per_child) as scaling_pool:
                    scaling_pool.render_batch(svgs[: 2 * workers], SIZE)  # start and warm every worker
                    start = time.perf_counter()
                    scaling_pool.render_batch(svgs, SIZE, timeout=30)
                    rates[f"{workers} worker{'s' if workers > 1 else ''}, {label}"] = args.n / (
                        time.perf_counter() - start
                    )
        start = time.perf_counter()
        for svg in svgs:
            cairosvg_render(svg)
        rates["in-process cairosvg, no sandbox"] = args.n / (time.perf_counter() - start)
        print("renders alone: " + ", ".join(f"{k} {r:.1f}/s" for k, r in rates.items()))
        summary["render_scaling"] = rates
    if args.cad:
        summary["cad"] = cad_rates(args.n, args.workers, args.cad_naive, args.repeats)
    load_after = os.getloadavg()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{load_before[0]:.1f} before / {load_after[0]:.1f} after; torch threads {args.threads}; "
        f"sandbox {pool.isolation}"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "samples": samples, "summary": summary}
        record["load"] = [load_before, load_after]
        args.json.write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
