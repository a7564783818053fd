"""Where a reach policy's greedy episodes end: on the named disc, on another disc, or on none.

The reach task names one of three coloured discs. An episode that fails can fail two ways: the policy goes to a
disc, but the wrong one (it did not bind the colour in the instruction to what it sees), or it reaches no disc at all
in its 8 steps. This script plays each checkpoint greedily on the held-out seeds that evaluation uses and splits the
episodes so, per named colour too, with the figures for a policy that ignored the colour (the share of episodes whose
named disc is the one nearest the start).

    .venv/bin/python bench/reach_failures.py <checkpoint> [<checkpoint> ...] [--episodes 200] [key=value ...]

Trailing `key=value` arguments override `configs/vla_reach_tiny.yaml` (for instance `env.options.num_targets=2`).
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
from sim.robotics.planar import COLOURS  # noqa: E402
from sim.seeds import eval_seeds  # noqa: E402


def ends(checkpoint: str, cfg, episodes: int) -> dict[str, np.ndarray]:
    """Greedy play of `checkpoint` on the first `episodes` held-out seeds; per episode, where it ended.

    The discs come from the env's documented state at reset (`[N, 4 + 3K]`: gripper xy, the named target's xy, every
    disc's xy, every disc's colour index); they do not move, so only the gripper is read again at the end."""
    policy = load_policy(cfg.model, checkpoint)
    env = sim.make("reach", episodes, **cfg.env.make_options())
    seeds = eval_seeds(episodes)
    state = env.reset(seed=seeds).state.cpu().numpy().astype(np.float64)  # [R, 4 + 3K]
    k = (state.shape[1] - 4) // 3
    start, target = state[:, 0:2], state[:, 2:4]
    discs = state[:, 4 : 4 + 2 * k].reshape(episodes, k, 2)  # [R, K, 2]
    colours = state[:, 4 + 2 * k :].astype(int)  # [R, K]
    named = np.linalg.norm(discs - target[:, None], axis=2).argmin(1)  # [R]: the named disc's slot
    collect_episodes(policy, env, seeds, 1, Sampling(max_new_tokens=cfg.sampling.max_new_tokens, temperature=0.0))
    to_disc = np.linalg.norm(discs - env.gripper_xy[:, None], axis=2)  # [R, K]: where each episode ended
    on_a_disc = to_disc.min(1) <= env.success_radius
    which = to_disc.argmin(1)
    rows = np.arange(episodes)
    out = {
        "named": on_a_disc & (which == named),
        "other": on_a_disc & (which != named),
        "none": ~on_a_disc,
        "named_nearest": np.linalg.norm(discs - start[:, None], axis=2).argmin(1) == named,
        "colour": colours[rows, named],
        "to_named": to_disc[rows, named],
    }
    env.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("items", nargs="+", metavar="checkpoint | key=value")
    parser.add_argument("--episodes", type=int, default=200)
    args = parser.parse_args()
    checkpoints = [a for a in args.items if "=" not in a]
    overrides = [a for a in args.items if "=" in a]
    cfg = load_config(ROOT / "configs" / "vla_reach_tiny.yaml", overrides)
    torch.set_num_threads(cfg.trainer.threads or torch.get_num_threads())
    print(
        f"| checkpoint | on the named disc | on another disc | on none | named disc nearest the start | "
        f"on the named disc, by named colour ({', '.join(COLOURS)}) | distance to the named disc when on none "
        f"(median, m) |"
    )
    print("|---|---|---|---|---|---|---|")
    for checkpoint in checkpoints:
        e = ends(checkpoint, cfg, args.episodes)
        by_colour = ", ".join(
            f"{e['named'][e['colour'] == c].mean():.2f}" if (e["colour"] == c).any() else "-"
            for c in range(len(COLOURS))
        )
        far = f"{np.median(e['to_named'][e['none']]):.3f}" if e["none"].any() else "-"
        print(
            f"| {checkpoint} | {e['named'].mean():.3f} | {e['other'].mean():.3f} | {e['none'].mean():.3f} | "
            f"{e['named_nearest'].mean():.3f} | {by_colour} | {far} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
