"""Env-steps per second of `reach`/`push` on the MuJoCo Warp backend against the plain MuJoCo backend.

Both sides are the same env class (`sim.make(env, backend=...)`): the same task logic, the same random actions from
the same reset states. `mujoco` steps each world with `mj_step` and renders it with one OpenGL `mujoco.Renderer`, on
the CPU; `warp` steps all N worlds in one MuJoCo Warp batch and ray-traces all N images at once, on `--device`.
Warp's kernels are compiled (or loaded from ~/.cache/warp) before timing. The sides are interleaved step by step so
that load from other processes falls on both alike; the table gives env-steps/s (N * steps / median seconds of a
round) of each, their ratio, and the warp side's split between physics (`step`) and images (`render`), timed apart
in one extra round.

On a CPU, Warp runs its kernels one world after another, so this measures the cost of the batched path there; the
figure it exists for is on a GPU (`--device cuda`).

    .venv/bin/python bench/warp_envs.py [--env reach|push] [--n 1 16 64] [--steps 20] [--repeats 3] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco: it picks its GL backend at import
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sim  # noqa: E402


def one_round(envs: dict, actions: torch.Tensor, flip: bool) -> dict[str, float]:
    """Seconds each backend spends on the same `T` steps (`actions` is `[T, N, 2]`), interleaved step by step."""
    for env in envs.values():
        env.reset(seed=0)
    spent = dict.fromkeys(envs, 0.0)
    order = list(envs)[::-1] if flip else list(envs)
    for t in range(actions.shape[0]):
        for name in order:
            started = time.perf_counter()
            envs[name].step(actions[t])
            spent[name] += time.perf_counter() - started
    states = [env._state() for env in envs.values()]
    if abs(states[0] - states[1]).max() > 1e-3:  # float32 against float64 physics; more means different work
        raise RuntimeError("the two backends ended in different states: not the same work")
    return spent


def warp_split(env, actions: torch.Tensor) -> tuple[float, float]:
    """Seconds of the warp side's physics and of its rendering over the same `T` steps, timed apart."""
    env.reset(seed=0)
    worlds, g, n = env._warp, env._gripper_qpos, env.num_envs
    live = np.ones(n, dtype=bool)
    physics = render = 0.0
    for t in range(actions.shape[0]):
        qpos = np.stack([data.qpos for data in env.datas])  # [N, nq]
        ctrl = np.zeros((n, env.model.nu))
        step = actions[t].double().numpy() * env.action_scale
        ctrl[:, :2] = np.clip(qpos[:, g : g + 2] + step, -env.half_width, env.half_width)  # as the env does
        started = time.perf_counter()
        qpos, qvel = worlds.step(ctrl, live, env.frame_skip)
        physics += time.perf_counter() - started
        for k, data in enumerate(env.datas):
            data.qpos[:], data.qvel[:] = qpos[k], qvel[k]
        started = time.perf_counter()
        worlds.render()
        render += time.perf_counter() - started
    return physics, render


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", choices=("reach", "push"), default="reach", help="task to step (default reach)")
    parser.add_argument("--n", type=int, nargs="+", default=[1, 16, 64], help="worlds N (default 1 16 64)")
    parser.add_argument("--steps", type=int, default=20, help="timed env steps per round and side (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--image-size", type=int, default=64, help="image side in pixels (default 64)")
    parser.add_argument("--device", default="cpu", help="where Warp runs: cpu or cuda[:K] (default cpu)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import mujoco
    import warp as wp

    print(
        f"{args.env}, {args.image_size}x{args.image_size} images, {args.steps} steps x {args.repeats} rounds; "
        f"mujoco {mujoco.__version__}, warp {wp.config.version} on {args.device}, MUJOCO_GL={os.environ['MUJOCO_GL']}, "
        f"{platform.processor() or platform.machine()}, load {os.getloadavg()[0]:.2f}"
    )
    rows = []
    for n in args.n:
        options = {"max_episode_steps": args.steps + 1, "image_size": args.image_size}
        if args.env == "reach":
            options["success_radius"] = -1.0  # never succeeds: every world steps every time on both sides
        envs = {
            "mujoco": sim.make(args.env, num_envs=n, backend="mujoco", **options),
            "warp": sim.make(args.env, num_envs=n, backend="warp", device=args.device, **options),
        }
        generator = torch.Generator().manual_seed(0)
        actions = torch.rand(args.steps, n, 2, generator=generator) * 2 - 1  # [T, N, 2]
        one_round(envs, actions[:2], flip=False)  # warm-up: kernel compilation or loading, first renders
        rounds = [one_round(envs, actions, flip=bool(r % 2)) for r in range(args.repeats)]
        rate = {name: n * args.steps / statistics.median(r[name] for r in rounds) for name in envs}
        physics, render = warp_split(envs["warp"], actions)
        rows.append((n, rate["mujoco"], rate["warp"], physics, render))
        for env in envs.values():
            env.close()

    print(
        f"\n{'N':>4}  {'mujoco steps/s':>15}  {'warp steps/s':>13}  {'warp/mujoco':>12}  {'warp physics':>13}  {'warp render':>12}"
    )
    for n, mujoco_rate, warp_rate, physics, render in rows:
        share = physics / (physics + render)
        print(
            f"{n:>4}  {mujoco_rate:>15.0f}  {warp_rate:>13.0f}  {warp_rate / mujoco_rate:>11.2f}x"
            f"  {share:>12.0%}  {1 - share:>11.0%}"
        )
    print(
        "\nsteps/s: N * steps / median seconds of a round (both sides interleaved). warp physics / render: the share of"
        f" the warp side's time in MuJoCo Warp's step and in its ray-traced render. load {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
