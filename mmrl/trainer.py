"""The trainer: one loop, read top to bottom.

    build (config -> policy, reference, env, optimiser)                     mmrl/build.py
    for step:
        collected = collector.collect(...)   # seeds, shards, filters, refill, rollout workers   mmrl/collect.py
        advantages = ADVANTAGES[name](returns)                              mmrl/algos/advantages.py
        for micro-batch:                                                    mmrl/batching.py
            out = objective(logprobs, old_logprobs, advantages, ...)       mmrl/algos/objective.py
            backward
        clip, step the optimiser
        log / evaluate / checkpoint                                         mmrl/report.py, mmrl/checkpoint.py

Under torchrun the loop runs in K processes, the model sharded by FSDP2, each collecting its share of the prompts;
what differs (idle micro-batches, global counts, gathered returns) hides behind `mmrl.distributed.World`'s methods,
and a single process never touches `torch.distributed`. Rank 0 alone prints and writes.
"""

from __future__ import annotations

import itertools
import time
from contextlib import ExitStack
from dataclasses import replace

import torch
from tqdm.auto import tqdm

from . import algos, distributed
from .algos.data import discounted_returns
from .algos.papo import masked_images
from .batching import MicroBatch, micro_batches, mini_batch_rows
from .build import Run, build
from .checkpoint import save_checkpoint
from .collect import check_generation_shards
from .config import AlgoConfig, TrainConfig
from .evaluate import held_out
from .logging import read_metrics
from .policy import VLMPolicy
from .report import EXTREMES, report, step_metrics
from .types import Episodes, Rollout


def train(
    cfg: TrainConfig,
    policy: VLMPolicy | None = None,
    stop_after: int | None = None,
    generation_shards: int | None = None,
) -> list[dict]:
    """Train with GRPO and return the logged metrics (one dict per step).

    Args:
        cfg: the run's configuration.
        policy: a policy to train instead of the one `cfg.model` names (tests pass tiny ones).
        stop_after: end right after the checkpoint of this step, as if killed there (resume tests, benchmarks).
        generation_shards: S, the number of separately seeded generations the step's B prompts are split into
            (default: one per process, K). Samples then depend on S, never on K: one process with S = K draws
            exactly what a K-process torchrun run draws.
    """
    check_generation_shards(cfg, generation_shards)  # before anything is loaded
    with ExitStack() as live:  # what holds processes (env, rollout workers): closed however the run ends
        run = build(cfg, policy, generation_shards, live)
        last = min(stop_after or cfg.trainer.total_steps, cfg.trainer.total_steps)
        bar = tqdm(
            range(run.start_step, last), initial=run.start_step, total=cfg.trainer.total_steps, desc="grpo",
            dynamic_ncols=True, disable=not run.world.is_main,
        )  # fmt: skip
        for step in bar:
            logged = train_step(run, step, last)
            bar.set_postfix(reward=f"{logged['reward/total']:.3f}", loss=f"{logged['loss/policy']:+.3f}")
        bar.close()
        if last < cfg.trainer.total_steps:  # stopped early, as if killed after the checkpoint of `last`
            run.world.barrier()  # rank 0 has written what the others read back
            return read_metrics(run.out / "metrics.jsonl")
        run.collector.close()  # not needed by the held-out evaluation, which builds its own envs
        after = held_out(run.policy, run.cfg, run.world)
        run.logger.log(cfg.trainer.total_steps, {f"eval/{k}": v for k, v in after.metrics.items()})
        if run.world.is_main:
            report(run.cfg, run.state["eval_before"], after, run.out)
        run.world.barrier()
        return read_metrics(run.out / "metrics.jsonl")


def train_step(run: Run, step: int, last: int) -> dict[str, float]:
    """One step of the loop: collect, advantages, update, log, evaluate, checkpoint; returns the logged metrics."""
    cfg, world, tc, ac = run.cfg, run.world, run.cfg.trainer, run.cfg.algo
    t0 = time.perf_counter()

    # ---- collect: G worlds per prompt reset with the same seed, episodes run to their end, filters and refill
    collected = run.collector.collect(run.policy, run.model, step)
    t_gen = time.perf_counter() - t0
    episodes = collected.episodes

    # ---- advantages: one per row, from episode returns (or each turn's return-to-go, with step credit)
    advantages = row_advantages(episodes, ac, world)  # [M]
    masked = None
    if ac.papo_gamma > 0:  # PAPO: the same rows with part of each image hidden
        mask_rng = torch.Generator().manual_seed(tc.seed * 1_000_003 + step + (world.rank << 32))
        image_processor = run.policy.processor.image_processor
        masked = masked_images(episodes.rollout, ac.papo_mask, ac.papo_mask_ratio, mask_rng, image_processor)

    # ---- update: ppo_epochs passes, each over mini-batches of whole groups, one optimiser step per mini-batch
    losses, grad_norm = update(run, episodes, advantages, masked, step)
    run.scheduler.step()

    # ---- log (over every episode sampled this step, before any filter); the curriculum reads the logged score
    elapsed = time.perf_counter() - t0
    extra = {
        "grad_norm": grad_norm, "lr": run.scheduler.get_last_lr()[0], "perf/step_s": elapsed,
        "perf/generate_s": t_gen, "perf/tokens_per_s": collected.sampled.rollout.completion_mask.sum() / elapsed,
    }  # fmt: skip
    logged = run.logger.log(step + 1, step_metrics(cfg, collected, losses, extra, run.curriculum, world))
    if run.curriculum.update(logged.get("env/success_rate", logged["reward/total"])):
        run.collector.rebuild()
    run.state["curriculum"] = run.curriculum.state_dict()

    # ---- evaluate
    if tc.eval_every and (step + 1) % tc.eval_every == 0 and step + 1 < tc.total_steps:
        run.logger.log(step + 1, {f"eval/{k}": v for k, v in held_out(run.policy, cfg, world).metrics.items()})

    # ---- checkpoint (every process gathers, rank 0 writes)
    if (tc.save_every and (step + 1) % tc.save_every == 0) or step + 1 == last:
        save_checkpoint(
            run.out, step + 1, run.policy, run.optimizer, run.scheduler, run.state, tc.keep_checkpoints,
            world=world, master=run.master,
        )  # fmt: skip
    return logged


def update(
    run: Run, episodes: Episodes, advantages: torch.Tensor, masked: Rollout | None, step: int
) -> tuple[dict[str, torch.Tensor | float], float]:
    """The step's optimiser steps on its rollout; returns the objective's metrics (mean over the optimiser steps;
    `*_min`/`*_max` the extremes) and the mean gradient norm.

    With one epoch and one mini-batch this is one pass of gradient accumulation over micro-batches and one optimiser
    step, the old log-probs being the sampler's (ratio 1 at the start). With `algo.old_logprobs` recomputed, the
    trainer's own log-probs before the first update are the old ones and the sampler's are compared with them.
    """
    cfg, world, ac, tc = run.cfg, run.world, run.cfg.algo, run.cfg.trainer
    rollout, sampler_logprobs = episodes.rollout, None
    draw = torch.Generator().manual_seed(tc.seed * 1_000_003 + step * 7919)  # alike in every process
    groups = episodes.num_worlds // ac.group_size
    total, first = world.sum(groups), world.gather_rows(torch.zeros(groups))[1] if world.size > 1 else 0
    row_groups = episodes.world // ac.group_size
    passes = [mini_batch_rows(row_groups, first, total, ac.mini_batch_groups, draw) for _ in range(ac.ppo_epochs)]
    updates = sum(len(p) for p in passes)
    if cfg.recompute_old_logprobs:
        sampler_logprobs = rollout.logprobs
        if updates > 1:  # else the update's own forward, detached, is the old policy's (same weights)
            rollout = replace(rollout, logprobs=old_logprobs(run, rollout, masked))
    sums: dict[str, torch.Tensor | float] = {}
    norms = 0.0
    for rows in itertools.chain(*passes):
        idle = rows is not None and len(rows) == 0  # a mini-batch of groups that only other processes hold
        batch = (rollout, advantages, masked, sampler_logprobs)
        if rows is not None:
            batch = take(rows[:1] if idle else rows, *batch)
        run.optimizer.zero_grad(set_to_none=True)
        for mb in micro_batches(
            batch[0], batch[1], batch[2], micro_batch_size=tc.micro_batch_size, token_budget=tc.token_budget,
            aggregation=ac.aggregation, world=world, rollout_logprobs=batch[3], idle=idle,
        ):  # fmt: skip
            scored = forward(run, mb)
            old = mb.rollout.logprobs if updates > 1 or sampler_logprobs is None else scored["logprobs"].detach()
            out = algos.objective(
                scored["logprobs"], old, mb.advantages, mb.rollout.completion_mask,
                loss_fn=algos.POLICY_LOSSES.get(ac.loss), clip_low=ac.clip_low, clip_high=ac.clip_high,
                aggregation=ac.aggregation, max_len=run.sampling.max_new_tokens,
                ref_logprobs=scored.get("ref_logprobs"), kl_coef=ac.kl_coef, kl_estimator=ac.kl_estimator,
                entropy=scored.get("entropy"), entropy_coef=ac.entropy_coef,
                masked_logprobs=scored.get("masked_logprobs"), masked_entropy=scored.get("masked_entropy"),
                papo_gamma=ac.papo_gamma, papo_eta=ac.papo_eta, papo_kl_bound=ac.papo_kl_bound,
                rollout_logprobs=mb.rollout_logprobs if sampler_logprobs is not None else None,
                correction=cfg.correction, correction_cap=ac.rollout_correction_cap,
            )  # fmt: skip
            # FSDP averages gradients over the K processes; the weights already divide by the whole batch.
            (out.loss * mb.weight * world.size).backward()
            accumulate(sums, out.metrics, mb.weight, scale=1 / updates)
        norms += float(distributed.clip_grad_norm(run.trainable, tc.max_grad_norm))  # of the whole gradient
        run.optimizer.step()
        if run.master is not None:
            run.master.copy_to_model()
    sums["optimizer_steps"] = float(updates)
    return sums, norms / updates


def take(rows: torch.Tensor, rollout: Rollout, advantages: torch.Tensor, masked: Rollout | None, sampler):
    """The mini-batch `rows` of the rollout and of what lines up with it."""
    return (
        rollout.select(rows), advantages[rows], None if masked is None else masked.select(rows),
        None if sampler is None else sampler[rows],
    )  # fmt: skip


def accumulate(sums: dict[str, torch.Tensor | float], metrics: dict[str, torch.Tensor], weight, scale: float) -> None:
    """Add one micro-batch's metrics: weighted (`weight` its share of its mini-batch, `scale` one mini-batch's share
    of the step), except the extremes (`*_min`, `*_max`), kept as such."""
    for key, value in metrics.items():
        if key.endswith(EXTREMES):
            pick = torch.minimum if key.endswith("min") else torch.maximum
            sums[key] = value if key not in sums else pick(torch.as_tensor(sums[key]), value)
        else:
            sums[key] = sums.get(key, 0.0) + value * weight * scale


def old_logprobs(run: Run, rollout: Rollout, masked: Rollout | None) -> torch.Tensor:
    """`[R, L]` the trainer's log-probs of the rollout's tokens under the current weights, before any update."""
    tc, ac = run.cfg.trainer, run.cfg.algo
    out = torch.zeros_like(rollout.logprobs)
    with torch.no_grad():
        for mb in micro_batches(
            rollout, torch.zeros(len(rollout)), None, micro_batch_size=tc.micro_batch_size,
            token_budget=tc.token_budget, aggregation=ac.aggregation, world=run.world,
        ):  # fmt: skip
            logprobs = run.policy.logprobs(mb.rollout, temperature=run.sampling.temperature)
            if mb.weight > 0:
                width = logprobs.shape[1]
                out[mb.start : mb.start + len(mb.rollout), :width] = logprobs.to(out.dtype)
    return torch.where(rollout.completion_mask, out, torch.zeros_like(out))


def row_advantages(episodes: Episodes, ac: AlgoConfig, world: distributed.World) -> torch.Tensor:
    """`[M]` the advantage of every row (generation) of `episodes`, by the configured estimator.

    Episode credit gives each row its episode's advantage; the returns of every process are gathered first, since an
    estimator may normalise over the whole batch (REINFORCE++). Step credit gives each row its turn's advantage
    against the same turn of the group's other worlds (`STEP_ADVANTAGES`).
    """
    if ac.credit == "step":
        returns = discounted_returns(episodes.step_rewards, episodes.dones, ac.gamma)  # [R, T] returns-to-go
        step_fn: algos.StepAdvantageFn = algos.STEP_ADVANTAGES.get(ac.advantage)
        turn_advantages = step_fn(returns, episodes.active, group_size=ac.group_size, scale_by_std=ac.scale_by_std)
        return turn_advantages[episodes.world, episodes.turn]
    advantage_fn: algos.AdvantageFn = algos.ADVANTAGES.get(ac.advantage)
    returns, first = world.gather_rows(episodes.returns(ac.gamma))  # [R of every process], where ours start
    advantages = advantage_fn(returns, group_size=ac.group_size, scale_by_std=ac.scale_by_std)
    return advantages[first : first + episodes.num_worlds][episodes.world]


def forward(run: Run, mb: MicroBatch) -> dict[str, torch.Tensor]:
    """The forward passes one micro-batch needs: the policy's log-probs (with entropy when a term uses it), the
    reference's (kl_coef > 0), and the masked-image pass's (PAPO); each `[r, L]` per token."""
    ac, temperature = run.cfg.algo, run.sampling.temperature
    with_entropy = ac.entropy_coef > 0 or ac.papo_eta > 0
    out = dict(zip(("logprobs", "entropy"), _scored(run.policy, mb.rollout, temperature, with_entropy)))
    if run.reference is not None:
        with torch.no_grad():
            out["ref_logprobs"] = run.reference.logprobs(mb.rollout, temperature=temperature)
    if mb.masked is not None:
        with torch.set_grad_enabled(ac.papo_grad_through_masked):
            masked = _scored(run.policy, mb.masked, temperature, with_entropy)
        out.update(zip(("masked_logprobs", "masked_entropy"), masked))
    return out


def _scored(policy: VLMPolicy, batch, temperature: float, with_entropy: bool) -> tuple[torch.Tensor, ...]:
    """(logprobs,) or (logprobs, entropy) of `batch` under `policy`."""
    scored = policy.logprobs(batch, temperature=temperature, with_entropy=with_entropy)
    return scored if with_entropy else (scored,)
