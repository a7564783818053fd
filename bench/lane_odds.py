"""Where a highway policy would change lane, and how RL moves that: P(lane change) per state, before and after.

RL on `configs/highway_tiny.yaml` drops every lane change (`bench/lane_changes.py`). Either the policy cannot tell
the states where a lane change pays from the others, or RL moves its lane changes down everywhere alike. This
plays the first checkpoint greedily on the held-out seeds that evaluation uses, records at every state what the
rule-based driver would do there, then has every checkpoint score the same states: the probability of a lane
change's first token (`L`, which `LANE_LEFT` and `LANE_RIGHT` share; IDLE, FASTER and SLOWER start with `I`, `F`,
`S`). Printed per checkpoint: mean P(L) where the driver changes lane and elsewhere, where the first checkpoint's
greedy answer changes lane, the AUC of P(L) for the driver's lane changes (1: P(L) ranks every such state above
every other; 0.5: no better than chance), and how often `L` is the most likely first token. Then the change of
P(L)'s log-odds from the first checkpoint to the last, in each kind of state.

    .venv/bin/python bench/lane_odds.py <cold_start> <checkpoint> [...] [--episodes 200] \\
        [env.options.image_size=96 env.options.view_length=60 ...]

Trailing `key=value` arguments override `configs/highway_tiny.yaml` (give the options the checkpoints were trained
with). Name answers only (`env.options.answer=name`, the preset's).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy.stats import mannwhitneyu  # noqa: E402  (the render extra, which make setup installs)

import sim  # noqa: E402
from mmrl.policy import load_policy  # noqa: E402
from mmrl.runtime.config import load_config  # noqa: E402
from mmrl.stages.rollout import collect_episodes  # noqa: E402
from mmrl.types import Sampling  # noqa: E402
from sim.seeds import eval_seeds  # noqa: E402

FIRST = "LIFS"  # the first letters of the meta-actions: a lane change, IDLE, FASTER, SLOWER


class DriverRecorder:
    """The highway env, recording the rule-based driver's meta-action in world w at step t before each step."""

    def __init__(self, env):
        self.env, self.driver, self._t = env, {}, 0

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self, seed, env_ids=None):
        self._t = 0
        return self.env.reset(seed, env_ids)

    def step(self, actions):
        for world, name in enumerate(self.env.expert_action()):
            self.driver[(world, self._t)] = name
        self._t += 1
        return self.env.step(actions)


def first_token_probs(policy, rollout, token_ids: dict[str, int], chunk: int = 64) -> dict[str, np.ndarray]:
    """`{letter: [M]}` the probability of each first token at each of `rollout`'s prompts under `policy`."""
    probs = {letter: [] for letter in token_ids}
    with torch.no_grad():
        for start in range(0, len(rollout), chunk):
            part = rollout.rows(start, min(start + chunk, len(rollout)))
            ones = torch.ones(len(part), 1, dtype=torch.bool)
            for letter, token in token_ids.items():
                one = dataclasses.replace(part, completion_ids=torch.full((len(part), 1), token), completion_mask=ones)
                probs[letter].append(policy.logprobs(one)[:, 0].exp())
    return {letter: torch.cat(chunks).numpy() for letter, chunks in probs.items()}


def auc(score: np.ndarray, positive: np.ndarray) -> float:
    """The probability that a positive state's score beats a negative one's (ties count half): Mann-Whitney's U."""
    if positive.all() or not positive.any():
        return float("nan")
    return float(mannwhitneyu(score[positive], score[~positive]).statistic / (positive.sum() * (~positive).sum()))


def log_odds(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-9, 1 - 1e-9)
    return np.log(p / (1 - p))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("items", nargs="+", metavar="checkpoint | key=value")
    parser.add_argument("--episodes", type=int, default=200)
    args = parser.parse_intermixed_args()
    checkpoints = [a for a in args.items if "=" not in a]
    cfg = load_config(ROOT / "configs" / "highway_tiny.yaml", [a for a in args.items if "=" in a])
    if cfg.env.options.get("answer", "name") != "name":
        raise SystemExit("lane_odds.py reads first letters of meta-action names: use env.options.answer=name")
    torch.set_num_threads(cfg.trainer.threads or torch.get_num_threads())
    policies = [load_policy(cfg.model, c) for c in checkpoints]
    env = DriverRecorder(sim.make("highway", args.episodes, **cfg.env.make_options()))
    torch.manual_seed(0)
    greedy = Sampling(max_new_tokens=cfg.sampling.max_new_tokens, temperature=0.0)
    episodes = collect_episodes(policies[0], env, eval_seeds(args.episodes), 1, greedy)
    env.close()
    rollout = episodes.rollout
    tokenizer = policies[0].processor.tokenizer
    driver = np.array([env.driver[(int(w), int(t))].startswith("LANE") for w, t in zip(episodes.world, episodes.turn)])
    answers = tokenizer.batch_decode(
        [ids[mask] for ids, mask in zip(rollout.completion_ids, rollout.completion_mask)], skip_special_tokens=True
    )
    greedy_lc = np.array([a.startswith("L") for a in answers])
    token_ids = {letter: tokenizer(letter, add_special_tokens=False)["input_ids"][0] for letter in FIRST}
    print(
        f"{len(rollout)} states of {args.episodes} greedy episodes of {checkpoints[0]}: the driver changes lane at "
        f"{driver.sum()}, the policy at {greedy_lc.sum()}, both at {(driver & greedy_lc).sum()}.\n"
    )
    print("| checkpoint | P(L) where the driver changes lane | elsewhere | where the first checkpoint did |"
          " AUC of P(L) for the driver's lane changes | L most likely |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    lane = {}
    for name, policy in zip(checkpoints, policies):
        probs = first_token_probs(policy, rollout, token_ids)
        lane[name] = probs["L"]
        top = probs["L"] > np.maximum.reduce([probs[letter] for letter in FIRST[1:]])
        print(
            f"| {name} | {probs['L'][driver].mean():.3f} | {probs['L'][~driver].mean():.3f} | "
            f"{probs['L'][greedy_lc].mean():.3f} | {auc(probs['L'], driver):.3f} | {top.mean():.3f} |",
            flush=True,
        )
    if len(checkpoints) > 1:
        change = log_odds(lane[checkpoints[-1]]) - log_odds(lane[checkpoints[0]])
        print(
            f"\nLog-odds of P(L), {checkpoints[0]} -> {checkpoints[-1]}: {change[driver].mean():+.2f} where the driver "
            f"changes lane, {change[~driver].mean():+.2f} elsewhere, {change[greedy_lc].mean():+.2f} where the first "
            "checkpoint did."
        )


if __name__ == "__main__":
    main()
