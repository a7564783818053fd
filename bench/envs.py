"""Env-steps per second with images: our MuJoCo bridge (`sim.make("reach")`) against the raw MuJoCo loop.

The work per env step, for each of N worlds: set the gripper's two position setpoints from the action, run
`mj_step` `frame_skip` (10) times, and render the world's 64x64 image from the top camera with one shared
`mujoco.Renderer` (one `MjModel`, N `MjData`, no shadows).

* **bridge**: `env.step(actions)` with `actions` a `[N, 2]` float tensor. On top of the work above it validates,
  clips and converts the actions, measures distances before and after, scores (reward, components, success),
  keeps the episode flags, builds the `[N, S]` state and returns fresh tensors (images copied into a new
  `[N, 64, 64, 3]` tensor).
* **raw**: the same model file, N `MjData` and one `mujoco.Renderer`, in a bare Python loop over the worlds
  (`data.ctrl[:] = clip(qpos + a * scale)`, `mj_step(model, data, nstep=10)`, `update_scene`, `render(out=...)`),
  actions from a numpy array, images left in a numpy buffer.

Both sides start from the same states (worlds reset from seeds 0..N-1, copied into the raw loop's `MjData`) and
take the same uniform random actions, so they simulate and render the same trajectories. So that every world steps
every time on both sides, the bridge's episodes never end during the timing (`success_radius=-1` for reach,
`max_episode_steps` above the step count). The two sides are interleaved step by step (which goes first flips every
round), so load from other processes on a shared machine falls on both alike. The table gives env-steps per second
(N * steps / median seconds), `overhead` = median over rounds of bridge time / raw time - 1 (what the bridge costs
on top of the simulator's own work) with the lowest and highest round, and `extra/step` = the median extra time of
one `env.step` call (all N worlds) over the raw loop's step. Each round checks that both sides end on identical
images and that no bridge world ended early.

    .venv/bin/python bench/envs.py [--env reach|push] [--n 1 8 32 64] [--steps 50] [--repeats 5] [--threads 1]
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
import sim.robotics  # noqa: E402, F401  (registers the MuJoCo envs)
from sim.robotics.planar import MJCF_DIR, import_mujoco  # noqa: E402


# -------------------------------------------------------------------------------------------------------- THE SIDES
class RawLoop:
    """The same work without the bridge: N `MjData` of one model, one renderer, a Python loop over worlds."""

    def __init__(self, env, n: int, image_size: int):
        mujoco = import_mujoco()
        self.mujoco = mujoco
        self.model = mujoco.MjModel.from_xml_path(str(MJCF_DIR / env._xml))
        self.model.light_castshadow[:] = False  # as the env does with shadows=False
        self.datas = [mujoco.MjData(self.model) for _ in range(n)]
        self.renderer = mujoco.Renderer(self.model, image_size, image_size)
        self.camera = mujoco.MjvCamera()
        self.camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self.camera.fixedcamid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, "top")
        self.images = np.zeros((n, image_size, image_size, 3), dtype=np.uint8)  # [N, H, W, 3]
        self.scale, self.half, self.frame_skip = env.action_scale, env.half_width, env.frame_skip

    def copy_state(self, env) -> None:
        """Start from the env's current worlds, so both sides simulate the same trajectories."""
        for mine, theirs in zip(self.datas, env.datas):
            mine.qpos[:], mine.qvel[:], mine.ctrl[:] = theirs.qpos, theirs.qvel, theirs.ctrl
            mine.mocap_pos[:] = theirs.mocap_pos
            self.mujoco.mj_forward(self.model, mine)

    def step(self, actions: np.ndarray) -> None:
        """One step of every world; `actions` is `[N, 2]`."""
        model, mujoco, renderer, camera = self.model, self.mujoco, self.renderer, self.camera
        for k, data in enumerate(self.datas):
            data.ctrl[:2] = np.clip(data.qpos[:2] + actions[k] * self.scale, -self.half, self.half)
            mujoco.mj_step(model, data, nstep=self.frame_skip)
            renderer.update_scene(data, camera=camera)
            renderer.render(out=self.images[k])


def one_round(env, raw: RawLoop, actions: torch.Tensor, flip: bool) -> tuple[float, float]:
    """Seconds spent by the bridge and by the raw loop on the same `T` steps of N worlds; `actions` is `[T, N, 2]`.

    The two sides alternate step by step (the order flipped every other round), so load from other processes on a
    shared machine falls on both sides alike rather than on whichever ran during a busy second.
    """
    env.reset(seed=0)
    raw.copy_state(env)
    actions_np = actions.double().numpy()
    bridge = bare = 0.0
    for t in range(actions.shape[0]):
        for side in (1, 0) if flip else (0, 1):
            started = time.perf_counter()
            if side == 0:
                env.step(actions[t])
                bridge += time.perf_counter() - started
            else:
                raw.step(actions_np[t])
                bare += time.perf_counter() - started
    # Same work: both sides must end on the same worlds (pixel for pixel), and no bridge world may have ended early.
    if not np.array_equal(env._images, raw.images):
        raise RuntimeError("the bridge and the raw loop rendered different final images: not the same work")
    if (env._terminated | env._truncated).any():
        raise RuntimeError("some bridge worlds ended during the round and stopped stepping: not the same work")
    return bridge, bare


# -------------------------------------------------------------------------------------------------------- MAIN
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", choices=("reach", "push"), default="reach", help="task to step (default reach)")
    parser.add_argument("--n", type=int, nargs="+", default=[1, 8, 32, 64], help="worlds N (default 1 8 32 64)")
    parser.add_argument("--steps", type=int, default=50, help="timed env steps per round and side (default 50)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds, sides interleaved step by step (default 5)")
    parser.add_argument("--image-size", type=int, default=64, help="image side in pixels (default 64)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    mujoco = import_mujoco()
    print(
        f"{args.env}, {args.image_size}x{args.image_size} images, {args.steps} steps x {args.repeats} rounds; "
        f"mujoco {mujoco.__version__}, MUJOCO_GL={os.environ['MUJOCO_GL']}, torch {torch.__version__} "
        f"({args.threads} thread), {platform.processor() or platform.machine()}, load {os.getloadavg()[0]:.2f}"
    )

    rows = []
    for n in args.n:
        options = {"max_episode_steps": args.steps + 1, "image_size": args.image_size}
        if args.env == "reach":
            options["success_radius"] = -1.0  # never succeeds: every world steps every time, as in the raw loop
        env = sim.make(args.env, num_envs=n, **options)
        raw = RawLoop(env, n, args.image_size)
        generator = torch.Generator().manual_seed(0)
        actions = torch.rand(args.steps, n, 2, generator=generator) * 2 - 1  # [T, N, 2]
        one_round(env, raw, actions[:3], flip=False)  # warm-up: first renders, allocations
        bridge, bare = [], []
        for round_ in range(args.repeats):
            b, r = one_round(env, raw, actions, flip=bool(round_ % 2))
            bridge.append(b)
            bare.append(r)
        ratios = [b / r for b, r in zip(bridge, bare)]
        extra_us = statistics.median((b - r) / args.steps * 1e6 for b, r in zip(bridge, bare))  # per env.step call
        rows.append(
            (n, n * args.steps / statistics.median(bridge), n * args.steps / statistics.median(bare), ratios, extra_us)
        )
        env.close()
        raw.renderer.close()

    print()
    print(
        f"{'N':>4}  {'bridge steps/s':>15}  {'raw steps/s':>12}  {'overhead':>9}  {'round range':>17}  {'extra/step':>11}"
    )
    for n, bridge_rate, raw_rate, ratios, extra_us in rows:
        span = f"{min(ratios) - 1:+.1%} .. {max(ratios) - 1:+.1%}"
        overhead = statistics.median(ratios) - 1
        print(f"{n:>4}  {bridge_rate:>15.0f}  {raw_rate:>12.0f}  {overhead:>8.1%}  {span:>17}  {extra_us:>8.0f} us")
    print(
        "\nenv-steps/s: N * steps / median seconds of a round. overhead: median over rounds of bridge time / raw time"
        " - 1 (round range: lowest and highest round). extra/step: median (bridge - raw) seconds per env.step call"
        f" of all N worlds. load {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
