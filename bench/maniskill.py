"""Env-steps per second with camera images for the ManiSkill 3 adapter on CPU, against a bare ManiSkill env.

* **adapter**: `ManiSkillEnv(num_envs=N, backend="cpu")`: N worker processes, one CPU ManiSkill env each, rendering
  through software Vulkan (lavapipe), driven in lockstep over pipes; `env.step(actions)` with `[N, D]` random
  actions, returning images `[N, H, W, 3]`, states and rewards (the reward components recomputed per step).
* **raw**: one ManiSkill env in this process (`gym.make(task, obs_mode="rgb+state", ...)`, same camera size and
  controller), `env.step(action)` in a loop: the ceiling for N=1.

World-steps per second = N * env steps / seconds. Start-up (worker spawn, imports, first render) is reported apart.
Episodes never end during the timing (max_episode_steps above the step count, zero-mean random actions).

    .venv/bin/python bench/maniskill.py [--task PickCube-v1] [--n 1 2] [--steps 60] [--image-size 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

import torch  # noqa: E402

from sim.robotics.maniskill import ManiSkillEnv, maniskill_env_defaults  # noqa: E402


def time_adapter(task: str, n: int, steps: int, image_size: int, repeats: int) -> tuple[float, list[float]]:
    """Start-up seconds and per-repeat world-steps/s of the adapter with N worlds."""
    start = time.perf_counter()
    env = ManiSkillEnv(num_envs=n, task=task, image_size=image_size, backend="cpu", max_episode_steps=10 * steps)
    startup = time.perf_counter() - start
    gen = torch.Generator().manual_seed(0)
    rates = []
    try:
        for r in range(repeats):
            env.reset(seed=100 * r)
            actions = torch.rand(steps, n, env.action_dim, generator=gen) * 2 - 1  # [T, N, D]
            begin = time.perf_counter()
            for t in range(steps):
                env.step(actions[t])
            rates.append(n * steps / (time.perf_counter() - begin))
    finally:
        env.close()
    return startup, rates


def time_raw(task: str, steps: int, image_size: int, repeats: int) -> list[float]:
    """Per-repeat steps/s of one bare CPU ManiSkill env in this process."""
    for key, value in maniskill_env_defaults().items():
        os.environ.setdefault(key, value)
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401

    env = gym.make(
        task,
        obs_mode="rgb+state",
        control_mode="pd_ee_delta_pose",
        sensor_configs=dict(width=image_size, height=image_size),
        sim_backend="physx_cpu",
        render_backend="cpu",
        max_episode_steps=10 * steps,
    )
    gen = torch.Generator().manual_seed(0)
    rates = []
    for r in range(repeats):
        env.reset(seed=100 * r)
        actions = torch.rand(steps, 1, env.action_space.shape[-1], generator=gen) * 2 - 1  # [T, 1, D]
        begin = time.perf_counter()
        for t in range(steps):
            env.step(actions[t])
        rates.append(steps / (time.perf_counter() - begin))
    env.close()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="PickCube-v1")
    parser.add_argument("--n", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)

    print(f"{args.task}, {args.image_size}x{args.image_size} RGB, {args.steps} steps x {args.repeats} repeats, CPU")
    print(f"os.cpu_count()={os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'side':<10}{'N':>4}{'start-up s':>12}{'world-steps/s (median)':>26}{'all repeats':>30}")
    raw = time_raw(args.task, args.steps, args.image_size, args.repeats)
    print(f"{'raw':<10}{1:>4}{'-':>12}{statistics.median(raw):>26.1f}{str([round(x, 1) for x in raw]):>30}")
    for n in args.n:
        startup, rates = time_adapter(args.task, n, args.steps, args.image_size, args.repeats)
        rounded = str([round(x, 1) for x in rates])
        print(f"{'adapter':<10}{n:>4}{startup:>12.1f}{statistics.median(rates):>26.1f}{rounded:>30}")


if __name__ == "__main__":
    main()
