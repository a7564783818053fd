"""MiniWoB++ in headless Chromium: env-steps per second of `sim.make("miniwob")` against the raw gymnasium loop, and
the scripted expert's success per task.

The work per env step, for each of N worlds (browsers): one click on the page (a blank spot of click-button's task
area, so no episode ends during the timing), then MiniWoB's metadata, DOM and screenshot read back over ChromeDriver.

* **mmrl**: `env.step(["click(x, y)"] * N)`: parse the N texts, map them to MiniWoB `CLICK_COORDS` actions, step
  the N browsers concurrently on threads, letterbox each screenshot to `image_size`, return fresh tensors.
* **raw**: N `miniwob` gymnasium envs (the package's own `MiniWoBEnvironment`, given the same confined browser as
  mmrl so neither side touches the network) stepped one after another in a Python loop with
  `env.step(env.unwrapped.create_action("CLICK_COORDS", coords=...))`, as a gymnasium user writes it.

The two sides alternate step by step (which goes first flips every round), so load from other processes falls on
both alike. Table: env-steps/s = N * steps / median seconds of a round, and the ratio mmrl / raw.

    .venv/bin/python bench/miniwob.py [--n 1 4 8] [--steps 20] [--repeats 3]
    .venv/bin/python bench/miniwob.py --expert [--seeds 20]   # the expert's success on each task of EXPERT_TASKS
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

# Run from anywhere without installing. The repository root replaces this script's folder on the path (not just in
# front of it): this file is named miniwob.py and would otherwise shadow the `miniwob` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sim  # noqa: E402
from sim.gui.miniwob import _NO_LIMIT_MS, EXPERT_TASKS, MiniWoBEnv, _confined_env_class  # noqa: E402

TASK = "click-button"
BLANK = (150.0, 200.0)  # page pixels: a blank corner of click-button's task area


def throughput(ns: list[int], steps: int, repeats: int) -> None:
    print(f"env steps/s, {TASK}, one click per step ({steps} steps x {repeats} rounds; median round)")
    print(f"{'N':>3} | {'mmrl':>8} | {'raw loop':>8} | ratio")
    for n in ns:
        env = sim.make("miniwob", num_envs=n, tasks=[TASK], image_size=128, max_episode_steps=10**6)
        raw = [_confined_env_class()(subdomain=TASK) for _ in range(n)]
        for r in raw:
            r.instance.driver.execute_script("core.EPISODE_MAX_TIME = arguments[0];", _NO_LIMIT_MS)
        x, y = env.to_image(*BLANK)
        texts = [f"click({round(x)}, {round(y)})"] * n
        times = {"mmrl": [], "raw": []}
        for round_ in range(repeats):
            env.reset(seed=0)
            for k, r in enumerate(raw):
                r.reset(seed=k)
            actions = [r.unwrapped.create_action("CLICK_COORDS", coords=np.array(BLANK, np.float32)) for r in raw]
            spent = {"mmrl": 0.0, "raw": 0.0}
            for step in range(steps):
                order = ("mmrl", "raw") if (round_ + step) % 2 == 0 else ("raw", "mmrl")
                for side in order:
                    start = time.perf_counter()
                    if side == "mmrl":
                        result = env.step(texts)
                        assert not (result.terminated | result.truncated).any()
                    else:
                        for r, a in zip(raw, actions):
                            _, _, done, _, _ = r.step(a)
                            assert not done
                    spent[side] += time.perf_counter() - start
            for side in spent:
                times[side].append(spent[side])
        rate = {side: n * steps / statistics.median(t) for side, t in times.items()}
        print(f"{n:>3} | {rate['mmrl']:>8.1f} | {rate['raw']:>8.1f} | {rate['mmrl'] / rate['raw']:.2f}", flush=True)
        env.close()
        for r in raw:
            r.close()


def expert(seeds: int) -> None:
    n = len(EXPERT_TASKS)
    env = MiniWoBEnv(num_envs=n, tasks=EXPERT_TASKS)
    wins = {t: 0 for t in EXPERT_TASKS}
    steps = {t: 0 for t in EXPERT_TASKS}
    start = time.perf_counter()
    for j in range(seeds):
        env.reset(seed=j * n)  # world k gets seed j * n + k: task k
        ended = torch.zeros(n, dtype=torch.bool)
        while not ended.all():
            result = env.step(env.expert_action())
            for k in (~ended).nonzero().flatten().tolist():
                steps[env.task_names[k]] += 1
            ended = result.terminated | result.truncated
        for k, task in enumerate(env.task_names):
            wins[task] += int(result.info["success"][k])
    env.close()
    print(f"expert success over {seeds} seeds per task ({time.perf_counter() - start:.0f} s):")
    print("| task | success | steps per episode |\n|---|---|---|")
    for task in EXPERT_TASKS:
        print(f"| {task} | {wins[task] / seeds:.2f} ({wins[task]}/{seeds}) | {steps[task] / seeds:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--expert", action="store_true", help="measure the expert's success per task instead")
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    reason = MiniWoBEnv.unavailable()
    if reason:
        sys.exit(reason)
    if args.expert:
        expert(args.seeds)
    else:
        throughput(args.n, args.steps, args.repeats)


if __name__ == "__main__":
    main()
