"""SRPO's progress rewards in the loop: trajectory embeddings from the policy's own vision tower, then the reward.

With `algo.progress_coef > 0` the trainer calls `with_progress_rewards` on each step's episodes, before the
advantages: every failed episode whose group has a success gains `mmrl.algos.progress.progress_rewards` at its last
turn, kept as the component `srpo` (the env may have a `progress` of its own), with `srpo/distance` (the mean
distance to the nearest success) and `srpo/scored_share` logged.

The latent space (the paper uses a pretrained video world model; the issue asks for "the policy's own vision features
or a small encoder"): each turn's observation is encoded by the policy's vision tower, its patch features averaged
into one vector per image and the row's images averaged (V camera views; with `model.history_turns` > 0 the earlier
turns' images a conversation row shows, too). A trajectory is then the mean of its turns' vectors next to its last
turn's, so both the path and where it ended count. No gradient flows through it.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..algos.progress import progress_rewards
from ..policy import Policy
from ..policy.lora import plain_model
from ..runtime import distributed
from ..runtime.config import AlgoConfig
from ..types import Episodes


@torch.no_grad()
def trajectory_embeddings(policy: Policy, episodes: Episodes) -> torch.Tensor:
    """`[R, 2H]` one vector per episode: mean over its turns of the turn's image features, then its last turn's."""
    rollout = episodes.rollout
    model = plain_model(policy.model)
    inner = getattr(model, "model", model)
    with distributed.full_weights(policy.model):
        out = inner.get_image_features(**policy.vision_inputs(rollout))
    pooled = out.pooler_output if hasattr(out, "pooler_output") else out
    if isinstance(pooled, torch.Tensor) or len(pooled) != len(rollout.image_units):
        # All images' features in one tensor (or one per sample, Idefics3's): split them per image.
        features = policy.processor.features(
            rollout.image_units.cpu(), {k: v.cpu() for k, v in rollout.image_inputs.items()}
        )
        pooled = (
            pooled if isinstance(pooled, torch.Tensor) else torch.cat([p.reshape(-1, p.shape[-1]) for p in pooled])
        )
        pooled = pooled.reshape(-1, pooled.shape[-1]).split(features.tolist())
    per_image = torch.stack([features.float().mean(0) for features in pooled])  # [I, H]
    counts = rollout.image_counts()  # [M]
    row_of_image = torch.repeat_interleave(torch.arange(len(counts)), counts)  # [I]
    per_row = torch.zeros(len(counts), per_image.shape[-1]).index_add(0, row_of_image, per_image)
    per_row = per_row / counts.clamp(min=1).unsqueeze(-1)  # [M, H]
    worlds = episodes.num_worlds
    turns = torch.zeros(worlds).index_add(0, episodes.world, torch.ones(len(counts)))  # [R]
    mean = torch.zeros(worlds, per_row.shape[-1]).index_add(0, episodes.world, per_row) / turns.clamp(min=1)[:, None]
    last_turn = torch.full((worlds,), -1, dtype=torch.long).scatter_reduce(0, episodes.world, episodes.turn, "amax")
    last = torch.zeros(worlds, per_row.shape[-1])
    is_last = episodes.turn == last_turn[episodes.world]  # [M]
    last[episodes.world[is_last]] = per_row[is_last]
    return torch.cat([mean, last], dim=-1)


def with_progress_rewards(policy: Policy, episodes: Episodes, ac: AlgoConfig) -> tuple[Episodes, dict[str, float]]:
    """The episodes with SRPO's progress reward added at each failed episode's last turn (component `progress`),
    and its metrics. Unchanged where `algo.progress_coef` is 0 or the env reports no success."""
    if ac.progress_coef <= 0 or episodes.success is None:
        return episodes, {}
    embeddings = trajectory_embeddings(policy, episodes)
    rewards, distances = progress_rewards(
        embeddings, episodes.success, group_size=ac.group_size, coef=ac.progress_coef
    )  # [R], [R]
    last_turn = (episodes.active.long().sum(-1) - 1).clamp(min=0)  # [R]
    step_rewards = episodes.step_rewards.index_put(
        (torch.arange(episodes.num_worlds), last_turn), rewards, accumulate=True
    )
    scored = ~torch.isnan(distances)
    metrics = {
        "srpo/scored_share": float(scored.float().mean()),
        "srpo/distance": float(distances[scored].mean()) if scored.any() else 0.0,
    }
    return replace(episodes, step_rewards=step_rewards, components={**episodes.components, "srpo": rewards}), metrics
