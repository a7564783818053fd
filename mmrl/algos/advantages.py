"""Advantage estimators over contiguous groups: rows [g*G, (g+1)*G) are one group.

Every registered estimator has the same call, `fn(rewards, *, group_size, scale_by_std, eps) -> [R]`, so the
trainer swaps them by name. An estimator whose definition fixes the scaling (Dr. GRPO never scales, REINFORCE++
always scales by the batch) accepts `scale_by_std` and ignores it, as its docstring says.
"""

from __future__ import annotations

from typing import Literal

import torch

from .base import ADVANTAGES, STEP_ADVANTAGES

Scale = Literal["group", "batch", "none"]


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size < 1 or rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    return rewards.view(-1, group_size)  # [B, G]


@ADVANTAGES.register("grpo")
def grpo_advantages(
    rewards: torch.Tensor,
    *,
    group_size: int,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    scale: Scale | None = None,
) -> torch.Tensor:
    """Group-relative advantages (GRPO, https://arxiv.org/abs/2402.03300, eq. 3).

    Each reward minus its group's mean, divided by a standard deviation chosen by `scale`:

    * `group`: the group's own (the original GRPO). Dr. GRPO (https://arxiv.org/abs/2503.20783) shows this
      up-weights groups that are nearly all right or all wrong (a difficulty bias).
    * `batch`: the standard deviation of all R raw rewards of the batch, one number for every group; keeps the
      scale of the gradient steady without the per-group bias (TRL's `scale_rewards="batch"`).
    * `none`: no division (Dr. GRPO; the same as the `dr_grpo` estimator).

    Args:
        rewards: `[R]` with R = B*G, groups contiguous.
        group_size: G.
        scale_by_std: `scale="group"` when True, `"none"` when False; used only when `scale` is None.
        eps: keeps groups whose rewards are all equal at zero advantage instead of 0/0.
        scale: `group`, `batch` or `none`; overrides `scale_by_std`.

    Returns:
        `[R]` advantages, zero for groups whose rewards are all equal.
    """
    grouped = _grouped(rewards, group_size)  # [B, G]
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    scale = scale if scale is not None else ("group" if scale_by_std else "none")
    if scale == "group":
        if group_size > 1:  # std of one sample is NaN; its centred reward is already 0
            centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        if rewards.numel() > 1:
            centred = centred / (rewards.std() + eps)
    elif scale != "none":
        raise ValueError(f"unknown scale {scale!r}; use group, batch or none")
    return centred.reshape(-1)


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(
    rewards: torch.Tensor, *, group_size: int, scale_by_std: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """Dr. GRPO advantages (https://arxiv.org/abs/2503.20783): reward minus group mean.

    Pair with `aggregation="seq_mean_token_sum_norm"` for the full Dr. GRPO objective.

    Args:
        rewards: `[R]` with R = B*G, groups contiguous.
        group_size: G.
        scale_by_std: ignored; never scaling is what defines Dr. GRPO.
        eps: ignored (nothing is divided).

    Returns:
        `[R]`.
    """
    return grpo_advantages(rewards, group_size=group_size, eps=eps, scale="none")


@ADVANTAGES.register("rloo")
def rloo_advantages(
    rewards: torch.Tensor, *, group_size: int, scale_by_std: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """REINFORCE leave-one-out (RLOO, https://arxiv.org/abs/2402.14740): `r_i - mean of the other G-1 rewards`.

    The baseline excludes the sample itself, so it is unbiased; algebraically `A_i = G/(G-1) * (r_i - mean)`.

    Args:
        rewards: `[R]` with R = B*G, groups contiguous.
        group_size: G >= 2 (with one sample there is no other to compare against).
        scale_by_std: ignored; RLOO does not scale.
        eps: ignored.

    Returns:
        `[R]`.
    """
    if group_size < 2:
        raise ValueError("rloo needs group_size >= 2")
    grouped = _grouped(rewards, group_size)  # [B, G]
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)  # [B, G]
    return (grouped - others_mean).reshape(-1)


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp_advantages(
    rewards: torch.Tensor, *, group_size: int, scale_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """REINFORCE++-baseline (https://arxiv.org/abs/2501.03262): group mean baseline, batch normalisation.

    `A = r - mean_group(r)`, then `A / (std_batch(A) + eps)` over all R advantages of the batch. Normalising by the
    batch instead of the group is the paper's point: a group's own std over-weights easy and hard prompts.
    After subtracting group means the batch mean of `A` is exactly zero, so whitening reduces to that division.

    verl's `compute_reinforce_plus_plus_baseline_outcome_advantage` whitens the advantage broadcast over tokens,
    which weights each completion by its length; with one reward per completion and no lengths in this call,
    every completion counts once here.

    Args:
        rewards: `[R]` with R = B*G, groups contiguous.
        group_size: G.
        scale_by_std: ignored; the batch normalisation is part of the estimator.
        eps: added to the batch standard deviation (all-equal batches stay at zero).

    Returns:
        `[R]`.
    """
    grouped = _grouped(rewards, group_size)  # [B, G]
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)  # [R]
    if centred.numel() < 2:
        return centred
    return centred / (centred.std() + eps)


@STEP_ADVANTAGES.register("grpo")
def step_group_advantages(
    returns: torch.Tensor,
    active: torch.Tensor,
    group_size: int,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    state_keys: torch.Tensor | None = None,
    step_weight: float = 1.0,
) -> torch.Tensor:
    """Step-level GRPO credit: each turn's return normalised against the same turn of the other group members.

    Episode-level credit gives every turn of an episode the episode's advantage. Step-level grouping compares, at
    each turn t, the returns-to-go of the G worlds of a group that are still running at t (they started from the
    same state, so turn t is comparable across them); a world that ended earlier takes no part.

    Args:
        returns: `[R, T]` returns-to-go of each turn (`discounted_returns`).
        active: `[R, T]` bool, the world acted at turn t.
        group_size: G.
        scale_by_std: divide by the (unbiased) standard deviation of the turn's active returns in the group.
        eps: keeps equal returns at zero advantage instead of 0/0.
        state_keys: unused (GiGPO's anchor states; every step estimator takes the same arguments).
        step_weight: unused (GiGPO's).

    Returns:
        `[R, T]` advantages, 0 where `active` is False and where fewer than 2 group members are active.
    """
    num, turns = returns.shape
    act = active.bool()
    turn = torch.arange(turns, device=returns.device).expand(num, turns)  # [R, T]
    segments = _row_groups(num, group_size, returns.device) * turns + turn  # [R, T] (prompt group, turn)
    out = torch.zeros(num, turns, device=returns.device)
    out[act] = _normalised_within(returns[act].float(), segments[act], scale_by_std=scale_by_std, eps=eps)
    return out


@STEP_ADVANTAGES.register("dr_grpo")
def step_dr_grpo_advantages(
    returns: torch.Tensor,
    active: torch.Tensor,
    group_size: int,
    *,
    scale_by_std: bool = False,
    eps: float = 1e-6,
    state_keys: torch.Tensor | None = None,
    step_weight: float = 1.0,
) -> torch.Tensor:
    """Dr. GRPO's step credit: each active turn's return-to-go minus the mean over the group's active worlds at that
    turn, never scaled (`scale_by_std` is ignored, as in `dr_grpo_advantages`; `state_keys`, `step_weight` unused).

    Returns:
        `[R, T]`, 0 where `active` is False and where fewer than 2 group members are active.
    """
    return step_group_advantages(returns, active, group_size, scale_by_std=False, eps=eps)


@STEP_ADVANTAGES.register("gigpo")
def gigpo_advantages(
    returns: torch.Tensor,
    active: torch.Tensor,
    group_size: int,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    state_keys: torch.Tensor | None = None,
    step_weight: float = 1.0,
) -> torch.Tensor:
    """GiGPO (Group-in-Group Policy Optimization, https://arxiv.org/abs/2505.10978): an episode-level and a step-level
    relative advantage, `A = A_episode + step_weight * A_step`.

    `A_episode` is GRPO's over the group's episode returns (each turn's return-to-go at turn 0), given to every turn.
    `A_step` groups the turns of a prompt group by *anchor state*: every (world, turn) of the group whose observation
    is the same (`state_keys` equal) forms one step group, whatever the turn index, and each turn's return-to-go is
    normalised within it. Worlds that reset from one seed share their first state; later states recur where worlds
    took the same actions, or came back to a state. A step group of one turn has advantage 0.

    Args:
        returns: `[R, T]` returns-to-go of each turn.
        active: `[R, T]` bool, the world acted at turn t.
        group_size: G.
        scale_by_std: divide both parts by their group's (unbiased) standard deviation.
        eps: keeps equal returns at zero advantage instead of 0/0.
        state_keys: `[R, T]` long, equal where the observation (image and instruction) was the same.
        step_weight: the weight of the step-level part (the paper's omega, 1).

    Returns:
        `[R, T]` advantages, 0 where `active` is False.
    """
    if state_keys is None:
        raise ValueError("gigpo needs each turn's state key (Episodes.state_keys) to find its anchor states")
    num, turns = returns.shape
    act = active.bool()
    episode = grpo_advantages(returns[:, 0].float(), group_size=group_size, scale_by_std=scale_by_std, eps=eps)
    group = _row_groups(num, group_size, returns.device).expand(num, turns)  # [R, T]
    keys = torch.stack([group[act], state_keys[act]], -1)  # [n, 2] (prompt group, state) of each active turn
    _, anchor = keys.unique(dim=0, return_inverse=True)  # [n] the step group of each active turn
    step = torch.zeros(num, turns, device=returns.device)
    step[act] = _normalised_within(returns[act].float(), anchor, scale_by_std=scale_by_std, eps=eps)
    return torch.where(act, episode.unsqueeze(-1) + step_weight * step, torch.zeros_like(step))


def _row_groups(num: int, group_size: int, device: torch.device) -> torch.Tensor:
    """`[R, 1]` long: the prompt group of each of `num` rows (groups contiguous); raises if they do not split."""
    if group_size < 1 or num % group_size:
        raise ValueError(f"{num} worlds do not split into groups of {group_size}")
    return (torch.arange(num, device=device) // group_size).unsqueeze(-1)


def _normalised_within(
    values: torch.Tensor, segments: torch.Tensor, *, scale_by_std: bool, eps: float
) -> torch.Tensor:
    """Each value minus the mean of its segment, divided by the segment's unbiased standard deviation when
    `scale_by_std`; 0 in a segment of one (no one to compare with). The step estimators' group maths, over any
    grouping of the active turns (a turn index, an anchor state).

    Args:
        values: `[n]` float.
        segments: `[n]` long, equal for values of one segment (any integers).
        scale_by_std: divide by the segment's standard deviation (+ `eps`).
        eps: keeps equal values at zero instead of 0/0.

    Returns:
        `[n]`.
    """
    _, index = segments.unique(return_inverse=True)  # [n] dense segment ids
    zeros = torch.zeros(int(index.max()) + 1 if len(index) else 0, device=values.device, dtype=values.dtype)
    count = zeros.index_add(0, index, torch.ones_like(values))
    mean = zeros.index_add(0, index, values) / count.clamp(min=1)
    centred = values - mean[index]
    if scale_by_std:
        var = zeros.index_add(0, index, centred.square()) / (count - 1).clamp(min=1)
        # sqrt'(0) is inf: where every value is equal (centred all 0) take std 0 without a NaN gradient.
        std = torch.where(var > 0, var, torch.ones_like(var)).sqrt() * (var > 0)
        centred = centred / (std[index] + eps)
    return torch.where(count[index] >= 2, centred, torch.zeros_like(centred))
