"""What a highway policy's lane changes earn: each episode's first lane change against IDLE forced at that step.

RL on `configs/highway_tiny.yaml` drops every lane change, which keeps its return near 0.735. This asks whether
the lane changes it drops were worth keeping. Each checkpoint (or `expert`, the rule-based driver) plays the
held-out seeds that evaluation uses, then plays them again with IDLE forced at each episode's first lane change and
the same policy after it. The returns of those episodes are compared, with how many crashed (return <= -0.5).

- Greedy (`--temperature 0`, the default): the worlds are deterministic, so an episode with no lane change replays
  to the same return. The script checks this.
- Sampled: the forced world takes other tokens and shifts the random stream of every world, so the comparison
  also carries that noise.

    .venv/bin/python bench/lane_changes.py expert <checkpoint> [...] [--episodes 200] [--temperature 1.0] \\
        [env.options.image_size=96 env.options.view_length=60 ...]

Trailing `key=value` arguments override `configs/highway_tiny.yaml`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sim  # noqa: E402
from mmrl.policy import load_policy  # noqa: E402
from mmrl.runtime.config import load_config  # noqa: E402
from mmrl.stages.rollout import collect_episodes  # noqa: E402
from mmrl.types import Sampling  # noqa: E402
from sim.seeds import eval_seeds  # noqa: E402

LANE_CHANGES = ("LANE_LEFT", "LANE_RIGHT")
CRASH = -0.5  # a collision ends the episode at -1; no episode without one returns this little


class ForcedIdle:
    """The highway env with IDLE executed in world i at its step `force[i]`; sums each world's return and records the
    meta-actions it executed. Everything else is the wrapped env's."""

    def __init__(self, env, force: dict[int, int]):
        self.env, self.force = env, force
        self.returns = np.zeros(env.num_envs)
        self.executed: list[list[str]] = [[] for _ in range(env.num_envs)]
        self._t = 0

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self, seed, env_ids=None):
        self._t = 0
        self.returns[:] = 0.0
        self.executed = [[] for _ in range(self.env.num_envs)]
        return self.env.reset(seed, env_ids)

    def step(self, actions):
        actions = list(actions)
        for world, step in self.force.items():
            if step == self._t:
                actions[world] = "IDLE"
        result = self.env.step(actions)
        self.returns += result.reward.numpy()
        for world, name in enumerate(result.info["action"]):
            if name:  # "" for a world whose episode has ended
                self.executed[world].append(name)
        self._t += 1
        return result


def play(policy, env, seeds: list[int], force: dict[int, int], sampling: Sampling) -> ForcedIdle:
    """One episode per seed, by `policy` (a VLMPolicy, or "expert"), with IDLE forced where `force` says."""
    wrapped = ForcedIdle(env, force)
    if policy == "expert":
        wrapped.reset(seeds)
        for _ in range(env.max_episode_steps):
            wrapped.step(env.expert_action())
    else:
        torch.manual_seed(0)
        collect_episodes(policy, wrapped, seeds, 1, sampling)
    return wrapped


def compare(name: str, cfg, episodes: int, temperature: float) -> str:
    """The Markdown row of one policy: its first lane changes against IDLE at the same step."""
    policy = name if name == "expert" else load_policy(cfg.model, name)
    env = sim.make("highway", episodes, **cfg.env.make_options())
    seeds = eval_seeds(episodes)
    sampling = Sampling(max_new_tokens=cfg.sampling.max_new_tokens, temperature=temperature)
    played = play(policy, env, seeds, {}, sampling)
    first = {}
    for world, names in enumerate(played.executed):
        steps = [t for t, action in enumerate(names) if action in LANE_CHANGES]
        if steps:
            first[world] = steps[0]
    base = played.returns.copy()
    per_episode = np.mean([sum(a in LANE_CHANGES for a in names) for names in played.executed])
    row = f"| {name} | {base.mean():.3f} | {len(first)} of {episodes} ({per_episode:.2f} an episode) |"
    if not first:
        env.close()
        return row + " - | - | - | - |"
    forced = play(policy, env, seeds, first, sampling).returns
    env.close()
    changed = np.array(sorted(first))
    kept = np.setdiff1d(np.arange(episodes), changed)
    if temperature == 0 and not np.allclose(base[kept], forced[kept]):
        raise RuntimeError("greedy episodes without a lane change did not replay to the same return")
    gain = base[changed] - forced[changed]
    se = gain.std(ddof=1) / np.sqrt(len(gain)) if len(gain) > 1 else float("nan")
    return (
        row + f" {base[changed].mean():.3f} -> {forced[changed].mean():.3f} | {gain.mean():+.3f} +- {se:.3f} | "
        f"{np.mean(gain > 1e-6):.2f} / {np.mean(gain < -1e-6):.2f} | "
        f"{np.mean(base[changed] <= CRASH):.2f} -> {np.mean(forced[changed] <= CRASH):.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("items", nargs="+", metavar="expert | checkpoint | key=value")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_intermixed_args()
    policies = [a for a in args.items if "=" not in a]
    cfg = load_config(ROOT / "configs" / "highway_tiny.yaml", [a for a in args.items if "=" in a])
    torch.set_num_threads(cfg.trainer.threads or torch.get_num_threads())
    print(
        f"Temperature {args.temperature}, {args.episodes} held-out seeds.\n\n"
        "| policy | mean return | episodes with a lane change | their return -> with IDLE forced at the first |"
        " lane change's gain (mean +- se) | better / worse | crashed -> crashed |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in policies:
        print(compare(name, cfg, args.episodes, args.temperature), flush=True)


if __name__ == "__main__":
    main()
