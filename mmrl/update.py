"""The update of one step: PPO epochs over mini-batches of whole groups, micro-batches within each, one optimiser step
per mini-batch, and the critic's step beside the policy's.

    before = score_before_update(run, episodes, step)     # the passes' mini-batches; old log-probs, values
    ... advantages (GAE needs `before.values`) ...
    for epoch, for mini-batch:                            # algo.ppo_epochs x mini-batches of algo.mini_batch_groups
        for micro-batch:                                  # mmrl/batching.py
            out = objective(logprobs, old, advantages, ...)   (+ value_coef * value loss)
            backward
        clip, step the policy's optimiser (and the critic's)

With one epoch, one mini-batch and no critic this is one pass of gradient accumulation and one optimiser step, the
old log-probs being the sampler's: bit for bit what the loop did before epochs existed.
"""

from __future__ import annotations

import itertools
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch

from . import algos, critic, distributed
from .batching import MicroBatch, micro_batches, mini_batch_rows
from .build import Run
from .policy import VLMPolicy
from .report import EXTREMES
from .types import Episodes, Rollout


@dataclass(frozen=True)
class Before:
    """What the update needs from before its first optimiser step."""

    passes: list[list[torch.Tensor | None]]  # per epoch, each mini-batch's rows (`mini_batch_rows`)
    old_logprobs: torch.Tensor | None  # [M, L] the trainer's, when recomputed in a pass of their own
    values: torch.Tensor | None  # [M] the critic's value of each row's starting state

    @property
    def updates(self) -> int:
        return sum(len(p) for p in self.passes)


def score_before_update(run: Run, episodes: Episodes, step: int) -> Before:
    """The step's mini-batches (one draw, alike in every process), and one no-grad pass over the rollout for what
    must be read before the weights move: the old log-probs (recomputed with several updates per rollout; with one,
    the update's own forward serves) and the critic's values."""
    cfg, world, ac, tc = run.cfg, run.world, run.cfg.algo, run.cfg.trainer
    draw = torch.Generator().manual_seed(tc.seed * 1_000_003 + step * 7919)  # alike in every process
    groups = episodes.num_worlds // ac.group_size
    total, first = world.sum(groups), world.gather_rows(torch.zeros(groups))[1] if world.size > 1 else 0
    row_groups = episodes.world // ac.group_size
    passes = [mini_batch_rows(row_groups, first, total, ac.mini_batch_groups, draw) for _ in range(ac.ppo_epochs)]
    recompute = cfg.recompute_old_logprobs and sum(len(p) for p in passes) > 1
    if not recompute and run.critic is None:
        return Before(passes, None, None)
    rollout = episodes.rollout
    old = torch.zeros_like(rollout.logprobs) if recompute else None
    values = torch.zeros(len(rollout)) if run.critic is not None else None
    left = turns_left(episodes)
    with torch.no_grad():
        for mb in micro_batches(
            rollout, torch.zeros(len(rollout)), None, micro_batch_size=tc.micro_batch_size,
            token_budget=tc.token_budget, aggregation=ac.aggregation, world=world,
        ):  # fmt: skip
            rows = slice(mb.start, mb.start + len(mb.rollout))
            with run.critic.reading() if run.critic is not None else nullcontext():
                logprobs = run.policy.logprobs(mb.rollout, temperature=run.sampling.temperature)
            if run.critic is not None:
                read = run.critic.values(turns_left=left[rows]).cpu()
                if mb.weight > 0 or mb.row_weight > 0:
                    values[rows] = read
            if old is not None and (mb.weight > 0 or mb.row_weight > 0):
                old[rows, : logprobs.shape[1]] = logprobs.to(old.dtype)
    if old is not None:
        old = torch.where(rollout.completion_mask, old, torch.zeros_like(old))
    return Before(passes, old, values)


def update(
    run: Run,
    episodes: Episodes,
    advantages: torch.Tensor,
    returns: torch.Tensor | None,
    masked: Rollout | None,
    before: Before,
    warming: bool = False,
) -> tuple[dict[str, torch.Tensor | float], float]:
    """The step's optimiser steps on its rollout.

    Args:
        run: the run.
        episodes: the step's episodes; their rollout's rows are what trains.
        advantages: `[M]` one per row.
        returns: `[M]` the critic's targets (with a critic), else None.
        masked: the rows with part of each image hidden (PAPO), or None.
        before: from `score_before_update`.
        warming: the critic's warm-up: only the value head trains.

    Returns:
        The objective's metrics (mean over the optimiser steps; `*_min`/`*_max` the extremes; `optimizer_steps`),
        and the policy's mean gradient norm (0 while warming).
    """
    cfg, world, ac, tc = run.cfg, run.world, run.cfg.algo, run.cfg.trainer
    rollout, sampler = episodes.rollout, rollout_logprobs_of(run, episodes.rollout)
    if before.old_logprobs is not None:
        rollout = replace(rollout, logprobs=before.old_logprobs)
    updates, sums, norms = before.updates, {}, 0.0
    left = turns_left(episodes)
    for rows in itertools.chain(*before.passes):
        idle = rows is not None and len(rows) == 0  # a mini-batch of groups that only other processes hold
        part_values, part_returns = _rows(before.values, rows, idle), _rows(returns, rows, idle)
        part_left = _rows(left, rows, idle)
        run.optimizer.zero_grad(set_to_none=True)
        for mb in micro_batches(
            _rows(rollout, rows, idle), _rows(advantages, rows, idle), _rows(masked, rows, idle),
            micro_batch_size=tc.micro_batch_size, token_budget=tc.token_budget, aggregation=ac.aggregation,
            world=world, rollout_logprobs=_rows(sampler, rows, idle), idle=idle,
        ):  # fmt: skip
            with torch.set_grad_enabled(not warming):  # warming up, only the value head (below) needs gradients
                scored = forward(run, mb)
            loss = torch.zeros(())
            if not warming:
                old = mb.rollout.logprobs if updates > 1 or sampler is None else scored["logprobs"].detach()
                out = algos.objective(
                    scored["logprobs"], old, mb.advantages, mb.rollout.completion_mask,
                    loss_fn=algos.POLICY_LOSSES.get(ac.loss), clip_low=ac.clip_low, clip_high=ac.clip_high,
                    aggregation=ac.aggregation, max_len=run.sampling.max_new_tokens,
                    ref_logprobs=scored.get("ref_logprobs"), kl_coef=ac.kl_coef, kl_estimator=ac.kl_estimator,
                    entropy=scored.get("entropy"), entropy_coef=ac.entropy_coef,
                    masked_logprobs=scored.get("masked_logprobs"), masked_entropy=scored.get("masked_entropy"),
                    papo_gamma=ac.papo_gamma, papo_eta=ac.papo_eta, papo_kl_bound=ac.papo_kl_bound,
                    rollout_logprobs=mb.rollout_logprobs, correction=cfg.correction,
                    correction_cap=ac.rollout_correction_cap,
                )  # fmt: skip
                loss = out.loss * mb.weight
                accumulate(sums, out.metrics, mb.weight, scale=1 / updates)
            if run.critic is not None:
                rows_mb = slice(mb.start, mb.start + len(mb.rollout))
                # [r] from the policy pass's hidden state
                values = run.critic.values(train_trunk=not warming, turns_left=part_left[rows_mb])
                value = algos.value_loss(
                    values, part_values[rows_mb].to(values.device), part_returns[rows_mb].to(values.device),
                    clip=ac.value_clip,
                )  # fmt: skip
                loss = loss + ac.value_coef * value.loss * mb.row_weight
                accumulate(sums, value.metrics, mb.row_weight, scale=1 / updates)
            # FSDP averages gradients over the K processes; the weights already divide by the whole batch.
            (loss * world.size).backward()
        if run.critic is not None:
            norm = run.critic.step(world, tc.max_grad_norm)
            sums["critic/grad_norm"] = sums.get("critic/grad_norm", 0.0) + norm / updates
        if not warming:
            norms += float(distributed.clip_grad_norm(run.trainable, tc.max_grad_norm))  # of the whole gradient
            run.optimizer.step()
            # Freed now, not at the next pass's zero_grad: the next rollout would hold them for nothing.
            run.optimizer.zero_grad(set_to_none=True)
            if run.master is not None:
                run.master.copy_to_model()
    sums["optimizer_steps"] = float(0 if warming else updates)
    return sums, norms / updates


def rollout_logprobs_of(run: Run, rollout: Rollout) -> torch.Tensor | None:
    """The sampler's log-probs where the trainer's are the old ones (to measure and correct the gap), else None."""
    return rollout.logprobs if run.cfg.recompute_old_logprobs else None


def accumulate(sums: dict[str, torch.Tensor | float], metrics: dict[str, torch.Tensor], weight, scale: float) -> None:
    """Add one micro-batch's metrics: weighted (`weight` its share of its mini-batch, `scale` one mini-batch's share
    of the step), except the extremes (`*_min`, `*_max`), kept as such."""
    for key, value in metrics.items():
        if key.endswith(EXTREMES):
            pick = torch.minimum if key.endswith("min") else torch.maximum
            sums[key] = value if key not in sums else pick(torch.as_tensor(sums[key]), value)
        else:
            sums[key] = sums.get(key, 0.0) + value * weight * scale


def forward(run: Run, mb: MicroBatch) -> dict[str, torch.Tensor]:
    """The forward passes one micro-batch needs: the policy's log-probs (with entropy when a term uses it), the
    reference's (kl_coef > 0), and the masked-image pass's (PAPO); each `[r, L]` per token. With a critic, the
    policy's pass leaves its hidden state for `critic.values()`."""
    ac, temperature = run.cfg.algo, run.sampling.temperature
    # The full entropy where a term uses it; a monitoring run too, so its papo/entropy and papo/masked_entropy are
    # the same estimator as a PAPO run's (without it they would fall back to the sampled estimate -logprobs).
    with_entropy = ac.entropy_coef > 0 or ac.papo_eta > 0 or ac.papo_monitor
    with run.critic.reading() if run.critic is not None else nullcontext():
        out = dict(zip(("logprobs", "entropy"), _scored(run.policy, mb.rollout, temperature, with_entropy)))
    if run.reference is not None:
        with torch.no_grad():
            out["ref_logprobs"] = run.reference.logprobs(mb.rollout, temperature=temperature)
    if mb.masked is not None:
        through = ac.papo_grad_through_masked and ac.papo_gamma > 0  # a monitoring pass never takes gradients
        with torch.set_grad_enabled(through and torch.is_grad_enabled()):
            masked = _scored(run.policy, mb.masked, temperature, with_entropy)
        out.update(zip(("masked_logprobs", "masked_entropy"), masked))
    return out


def _scored(policy: VLMPolicy, batch, temperature: float, with_entropy: bool) -> tuple[torch.Tensor, ...]:
    """(logprobs,) or (logprobs, entropy) of `batch` under `policy`."""
    scored = policy.logprobs(batch, temperature=temperature, with_entropy=with_entropy)
    return scored if with_entropy else (scored,)


def turns_left(episodes: Episodes) -> torch.Tensor:
    """`[M, 1]` the share of its episode's turns still to come at each row (a time-aware critic's input)."""
    return critic.turns_left(episodes.turn, episodes.step_rewards.shape[1])


def _rows(x, rows: torch.Tensor | None, idle: bool):
    """`x` (a tensor, a rollout, or None) at a mini-batch's rows (all of them for `None`; one, unused, when idle)."""
    if x is None or rows is None:
        return x
    rows = torch.zeros(1, dtype=torch.long) if idle else rows  # any real row: its slices run with weight 0
    return x.select(rows) if isinstance(x, Rollout) else x[rows]
