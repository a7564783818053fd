"""What both kinds' demonstration collectors share: each episode's own noise stream."""

from __future__ import annotations

import torch

from sim.seeds import stream_seed


def episode_noise_seed(seed: int, episode: int) -> int:
    """The generator seed of demonstration episode `episode`'s noise in run seed `seed`: a hash of both, so no two
    episodes, and no other stream seeded with `seed` (the cold start's batches, the action-token rows), share draws."""
    return stream_seed("demonstration noise", seed, episode)


def episode_normal(generators: list[torch.Generator], like: torch.Tensor) -> torch.Tensor:
    """Standard normal draws shaped and placed like `like` (`[N, D]`), row n from world n's own generator."""
    return torch.stack([torch.randn(like.shape[1], generator=g) for g in generators]).to(like.device)
