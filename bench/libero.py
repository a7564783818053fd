"""LIBERO through mmrl's bridge against robosuite's own loop, and the scripted expert's success per task.

Throughput (`--n 1 4 8`): world-steps per second, two 128 px cameras, uniform random actions, `action_repeat=1`.

* **mmrl**: `sim.make("libero", num_envs=N)`: N worker processes of LIBERO's own environment (`.venv-libero`), one
  world each, stepped in lockstep over pipes (sim/subproc.py); each step returns the `[N, 2, 128, 128, 3]` images as
  fresh tensors in this process.
* **raw**: robosuite's own loop (bench/libero_raw.py, run with LIBERO's interpreter): N processes, each stepping its
  own `OffScreenRenderEnv` with both camera observables in a plain loop, with no synchronisation and nothing sent
  anywhere: an upper bound for any bridge.

The two alternate per round (raw first, then mmrl, `--repeats` rounds; never both alive at once, as N worlds take
about 2N GB either way), so load from elsewhere falls on both. Table:
world-steps/s = N * steps / seconds, the median over rounds, and the ratio mmrl / raw (1.0 = no overhead).

Expert (`--expert`): the scripted pick-and-place expert (sim/robotics/libero_expert.py) through the env, over the
first `--states` fixed initial states of each task of `--suite`, at `--repeat` physics steps per action; success per
task and the mean.

    .venv/bin/python bench/libero.py [--n 1 4 8] [--steps 30] [--repeats 2]
    .venv/bin/python bench/libero.py --expert [--suite libero_spatial] [--states 10] [--repeat 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import sim  # noqa: E402
from sim.robotics.libero import libero_python, libero_unavailable, libero_venv  # noqa: E402
from sim.seeds import EVAL_SEED_BASE  # noqa: E402


def raw(n: int, steps: int, size: int) -> float:
    env = {**os.environ, "LIBERO_CONFIG_PATH": str(libero_venv() / "libero-config"), "OMP_NUM_THREADS": "1"}
    env.setdefault("MUJOCO_GL", "egl")
    out = subprocess.run([str(libero_python()), str(ROOT / "bench" / "libero_raw.py"), str(n), str(steps), str(size)],
                         env=env, capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])["steps_per_s"]


def ours(env, n: int, steps: int) -> float:
    env.reset(seed=EVAL_SEED_BASE)
    generator = torch.Generator().manual_seed(0)
    actions = torch.rand(steps, n, 7, generator=generator) * 2 - 1
    start = time.perf_counter()
    for t in range(steps):
        result = env.step(actions[t])
        assert result.obs.image.shape[:2] == (n, 2)
    return n * steps / (time.perf_counter() - start)


def throughput(args) -> None:
    rows = []
    for n in args.n:
        a, b = [], []
        for _ in range(args.repeats):  # never both at once: N worlds take about 2N GB on either side
            a.append(raw(n, args.steps, args.size))
            env = sim.make("libero", num_envs=n, image_size=args.size)
            try:
                b.append(ours(env, n, args.steps))
            finally:
                env.close()
        rows.append((n, statistics.median(b), statistics.median(a)))
        print(f"N={n}: mmrl {b} raw {a}", file=sys.stderr)
    print(f"\n{args.steps} steps, {args.size} px, two cameras, {args.repeats} rounds, {os.cpu_count()} cores")
    print("| N | mmrl world-steps/s | robosuite loop | ratio |\n|---|---|---|---|")
    for n, mine, theirs in rows:
        print(f"| {n} | {mine:.2f} | {theirs:.2f} | {mine / theirs:.2f}x |")


def expert(args) -> None:
    env = sim.make("libero", num_envs=args.workers, suite=args.suite, image_size=32, cameras=["agentview"],
                   action_repeat=args.repeat)  # fmt: skip
    tasks = env.tasks
    wins = {t: 0 for t in tasks}
    steps = {t: [] for t in tasks}
    seeds = [EVAL_SEED_BASE + i for i in range(len(tasks) * args.states)]  # tasks in turn, then states
    start = time.perf_counter()
    try:
        for first in range(0, len(seeds), args.workers):
            chunk = seeds[first : first + args.workers]
            if len(chunk) < env.num_envs:
                chunk += [chunk[-1]] * (env.num_envs - len(chunk))
            env.reset(seed=chunk)
            success = torch.zeros(env.num_envs, dtype=torch.bool)
            ended = torch.zeros(env.num_envs, dtype=torch.bool)
            taken = torch.zeros(env.num_envs, dtype=torch.long)
            while not ended.all():
                result = env.step(env.expert_action())
                taken += (~ended).long()
                success |= result.info["success"]
                ended |= result.terminated | result.truncated
            for k, seed in enumerate(seeds[first : first + args.workers]):
                task, _ = env.episode(seed)
                wins[task] += int(success[k])
                if success[k]:
                    steps[task].append(int(taken[k]) * args.repeat)
    finally:
        env.close()
    print(f"\nscripted expert on {args.suite}, initial states 0-{args.states - 1} of each task, action_repeat "
          f"{args.repeat}, limit {env.max_episode_steps} actions ({time.perf_counter() - start:.0f} s)")  # fmt: skip
    print("| task | success | median physics steps of successes | instruction |\n|---|---|---|---|")
    for t in tasks:
        median = statistics.median(steps[t]) if steps[t] else float("nan")
        print(f"| {t} | {wins[t]}/{args.states} | {median:.0f} | {env.task_languages[t]} |")
    print(f"| **all** | **{sum(wins.values()) / (len(tasks) * args.states):.3f}** | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--expert", action="store_true")
    parser.add_argument("--suite", default="libero_spatial")
    parser.add_argument("--states", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    reason = libero_unavailable()
    if reason:
        sys.exit(f"bench/libero.py: {reason}")
    expert(args) if args.expert else throughput(args)


if __name__ == "__main__":
    main()
