"""Collection throughput of the flow policy (tiny π0) against the action-token VLA (tiny Qwen3-VL) on `reach`, and
the flow policy's seconds per denoising step.

    .venv/bin/python bench/flow_collection.py --worlds 64 --repeats 3

Both play R worlds of `reach` (ego camera) to the end of their episodes with `collect_episodes`, sampling as in
training (temperature 1), with random weights (speed does not depend on what the weights know):
- π0: `tiny:pi0` at 64 px, chunks of 4 actions in 4 denoising steps (2 generations an 8-step episode);
- VLA: `tiny:qwen3_vl` + 17 action tokens per dimension at 128 px (configs/vla_reach_tiny.yaml), and at 64 px.
Per denoising step: the action expert's pass over R rows given the prompt cache (what `generate` runs K times), and
`logprobs`' forward + backward over R rows (the update's per-row cost).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco: it picks its GL backend at import
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository before bench/ (bench/rewards.py)

import torch  # noqa: E402

import sim  # noqa: E402
from mmrl.policy import add_action_tokens, build_tiny  # noqa: E402
from mmrl.policy.flow import FlowStats, build_tiny_flow  # noqa: E402
from mmrl.stages.rollout import collect_episodes  # noqa: E402
from mmrl.types import Sampling  # noqa: E402


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n, seeds = args.worlds, [1000 + i // 8 for i in range(args.worlds)]  # groups of 8 worlds

    def rate(policy, image_size: int) -> tuple[float, float]:
        env = sim.make("reach", num_envs=n, image_size=image_size, camera="ego")
        steps = []

        def play():
            steps.append(int(collect_episodes(policy, env, seeds, 8, Sampling()).env_steps.sum()))

        seconds = timed(play, args.repeats)
        env.close()
        return steps[-1] / seconds, seconds

    flow = build_tiny_flow(seed=0, stats=FlowStats((0.0,) * 4, (0.1,) * 4, (0.0, 0.0), (0.5, 0.5)))
    flow.model.eval()
    results = {"pi0 (64 px, C=4, K=4)": rate(flow, 64)}
    for size in (128, 64):
        vla = build_tiny("qwen3_vl", seed=0, prompt_template="{instruction} {image}")
        add_action_tokens(vla, torch.full((2,), -1.0), torch.full((2,), 1.0), 17, 1, seed=0)
        vla.model.eval()
        results[f"action-token VLA ({size} px, 2 tokens a step)"] = rate(vla, size)
    for name, (steps_per_s, seconds) in results.items():
        print(f"{name:45s} {steps_per_s:8.1f} env-steps/s  ({seconds:.2f} s for {n} episodes)")

    # Seconds per denoising step: the expert's pass over R rows on the prompt cache, and the scoring pass.
    env = sim.make("reach", num_envs=n, image_size=64, camera="ego")
    obs = env.reset(seed=seeds)
    rollout = flow.generate(obs, 8, Sampling())
    with torch.no_grad():
        inputs = flow.encode(obs)
        cache = flow.prefix_cache(inputs)
        x, t = rollout.chain[:, 0], torch.ones(n)
        step = timed(lambda: flow.velocity(cache, inputs["attention_mask"], inputs["state"], x, t), args.repeats * 3)
        prefix = timed(lambda: flow.prefix_cache(inputs), args.repeats * 3)
    flow.model.train()

    def score():
        flow.logprobs(rollout).sum().backward()
        flow.model.zero_grad(set_to_none=True)

    scoring = timed(score, args.repeats)
    env.close()
    print(f"denoising step (expert pass, {n} rows):      {step * 1000:.1f} ms  ({step / n * 1e6:.0f} us a row)")
    print(f"prompt cache (backbone pass, {n} rows):      {prefix * 1000:.1f} ms")
    print(f"logprobs forward+backward ({n} rows x K=4): {scoring * 1000:.1f} ms")


if __name__ == "__main__":
    main()
