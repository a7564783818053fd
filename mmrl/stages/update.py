"""The update of one step: PPO epochs over mini-batches of whole groups, micro-batches within each, one optimiser step
per mini-batch, and the critic's step beside the policy's.

    for epoch, for mini-batch:                            # algo.ppo_epochs x mini-batches of algo.mini_batch_groups
        for micro-batch:                                  # mmrl/stages/batching.py
            out = objective(logprobs, old, advantages, ...)   (+ critic.value_coef * value loss; + PAPO's masked pass)
            backward
        clip, step the policy's optimiser (and the critic's)
    step the learning-rate schedule

The update draws its own mini-batches (one draw a step, alike in every process), builds PAPO's masked copy of the
rows through the policy's `masked` verb, and steps only the pieces it is given (`Learner`). With one epoch, one
mini-batch and no critic this is one pass of gradient accumulation and one optimiser step, the old log-probs being
the sampler's: bit for bit a plain policy-gradient step.
"""

from __future__ import annotations

import itertools
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch

from sim.seeds import image_mask_seed, mini_batch_seed

from .. import algos
from ..methods import critic as critic_head
from ..methods.critic import Critic
from ..policy import Policy
from ..runtime import distributed
from ..runtime.config import TrainConfig
from ..runtime.metrics import EXTREMES
from ..runtime.precision import MasterWeights
from ..types import Episodes, Rollout, Sampling
from .batching import MicroBatch, micro_batches, mini_batch_rows
from .old_scores import OldScores, optimizer_steps


@dataclass(frozen=True)
class Learner:
    """What an update steps and reads: the policy and its optimiser, the reference and the critic."""

    policy: Policy  # what trains (its module may be FSDP-sharded)
    reference: Policy | None  # the frozen KL anchor (kl_coef > 0)
    critic: Critic | None  # the value head (algo.advantage gae)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    trainable: list[torch.nn.Parameter]  # what the optimiser steps (float32 masters with master_weights)
    master: MasterWeights | None  # float32 master weights, copied back into the model after each step
    world: distributed.World


def update(
    learner: Learner,
    cfg: TrainConfig,
    sampling: Sampling,
    episodes: Episodes,
    advantages: torch.Tensor,
    returns: torch.Tensor | None,
    old: OldScores,
    step: int,
    warming: bool = False,
) -> tuple[dict[str, torch.Tensor | float], float]:
    """The step's optimiser steps on its rollout.

    Args:
        learner: what the update steps.
        cfg: the run's config (`algo`, and `trainer`'s batching and clipping fields).
        sampling: how the rows were sampled (temperature, max_new_tokens).
        episodes: the step's episodes; their rollout's rows are what trains.
        advantages: `[M]` one per row.
        returns: `[M]` the critic's targets (with a critic), else None.
        old: from `mmrl.stages.old_scores.old_scores`.
        step: the step (seeds the mini-batch order and PAPO's mask).
        warming: the critic's warm-up: only the value head trains, and the schedule waits.

    Returns:
        The objective's metrics (mean over the optimiser steps; `*_min`/`*_max` the extremes; `optimizer_steps`),
        and the policy's mean gradient norm (0 while warming).
    """
    world, ac, tc = learner.world, cfg.algo, cfg.trainer
    rollout = episodes.rollout
    sampler = rollout.logprobs if cfg.recompute_old_logprobs else None  # to measure and correct the gap
    if old.logprobs is not None:
        rollout = replace(rollout, logprobs=old.logprobs)
    masked = None
    if ac.papo.masked_pass:  # PAPO: the same rows with part of each image hidden
        mask_rng = torch.Generator().manual_seed(image_mask_seed(tc.seed, step, world.rank))
        masked = learner.policy.masked(episodes.rollout, ac.papo.mask, ac.papo.mask_ratio, mask_rng)
    passes = mini_batches(episodes, cfg, world, step)
    updates, sums, norms = optimizer_steps(episodes, cfg, world), {}, 0.0
    left = critic_head.turns_left(episodes.turn, episodes.step_rewards.shape[1])  # [M, 1]
    critic = learner.critic
    for rows in itertools.chain(*passes):
        idle = rows is not None and len(rows) == 0  # a mini-batch of groups that only other processes hold
        part_values, part_returns = _rows(old.values, rows, idle), _rows(returns, rows, idle)
        part_left = _rows(left, rows, idle)
        learner.optimizer.zero_grad(set_to_none=True)
        for mb in micro_batches(
            _rows(rollout, rows, idle), _rows(advantages, rows, idle), _rows(masked, rows, idle),
            micro_batch_size=tc.micro_batch_size, token_budget=tc.token_budget, aggregation=ac.aggregation,
            world=world, rollout_logprobs=_rows(sampler, rows, idle), idle=idle,
        ):  # fmt: skip
            with torch.set_grad_enabled(not warming):  # warming up, only the value head (below) needs gradients
                scored = forward(learner, cfg, sampling.temperature, mb)
            loss = torch.zeros(())
            if not warming:
                old_logprobs = mb.rollout.logprobs if updates > 1 or sampler is None else scored["logprobs"].detach()
                out = algos.objective(
                    scored["logprobs"], old_logprobs, mb.advantages, mb.rollout.completion_mask,
                    loss_fn=algos.POLICY_LOSSES.get(ac.loss), clip_low=ac.clip_low, clip_high=ac.clip_high,
                    aggregation=ac.aggregation, max_len=sampling.max_new_tokens,
                    ref_logprobs=scored.get("ref_logprobs"), kl_coef=ac.kl_coef, kl_estimator=ac.kl_estimator,
                    entropy=scored.get("entropy"), entropy_coef=ac.entropy_coef,
                    masked_logprobs=scored.get("masked_logprobs"), masked_entropy=scored.get("masked_entropy"),
                    papo_gamma=ac.papo.gamma, papo_eta=ac.papo.eta, papo_kl_bound=ac.papo.kl_bound,
                    rollout_logprobs=mb.rollout_logprobs, correction=cfg.correction,
                    correction_cap=ac.rollout_correction_cap,
                )  # fmt: skip
                loss = out.loss * mb.weight
                accumulate(sums, out.metrics, mb.weight, scale=1 / updates)
            if critic is not None:
                rows_mb = slice(mb.start, mb.start + len(mb.rollout))
                # [r] from the policy pass's hidden state
                values = critic.values(train_trunk=not warming, turns_left=part_left[rows_mb])
                value = algos.value_loss(
                    values, part_values[rows_mb].to(values.device), part_returns[rows_mb].to(values.device),
                    clip=ac.critic.value_clip,
                )  # fmt: skip
                loss = loss + ac.critic.value_coef * value.loss * mb.row_weight
                accumulate(sums, value.metrics, mb.row_weight, scale=1 / updates)
            # FSDP averages gradients over the K processes; the weights already divide by the whole batch.
            (loss * world.size).backward()
        if critic is not None:
            norm = critic.step(world, tc.max_grad_norm)
            sums["critic/grad_norm"] = sums.get("critic/grad_norm", 0.0) + norm / updates
        if not warming:
            norms += float(distributed.clip_grad_norm(learner.trainable, tc.max_grad_norm))  # of the whole gradient
            learner.optimizer.step()
            # Freed now, not at the next pass's zero_grad: the next rollout would hold them for nothing.
            learner.optimizer.zero_grad(set_to_none=True)
            if learner.master is not None:
                learner.master.copy_to_model()
    if not warming:
        learner.scheduler.step()
    sums["optimizer_steps"] = float(0 if warming else updates)
    return sums, norms / updates


def mini_batches(episodes: Episodes, cfg: TrainConfig, world: distributed.World, step: int) -> list:
    """Per epoch, each mini-batch's rows (`mini_batch_rows`): one draw a step, alike in every process."""
    ac = cfg.algo
    draw = torch.Generator().manual_seed(mini_batch_seed(cfg.trainer.seed, step))
    groups = episodes.num_worlds // ac.group_size
    total, first = world.sum(groups), world.gather_rows(torch.zeros(groups))[1] if world.size > 1 else 0
    row_groups = episodes.world // ac.group_size
    return [mini_batch_rows(row_groups, first, total, ac.mini_batch_groups, draw) for _ in range(ac.ppo_epochs)]


def accumulate(sums: dict[str, torch.Tensor | float], metrics: dict[str, torch.Tensor], weight, scale: float) -> None:
    """Add one micro-batch's metrics: weighted (`weight` its share of its mini-batch, `scale` one mini-batch's share
    of the step), except the extremes (`*_min`, `*_max`), kept as such."""
    for key, value in metrics.items():
        if key.endswith(EXTREMES):
            pick = torch.minimum if key.endswith("min") else torch.maximum
            sums[key] = value if key not in sums else pick(torch.as_tensor(sums[key]), value)
        else:
            sums[key] = sums.get(key, 0.0) + value * weight * scale


def forward(learner: Learner, cfg: TrainConfig, temperature: float, mb: MicroBatch) -> dict[str, torch.Tensor]:
    """The forward passes one micro-batch needs: the policy's log-probs (with entropy when a term uses it), the
    reference's (kl_coef > 0), and the masked-image pass's (PAPO); each `[r, L]` per token. With a critic, the
    policy's pass leaves its hidden state for `critic.values()`."""
    ac = cfg.algo
    # The full entropy where a term uses it; a monitoring run too, so its papo/entropy and papo/masked_entropy are
    # the same estimator as a PAPO run's (without it they would fall back to the sampled estimate -logprobs).
    with_entropy = ac.entropy_coef > 0 or ac.papo.eta > 0 or ac.papo.monitor
    with learner.critic.reading() if learner.critic is not None else nullcontext():
        out = dict(zip(("logprobs", "entropy"), _scored(learner.policy, mb.rollout, temperature, with_entropy)))
    if learner.reference is not None:
        with torch.no_grad():
            out["ref_logprobs"] = learner.reference.logprobs(mb.rollout, temperature=temperature)
    if mb.masked is not None:
        through = ac.papo.grad_through_masked and ac.papo.gamma > 0  # a monitoring pass never takes gradients
        with torch.set_grad_enabled(through and torch.is_grad_enabled()):
            masked = _scored(learner.policy, mb.masked, temperature, with_entropy)
        out.update(zip(("masked_logprobs", "masked_entropy"), masked))
    return out


def _scored(policy: Policy, batch, temperature: float, with_entropy: bool) -> tuple[torch.Tensor, ...]:
    """(logprobs,) or (logprobs, entropy) of `batch` under `policy`."""
    scored = policy.logprobs(batch, temperature=temperature, with_entropy=with_entropy)
    return scored if with_entropy else (scored,)


def _rows(x, rows: torch.Tensor | None, idle: bool):
    """`x` (a tensor, a rollout, or None) at a mini-batch's rows (all of them for `None`; one, unused, when idle)."""
    if x is None or rows is None:
        return x
    rows = torch.zeros(1, dtype=torch.long) if idle else rows  # any real row: its slices run with weight 0
    return x.select(rows) if isinstance(x, Rollout) else x[rows]
