"""Flow-SDE's and Flow-Noise's math for a flow policy (`mmrl.policy.flow`, whose docstring derives it): the denoising
schedule, one SDE transition's mean and std, a Gaussian's log-density, Flow-Noise's learned noise head, and the tap
a critic reads a flow policy's state features from. Pure tensor functions and two small modules."""

from __future__ import annotations

import math

import torch
from torch import nn

NOISE_STD_RANGE = (0.08, 0.16)  # Flow-Noise's [min, max] std per action dimension (RLinf's noise_logvar_range)


# ---------------------------------------------------------------------------------------------- Flow-SDE math


def sde_schedule(num_steps: int, noise_level: float) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The denoising times `t` `[K]` (1, 1 - 1/K, ..., 1/K), Flow-SDE's `sigma_t` `[K]`, and `dt = -1/K`."""
    t = 1.0 - torch.arange(num_steps, dtype=torch.float64) / num_steps
    # sigma_t is infinite at t = 1: the first step takes the second step's value (Flow-GRPO's sigma_max).
    capped = t.clamp(max=1.0 - 1.0 / num_steps) if num_steps > 1 else t * 0
    sigma = noise_level * torch.sqrt(capped / (1.0 - capped))
    return t.float(), sigma.float(), -1.0 / num_steps


def sde_step(
    x: torch.Tensor, velocity: torch.Tensor, t: torch.Tensor, sigma: torch.Tensor, dt: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of one Flow-SDE transition from `x` at time `t`.

    Args:
        x: `[B, C, A]` the chain's current value.
        velocity: `[B, C, A]` the model's velocity at (x, t).
        t: `[B]` times; sigma: `[B]` noise scales; dt: the (negative) step.

    Returns:
        mean `[B, C, A]` and std `[B, 1, 1]`; with sigma 0 the mean is the ODE step `x + v dt`.
    """
    t, sigma = t.view(-1, 1, 1).to(x.dtype), sigma.view(-1, 1, 1).to(x.dtype)
    drift = velocity + sigma**2 / (2 * t) * (x + (1 - t) * velocity)
    return x + drift * dt, sigma * math.sqrt(abs(dt))


def gaussian_logprob(value: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """`[B]` log-density of `value` under N(mean, std^2 I), summed over every dimension but the first."""
    z = (value - mean) / std
    per_dim = -0.5 * z**2 - torch.log(std) - 0.5 * math.log(2 * math.pi)
    return per_dim.flatten(1).sum(-1)


class NoiseHead(nn.Module):
    """Flow-Noise's learned noise: the expert's hidden state of each action position `[B, C, H]` -> the std of each
    action dimension `[B, C, A]`, `exp` of a log-std squashed into `log(std_range)`. The last layer starts at zero,
    so every std starts at the range's geometric mean; the first draws from `seed`."""

    def __init__(self, hidden_size: int, action_dim: int, width: int = 64, std_range=NOISE_STD_RANGE, seed: int = 0):
        super().__init__()
        low, high = std_range
        if not 0 < low <= high:
            raise ValueError(f"the noise head's std range must be 0 < min <= max, got {std_range}")
        self.log_low, self.log_high = math.log(low), math.log(high)
        first, last = nn.Linear(hidden_size, width), nn.Linear(width, action_dim)
        with torch.no_grad():
            first.weight.copy_(torch.randn(width, hidden_size, generator=torch.Generator().manual_seed(seed)))
            first.weight.div_(hidden_size**0.5)
            first.bias.zero_()
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.net = nn.Sequential(first, nn.Tanh(), last)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        share = (torch.tanh(self.net(hidden.float())) + 1) / 2  # [B, C, A] in (0, 1)
        return torch.exp(self.log_low + (self.log_high - self.log_low) * share)


class ValueTap(nn.Identity):
    """Where a critic reads a flow policy's state features (`[B, 1, in_features]`, see the module docstring): an
    identity with no parameters, so it adds nothing to the model's weights."""

    def __init__(self, in_features: int):
        super().__init__()
        self.in_features = in_features
