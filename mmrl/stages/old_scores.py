"""The no-grad pass before the update: what must be read before the weights move.

* **Old log-probs.** With several optimiser steps per rollout (`algo.ppo_epochs` x mini-batches) and
  `recompute_old_logprobs`, the trainer's own log-probs of the rollout under the weights that are about to move are
  the old ones of the ratio; the sampler's stay beside them to measure and correct the mismatch (rollout correction).
  With one optimiser step the update's own forward serves, and nothing runs here for them.
* **Values.** With a critic (`algo.advantage: gae`), the value of each row's starting state, read from the same
  forward's hidden state: GAE's advantages and the clipped value loss need the values before the update.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ..methods import critic as critic_head
from ..methods.critic import Critic
from ..policy import Policy
from ..runtime.config import TrainConfig
from ..runtime.distributed import World
from ..types import Episodes, Sampling
from .batching import micro_batches, mini_batch_count


@dataclass(frozen=True)
class OldScores:
    """What the update needs from before its first optimiser step."""

    logprobs: torch.Tensor | None  # [M, L] per token, the trainer's old log-probs when recomputed (else None)
    values: torch.Tensor | None  # [M] the critic's value of each row's starting state (else None)


def optimizer_steps(episodes: Episodes, cfg: TrainConfig, world: World) -> int:
    """The optimiser steps the update takes on `episodes`: `algo.ppo_epochs` x mini-batches of the groups of every
    process."""
    ac = cfg.algo
    return ac.ppo_epochs * mini_batch_count(world.sum(episodes.num_worlds // ac.group_size), ac.mini_batch_groups)


@torch.no_grad()
def old_scores(
    policy: Policy, critic: Critic | None, episodes: Episodes, cfg: TrainConfig, sampling: Sampling, world: World
) -> OldScores:
    """One no-grad pass over the step's rows for the old log-probs (when recomputed) and the critic's values."""
    recompute = cfg.recompute_old_logprobs and optimizer_steps(episodes, cfg, world) > 1
    if not recompute and critic is None:
        return OldScores(None, None)
    rollout, tc = episodes.rollout, cfg.trainer
    old = torch.zeros_like(rollout.logprobs) if recompute else None
    values = torch.zeros(len(rollout)) if critic is not None else None
    left = critic_head.turns_left(episodes.turn, episodes.step_rewards.shape[1])  # [M, 1]
    for mb in micro_batches(
        rollout, torch.zeros(len(rollout)), None, micro_batch_size=tc.micro_batch_size,
        token_budget=tc.token_budget, aggregation=cfg.algo.aggregation, world=world,
    ):  # fmt: skip
        rows = slice(mb.start, mb.start + len(mb.rollout))
        real = mb.weight > 0 or mb.row_weight > 0  # an idle micro-batch (torchrun) scores a stand-in row
        with critic.reading() if critic is not None else nullcontext():
            logprobs = policy.logprobs(mb.rollout, temperature=sampling.temperature)
        if critic is not None:
            read = critic.values(turns_left=left[rows]).cpu()
            if real:
                values[rows] = read
        if old is not None and real:
            old[rows, : logprobs.shape[1]] = logprobs.to(old.dtype)
    if old is not None:
        old = torch.where(rollout.completion_mask, old, torch.zeros_like(old))
    return OldScores(old, values)
