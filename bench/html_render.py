"""HTML renders per second: the sandbox's warm-browser `html` kind against a one-shot `chromium --screenshot` per page.

The work: N generated pages (`sim.render.targets.html_target`, `--complexity` boxes and words after the env's
preamble), rendered at `--size` x `--size`.

* **warm**: `RenderPool("html", workers=W)`: each worker keeps one confined Chromium and renders every page in a
  fresh browser context over the DevTools pipe (`rewards.render.html`). Timed with W = 1 and W = `--workers`; the
  pool is started (and one page rendered) before the clock runs.
* **one-shot**: per page, a new `chromium --headless --screenshot` process (the same network flags, a fresh
  profile, the page written to a file in a temporary folder, under `unshare -n` where available), then the PNG is
  read back. No Landlock, no `nobody`: the cheapest honest one-shot, so the ratio is a lower bound.

Rounds alternate the sides, so a slow phase of a noisy machine hits both; medians are printed. The warm side's
images of the same page must agree across rounds (pixel-stable).

    .venv/bin/python bench/html_render.py [--n 16] [--repeats 3] [--workers 2] [--size 64] [--oneshot 4]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

import torch  # noqa: E402
from PIL import Image  # noqa: E402

from rewards.render import RenderPool, html, network_namespace_available  # noqa: E402
from sim.render.targets import HTML_PREAMBLE, html_target  # noqa: E402


def pages(n: int, complexity: int) -> list[str]:
    return [HTML_PREAMBLE + html_target(seed, complexity).source for seed in range(n)]


def warm(pool: RenderPool, sources: list[str], size: int) -> tuple[float, list[torch.Tensor]]:
    start = time.perf_counter()
    results = pool.render_batch(sources, size, timeout=60.0)
    seconds = time.perf_counter() - start
    bad = [r.reason for r in results if r.image is None]
    if bad:
        raise SystemExit(f"warm renders failed: {bad[:3]}")
    return seconds, [r.image for r in results]


def oneshot(sources: list[str], size: int) -> float:
    binary = html.browser_path()
    assert binary is not None
    prefix = ["unshare", "-n"] if network_namespace_available() else []
    flags = [f for f in html.FLAGS if f != "--remote-debugging-pipe"]
    start = time.perf_counter()
    for source in sources:
        folder = tempfile.mkdtemp(prefix="mmrl-oneshot-")
        try:
            page, shot = os.path.join(folder, "page.html"), os.path.join(folder, "shot.png")
            Path(page).write_text(source)
            cmd = [*prefix, binary, *flags, f"--user-data-dir={folder}/profile", f"--window-size={size},{size}"]
            cmd += [f"--screenshot={shot}", f"file://{page}"]
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=True)
            with Image.open(shot) as image:
                image.convert("RGB").tobytes()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=16, help="pages per round (warm side)")
    parser.add_argument("--oneshot", type=int, default=4, help="pages per round (one-shot side)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--complexity", type=int, default=3)
    args = parser.parse_args()
    if html.unavailable():
        raise SystemExit(html.unavailable())
    sources = pages(args.n, args.complexity)
    print(f"{platform.node()}: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {html.browser_path()}")
    pools = {w: RenderPool("html", workers=w) for w in sorted({1, args.workers})}
    for w, pool in pools.items():
        warm(pool, sources[:w], args.size)  # start the workers and their browsers (one page each)
    times: dict[str, list[float]] = {f"warm, {w} worker(s)": [] for w in pools}
    times["one-shot chromium --screenshot"] = []
    first: list[torch.Tensor] | None = None
    for _ in range(args.repeats):
        for w, pool in pools.items():
            seconds, images = warm(pool, sources, args.size)
            times[f"warm, {w} worker(s)"].append(args.n / seconds)
            if first is None:
                first = images
            elif not all(torch.equal(a, b) for a, b in zip(first, images)):
                raise SystemExit("warm renders of the same pages differ between rounds")
        times["one-shot chromium --screenshot"].append(args.oneshot / oneshot(sources[: args.oneshot], args.size))
    for pool in pools.values():
        pool.close()
    print(f"{args.n} pages (complexity {args.complexity}) at {args.size} px, median of {args.repeats} rounds")
    for name, rates in times.items():
        print(f"  {name:34s} {statistics.median(rates):6.2f} renders/s   ({', '.join(f'{r:.2f}' for r in rates)})")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
