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

import time
from contextlib import ExitStack

import torch
from tqdm.auto import tqdm

from . import algos, distributed
from .algos.data import discounted_returns
from .algos.papo import masked_images
from .build import Run, build
from .checkpoint import save_checkpoint
from .collect import check_generation_shards
from .config import AlgoConfig, TrainConfig
from .consistency import CareReference, make_care
from .evaluate import held_out
from .logging import read_metrics
from .policy import VLMPolicy
from .progress import with_progress_rewards
from .report import report, step_metrics
from .types import Episodes
from .update import score_before_update, update


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
        care = make_care(cfg, run.policy, run.world.size)  # GRPO-CARE's EMA reference (algo.care_coef > 0), or None
        last = min(stop_after or cfg.trainer.total_steps, cfg.trainer.total_steps)
        bar = tqdm(
            range(run.start_step, last), initial=run.start_step, total=cfg.trainer.total_steps, desc="grpo",
            dynamic_ncols=True, disable=not run.world.is_main,
        )  # fmt: skip
        for step in bar:
            logged = train_step(run, step, last, care)
            bar.set_postfix(reward=f"{logged['reward/total']:.3f}", loss=f"{logged.get('loss/policy', 0.0):+.3f}")
        bar.close()
        if last < cfg.trainer.total_steps:  # stopped early, as if killed after the checkpoint of `last`
            run.world.barrier()  # rank 0 has written what the others read back
            return read_metrics(run.out / "metrics.jsonl")
        run.collector.close()  # not needed by the held-out evaluation, which builds its own envs
        after = held_out(run.policy, run.cfg, run.world)
        run.logger.log(cfg.trainer.total_steps, {f"eval/{k}": v for k, v in after.metrics.items()})
        if run.world.is_main:
            report(run.cfg, run.state["eval_before"], after, run.out)
            run.logger.images(cfg.trainer.total_steps, sorted(run.out.glob("*.png")))  # to TensorBoard / W&B
        run.world.barrier()
        return read_metrics(run.out / "metrics.jsonl")


def train_step(run: Run, step: int, last: int, care: CareReference | None = None) -> dict[str, float]:
    """One step of the loop: collect, advantages, update, log, evaluate, checkpoint; returns the logged metrics.
    With `care` (GRPO-CARE), its consistency bonus joins the rewards and its EMA follows each update."""
    cfg, world, tc, ac = run.cfg, run.world, run.cfg.trainer, run.cfg.algo
    t0 = time.perf_counter()

    # ---- collect: G worlds per prompt reset with the same seed, episodes run to their end, filters and refill
    collected = run.collector.collect(run.policy, run.model, step)  # (prefetched during the last step, if pipelined)
    t_gen = time.perf_counter() - t0
    episodes, care_metrics = collected.episodes, {}
    if care is not None:  # GRPO-CARE: correct answers more consistent than their group's peers gain a bonus
        episodes, care_metrics = care.shape(episodes, run.sampling.temperature)
    episodes, progress_metrics = with_progress_rewards(run.policy, episodes, ac)  # SRPO (algo.progress_coef > 0)
    if tc.max_staleness and step + 1 < tc.total_steps:  # pipelined: the next step's episodes, while this one updates
        run.collector.prefetch(run.policy, step + 1)

    # ---- advantages: one per row, from episode returns (each turn's return-to-go with step credit; GAE with a critic)
    before = score_before_update(run, episodes, step)  # mini-batches; old log-probs and values, before any update
    advantages, returns = row_advantages(episodes, ac, world, before.values)  # [M], and the critic's targets
    masked = None
    if ac.papo_gamma > 0 or ac.papo_monitor:  # PAPO: the same rows with part of each image hidden
        mask_rng = torch.Generator().manual_seed(tc.seed * 1_000_003 + step + (world.rank << 32))
        image_processor = run.policy.processor.image_processor
        masked = masked_images(episodes.rollout, ac.papo_mask, ac.papo_mask_ratio, mask_rng, image_processor)

    # ---- update: ppo_epochs passes, each over mini-batches of whole groups, one optimiser step per mini-batch
    warming = run.critic is not None and step < ac.critic_warmup_steps  # the value head trains, the policy waits
    losses, grad_norm = update(run, episodes, advantages, returns, masked, before, warming)
    if not warming:
        run.scheduler.step()
    if care is not None:
        care.follow(run.policy)

    # ---- log (over every episode sampled this step, before any filter); the curriculum reads the logged score
    elapsed = time.perf_counter() - t0
    extra = {
        "grad_norm": grad_norm, "lr": run.scheduler.get_last_lr()[0], "perf/step_s": elapsed,
        "perf/generate_s": t_gen, "perf/tokens_per_s": collected.sampled.rollout.completion_mask.sum() / elapsed,
    }  # fmt: skip
    if before.values is not None:
        extra.update(critic_metrics(before.values, returns, world, warming))
    losses = {**losses, **care_metrics, **progress_metrics}
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
            world=world, master=run.master, extra=checkpoint_extra(run),
        )  # fmt: skip
    return logged


def checkpoint_extra(run: Run) -> dict:
    """What a checkpoint carries beyond weights, optimiser and scheduler: the critic, a finished prefetch."""
    extra = {}
    if run.critic is not None:
        extra["critic"] = run.critic.state_dict()
    if run.cfg.trainer.max_staleness:
        extra["prefetched"] = run.collector.pending()  # waits for it: the resumed run trains on the same rows
    return extra


def row_advantages(
    episodes: Episodes, ac: AlgoConfig, world: distributed.World, values: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`[M]` the advantage of every row (generation) of `episodes` by the configured estimator, and with a critic the
    `[M]` value targets (else None).

    Episode credit gives each row its episode's advantage; the returns of every process are gathered first, since an
    estimator may normalise over the whole batch (REINFORCE++). Branch credit is episode credit on rows of which only
    the branch turn's keep a completion mask (`mmrl.rollout`). Step credit gives each row its turn's advantage
    against the same turn of the group's other worlds (`STEP_ADVANTAGES`). A critic's estimator (`CRITIC_ADVANTAGES`,
    GAE) gives each row its turn's advantage from the `values` of the rows' states, whitened over the batch of every
    process with `scale_by_std`.
    """
    if ac.advantage in algos.CRITIC_ADVANTAGES:
        grid = torch.zeros_like(episodes.step_rewards)  # [R, T] the value of each turn's starting state
        grid[episodes.world, episodes.turn] = values.to(grid.dtype)
        gae = algos.CRITIC_ADVANTAGES.get(ac.advantage)
        turn_advantages, turn_returns = gae(
            episodes.step_rewards, grid, episodes.active, gamma=ac.gamma, lam=ac.gae_lambda
        )
        advantages = turn_advantages[episodes.world, episodes.turn]
        if ac.scale_by_std:
            count = world.sum(torch.tensor(float(len(advantages))))
            mean = world.sum(advantages.sum()) / count
            std = (world.sum((advantages - mean).square().sum()) / count).sqrt()
            advantages = (advantages - mean) / (std + 1e-6)
        return advantages, turn_returns[episodes.world, episodes.turn]
    if ac.credit == "step":
        returns = discounted_returns(episodes.step_rewards, episodes.dones, ac.gamma)  # [R, T] returns-to-go
        step_fn: algos.StepAdvantageFn = algos.STEP_ADVANTAGES.get(ac.advantage)
        turn_advantages = step_fn(
            returns, episodes.active, group_size=ac.group_size, scale_by_std=ac.scale_by_std,
            state_keys=episodes.state_keys, step_weight=ac.gigpo_step_weight,
        )  # fmt: skip
        return turn_advantages[episodes.world, episodes.turn], None
    advantage_fn: algos.AdvantageFn = algos.ADVANTAGES.get(ac.advantage)
    returns, first = world.gather_rows(episodes.returns(ac.gamma))  # [R of every process], where ours start
    advantages = advantage_fn(returns, group_size=ac.group_size, scale_by_std=ac.scale_by_std)
    return advantages[first : first + episodes.num_worlds][episodes.world], None


def critic_metrics(values: torch.Tensor, returns: torch.Tensor, world: distributed.World, warming: bool) -> dict:
    """The critic's step-level figures over every process's rows: mean value, explained variance, warm-up."""
    values, _ = world.gather_rows(values.float())
    returns, _ = world.gather_rows(returns.float())
    return {
        "critic/value_mean": values.mean(), "critic/return_mean": returns.mean(),
        "critic/explained_variance": algos.explained_variance(values, returns), "critic/warmup": float(warming),
    }  # fmt: skip
