"""SRPO's progress reward for failed episodes, as a pure tensor function (https://arxiv.org/abs/2511.15605).

Self-Referential Policy Optimization rewards a failed trajectory by how close it came to the batch's own successful
ones, measured in a latent space rather than in pixels, so GRPO gets a signal from groups whose binary rewards
would otherwise carry little. The paper encodes whole trajectories with a pretrained world model (V-JEPA 2),
clusters the successful ones and maps each failure's L2 distance to the nearest cluster centre to a reward below a
success's. Here, as the paper's recipe adapted to what a CPU run has:

* the reference set is the successes of the failure's own group (the G episodes from one seed: the same task and
  initial state, which is what "the same task in the batch" means for a seeded env); a group without a success gives
  its failures nothing, as GRPO would;
* every success is its own cluster centre (the nearest success, no clustering step: groups hold a handful);
* distances are standardised over the batch's failures that have a reference (`z`), and the reward is
  `coef * sigmoid(-z)`, in (0, coef): the closer failure gets more, whatever the embedding's scale.

The embeddings come from `mmrl.methods.progress` (the policy's own vision features along the trajectory).
"""

from __future__ import annotations

import torch


def progress_rewards(
    embeddings: torch.Tensor,
    success: torch.Tensor,
    *,
    group_size: int,
    coef: float,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The progress reward of each failed episode against its group's successes.

    Args:
        embeddings: `[R, D]` one embedding per episode, groups of `group_size` contiguous.
        success: `[R]` bool.
        group_size: G.
        coef: the largest progress reward; a failure at the batch's average distance gets `coef`/2, a closer one
            more, a farther one less.
        eps: keeps a batch whose reference distances are all equal at `coef`/2 each instead of 0/0.

    Returns:
        `([R] rewards, [R] distances)`: 0 reward for successes and for failures without a success in their group;
        the distance to the nearest success of the group (NaN where there is none, or for a success).
    """
    rows = embeddings.shape[0]
    if rows % group_size or success.shape != (rows,):
        raise ValueError(f"{rows} embeddings and success {tuple(success.shape)} do not make groups of {group_size}")
    grouped = embeddings.float().view(-1, group_size, embeddings.shape[-1])  # [B, G, D]
    won = success.bool().view(-1, group_size)  # [B, G]
    dist = torch.cdist(grouped, grouped)  # [B, G, G] pairwise L2 within each group
    dist = dist.masked_fill(~won.unsqueeze(1), float("inf"))  # only successes are references
    nearest = dist.min(dim=-1).values  # [B, G]
    scored = ~won & torch.isfinite(nearest)  # failures that have a reference
    distances = torch.where(scored, nearest, torch.full_like(nearest, float("nan"))).view(-1)
    rewards = torch.zeros(rows)
    picked = scored.view(-1)
    if picked.any():
        d = nearest.view(-1)[picked]
        z = (d - d.mean()) / (d.std(unbiased=False) + eps)
        rewards[picked] = coef * torch.sigmoid(-z)
    return rewards, distances
