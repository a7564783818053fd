"""Held-out evaluation: greedy answers on seeds that training never sees."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import sim

from .policy.vlm import Sampling, VLMPolicy

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
    metrics: dict[str, float]  # "reward", "success" (if any) and every reward component, averaged
    images: torch.Tensor  # [K, H, W, 3] the first K held-out observations
    instructions: list[str]  # K
    texts: list[str]  # K greedy completions
    info: dict  # the first batch's step info (target_box, pred_box, ... for the first K)


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
    """Mean reward components of greedy answers over `episodes` held-out single-step episodes."""
    if episodes < 1 or batch_size < 1:
        raise ValueError(f"evaluation needs episodes >= 1 and batch_size >= 1, got {episodes} and {batch_size}")
    seeds = eval_seeds(episodes)
    sums: dict[str, float] = {}
    first = None
    env = None
    for start in range(0, episodes, batch_size):
        chunk = seeds[start : start + batch_size]
        if env is None or env.num_envs != len(chunk):
            if env is not None:
                env.close()
            env = sim.make(env_name, num_envs=len(chunk), **env_options)
        obs = env.reset(seed=chunk)
        rollout = policy.generate(obs, 1, Sampling(max_new_tokens=max_new_tokens, temperature=0.0))
        result = env.step(rollout.texts)
        parts = {"reward": result.reward, **result.info.get("reward_components", {})}
        if "success" in result.info:
            parts["success"] = result.info["success"]
        for k, v in parts.items():
            sums[k] = sums.get(k, 0.0) + float(v.float().sum())
        if first is None:
            first = (obs, rollout.texts, result.info)
    if env is not None:
        env.close()
    obs, texts, info = first
    k = min(keep, len(texts))
    kept_info = {key: v[:k] for key, v in info.items() if isinstance(v, torch.Tensor | list)}
    return EvalResult(
        metrics={key: v / episodes for key, v in sums.items()},
        images=obs.image[:k],
        instructions=obs.instruction[:k],
        texts=texts[:k],
        info=kept_info,
    )
