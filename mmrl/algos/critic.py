"""Advantages from a learned value function: GAE over an episode's turns, and the clipped value loss.

`algo.advantage: gae` selects this path (`CRITIC_ADVANTAGES`): a value head (`mmrl.methods.critic`) gives one value per turn
(the state a generation starts from: the prompt with its image), and

    delta_t = r_t + gamma * V(s_{t+1}) * (1 - done_t) - V(s_t)
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}        (GAE, https://arxiv.org/abs/1506.02438)
    R_t     = A_t + V(s_t)                                          (the value target)

A turn is one generation: a text env's answer, a GUI action, a VLA action chunk. A single-step task is the case
T = 1, where `A = r - V(s)`: the value is a learned per-prompt baseline instead of the group's mean. An episode's
last turn bootstraps from 0 (the next state's value is never generated; a time-limit truncation is treated as an
end, as most VLA RL code does).
"""

from __future__ import annotations

import torch

from .base import CRITIC_ADVANTAGES, LossOutput


@CRITIC_ADVANTAGES.register("gae")
def gae_advantages(
    rewards: torch.Tensor, values: torch.Tensor, active: torch.Tensor, *, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over turns.

    Args:
        rewards: `[R, T]` each turn's reward (anything after an episode's end).
        values: `[R, T]` the value of the state each turn started from (anything where inactive).
        active: `[R, T]` bool, the world generated at turn t; an episode's turns are a prefix of its row.
        gamma: discount per turn.
        lam: GAE's lambda (1: Monte-Carlo returns minus the value; 0: one-step TD errors).

    Returns:
        `(advantages, returns)`, both `[R, T]`, 0 where inactive.
    """
    active = active.bool()
    rewards = torch.where(active, rewards.float(), torch.zeros_like(rewards, dtype=torch.float32))
    values = torch.where(active, values.float(), torch.zeros_like(values, dtype=torch.float32))
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])  # [R] A_{t+1}
    next_value = torch.zeros_like(rewards[:, 0])  # [R] V(s_{t+1}), 0 past the end
    # A reverse scan over turns (T of them), vectorised over the R episodes; the recurrence is sequential in t.
    for t in range(rewards.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(active[:, t], delta + gamma * lam * running, torch.zeros_like(running))
        advantages[:, t] = running
        next_value = torch.where(active[:, t], values[:, t], torch.zeros_like(next_value))
    return advantages, torch.where(active, advantages + values, torch.zeros_like(values))


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, *, clip: float) -> LossOutput:
    """The clipped value loss of PPO implementations (`0.5 * max((V - R)^2, (V_clipped - R)^2)`, mean over rows).

    Args:
        values: `[r]` the head's values now, with gradients.
        old_values: `[r]` its values before the step's first update (the ones GAE used).
        returns: `[r]` the targets.
        clip: `V_clipped = old + clamp(V - old, -clip, clip)`; 0 turns the clip off.

    Returns:
        `LossOutput` with metrics `value/loss` and `value/clip_fraction` (rows whose clipped error is the larger).
    """
    unclipped = (values - returns).square()
    if clip <= 0:
        loss = 0.5 * unclipped.mean() if len(values) else values.sum()
        return LossOutput(loss=loss, metrics={"value/loss": loss.detach(), "value/clip_fraction": torch.zeros(())})
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    clipped = (clipped_values - returns).square()
    loss = 0.5 * torch.maximum(unclipped, clipped).mean() if len(values) else values.sum()
    with torch.no_grad():
        fraction = (clipped > unclipped).float().mean() if len(values) else torch.zeros(())
    return LossOutput(loss=loss, metrics={"value/loss": loss.detach(), "value/clip_fraction": fraction})


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """`1 - Var(target - predicted) / Var(target)`: 1 a perfect critic, 0 no better than a constant, NaN if flat."""
    variance = target.var(unbiased=False)
    return 1 - (target - predicted).var(unbiased=False) / variance if variance > 0 else torch.tensor(float("nan"))
