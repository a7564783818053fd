"""Held-out evaluation: greedy answers on seeds that training never sees."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import sim

from .policy.vlm import Sampling, VLMPolicy
from .rollout import collect_episodes

# Training seeds count up from 0 (step * prompts_per_step + prompt); held-out seeds start here. A run would need
# a billion prompts to reach them, and `train_seeds` refuses to.
EVAL_SEED_BASE = 1_000_000_000


def train_seeds(step: int, prompts_per_step: int, group_size: int, base: int = 0) -> list[int]:
    """Per-world seeds of one training step: B prompts, each repeated G times (contiguous groups)."""
    first = base + step * prompts_per_step
    if first + prompts_per_step > EVAL_SEED_BASE:
        raise ValueError("training seeds would reach the held-out range")
    return [first + b for b in range(prompts_per_step) for _ in range(group_size)]


def eval_seeds(episodes: int) -> list[int]:
    return [EVAL_SEED_BASE + i for i in range(episodes)]


@dataclass(frozen=True)
class EvalResult:
    metrics: dict[str, float]  # "reward", "success" (if any), "episode_steps" and every reward component, averaged
    images: torch.Tensor  # [K, H, W, 3] the first K held-out observations
    instructions: list[str]  # K
    texts: list[str]  # K greedy completions (the first turn's)
    info: dict  # the first step's info for the first K worlds (target_box, pred_box, ...)
    frames: torch.Tensor | None = None  # [K, S+1, H, W, 3] every observation of the first K episodes (multi-step)
    success: torch.Tensor | None = None  # [K] bool, whether each of those episodes succeeded


@torch.no_grad()
def evaluate(
    policy: VLMPolicy,
    env_name: str,
    env_options: dict,
    episodes: int = 200,
    batch_size: int = 100,
    max_new_tokens: int = 32,
    keep: int = 16,
) -> EvalResult:
    """Mean episode return, success and reward components of greedy play over `episodes` held-out episodes.

    Single-step tasks are one greedy answer per seed; multi-step ones run each episode to its end. Episodes run
    `batch_size` at a time; the per-episode sums of reward components are averaged over episodes.
    """
    if episodes < 1 or batch_size < 1:
        raise ValueError(f"evaluation needs episodes >= 1 and batch_size >= 1, got {episodes} and {batch_size}")
    seeds = eval_seeds(episodes)
    sums: dict[str, float] = {}
    first = None
    env = None
    greedy = Sampling(max_new_tokens=max_new_tokens, temperature=0.0)
    for start in range(0, episodes, batch_size):
        chunk = seeds[start : start + batch_size]
        if env is None or env.num_envs != len(chunk):
            if env is not None:
                env.close()
            env = sim.make(env_name, num_envs=len(chunk), **env_options)
        record = min(keep, len(chunk)) if first is None and env.max_episode_steps > 1 else 0
        eps = collect_episodes(policy, env, chunk, 1, greedy, record_frames=record)
        parts = {"reward": eps.returns(), **eps.components, "episode_steps": eps.env_steps}
        if eps.success is not None:
            parts["success"] = eps.success
        for k, v in parts.items():
            sums[k] = sums.get(k, 0.0) + float(v.float().sum())
        if first is None:
            first = eps
    if env is not None:
        env.close()
    k = min(keep, first.num_worlds)
    turn0 = (first.turn == 0).nonzero().squeeze(-1)[:k]  # rows of the first turn, in world order
    kept_info = {key: v[:k] for key, v in first.info.items() if isinstance(v, torch.Tensor | list)}
    return EvalResult(
        metrics={key: v / episodes for key, v in sums.items()},
        images=first.start.image[:k],
        instructions=first.start.instruction[:k],
        texts=[first.rollout.texts[i] for i in turn0.tolist()],
        info=kept_info,
        frames=first.frames,
        success=None if first.success is None else first.success[:k],
    )
