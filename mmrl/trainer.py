"""The trainer: one loop, read top to bottom, one call per stage.

    build (config -> env, shaping, the starting policy)                      mmrl/build.py
    cold_start (imitation of the env expert's demonstrations)                mmrl/stages/cold_start.py
    assemble (reference, resumed weights, optimiser, critic, initial evaluation)   mmrl/build.py
    for step:
        collected = collect(...)        # seeds, groups, filters and refill, rollout workers   mmrl/stages/collect.py
        collected = shape(collected)    # every transform between env reward and advantages    mmrl/stages/shaping.py
        old = old_scores(episodes)      # no-grad pass: old log-probs, critic values            mmrl/stages/old_scores.py
        advantages = row_advantages(episodes, old.values)   # GRPO family, step credit, GAE    mmrl/stages/advantages.py
        update(learner, episodes, advantages, old)          # epochs x mini-batches x micro    mmrl/stages/update.py
        shaping.follow(policy)          # GRPO-CARE's EMA reference
        log / evaluate / checkpoint                                  mmrl/report.py, mmrl/stages/evaluate.py, checkpoint.py

Under torchrun the loop runs in K processes, the model sharded by FSDP2, each collecting its share of the prompts;
what differs (idle micro-batches, global counts, gathered returns) hides behind `mmrl.runtime.distributed.World`'s methods,
and a single process never touches `torch.distributed`. Rank 0 alone prints and writes.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

from tqdm.auto import tqdm

from .build import Run, assemble, build
from .policy import Policy
from .report import report, step_metrics
from .runtime.checkpoint import save_checkpoint
from .runtime.config import TrainConfig
from .runtime.metrics import read_metrics
from .runtime.stopping import StopRequest
from .stages.advantages import critic_metrics, row_advantages
from .stages.cold_start import cold_start
from .stages.collect import check_generation_shards
from .stages.evaluate import held_out
from .stages.old_scores import old_scores
from .stages.update import update


def train(
    cfg: TrainConfig,
    policy: Policy | None = None,
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

    Raises:
        KeyboardInterrupt: Ctrl-C or SIGTERM during the steps, raised once the step in progress is checkpointed
            (`args`: the signal's name and the steps done); a second one raises at once.
    """
    check_generation_shards(cfg, generation_shards)  # before anything is loaded
    with ExitStack() as live:  # what holds processes (env, rollout workers): closed however the run ends
        setup = build(cfg, policy, generation_shards, live)  # the env, and the starting policy fitted to it
        if setup.needs_cold_start:  # imitation of the env's expert before RL (sft.episodes), with its own evaluation
            setup.policy = cold_start(setup.cfg, setup.policy, setup.collector.env, setup.out, setup.world)
        run = assemble(setup)  # reference, optimiser, critic, resumed state, the initial model's held-out score
        last = min(stop_after or cfg.trainer.total_steps, cfg.trainer.total_steps)
        bar = tqdm(
            range(run.start_step, last), initial=run.start_step, total=cfg.trainer.total_steps, desc="grpo",
            dynamic_ncols=True, disable=not run.world.is_main,
        )  # fmt: skip
        with StopRequest() as stop:  # Ctrl-C / SIGTERM: stop after the step in progress, checkpointed
            for step in bar:
                logged = train_step(run, step, last)
                bar.set_postfix(reward=f"{logged['reward/total']:.3f}", loss=f"{logged.get('loss/policy', 0.0):+.3f}")
                if stop.asked(run.world) and step + 1 < last:
                    if not saves_at(run, step, last):
                        save(run, step)
                    bar.close()
                    raise KeyboardInterrupt(stop.signal_name or "a signal in another process", step + 1)
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


def train_step(run: Run, step: int, last: int) -> dict[str, float]:
    """One step of the loop: collect, shape, old scores, advantages, update, log, evaluate, checkpoint; returns the
    logged metrics."""
    cfg, world, tc, ac = run.cfg, run.world, run.cfg.trainer, run.cfg.algo
    t0 = time.perf_counter()

    # ---- collect: G worlds per prompt reset with the same seed, episodes run to their end, filters and refill
    # (asynchronous, trainer.max_staleness = k: played ahead by the collector thread, which now queues step + k)
    collected = run.collector.collect(run.policy, run.model, step)
    t_gen = time.perf_counter() - t0

    # ---- shape: overlong penalty and filter, GRPO-CARE, SRPO (a judge and TTRV ran on each batch, before the filters)
    collected, shaping_metrics = run.shaping.collected(collected, run.policy, run.sampling)
    episodes = collected.episodes

    # ---- a generation engine frees its weights and KV cache for the update (the next generation takes them back);
    # not while a collector thread may be generating with it
    if not tc.max_staleness:
        run.policy.release_memory()

    # ---- old scores: before the weights move, the old log-probs (several updates per rollout) and the critic's values
    old = old_scores(run.policy, run.critic, episodes, cfg, run.sampling, world)

    # ---- advantages: one per row, from episode returns (each turn's return-to-go with step credit; GAE with a critic)
    advantages, returns = row_advantages(episodes, ac, world, old.values)  # [M], and the critic's targets

    # ---- update: ppo_epochs passes, each over mini-batches of whole groups, one optimiser step per mini-batch
    warming = run.critic is not None and step < ac.critic.warmup_steps  # the value head trains, the policy waits
    lr = run.scheduler.get_last_lr()[0]  # this update's (the scheduler steps after it)
    losses, grad_norm = update(run.learner, cfg, run.sampling, episodes, advantages, returns, old, step, warming)
    run.shaping.follow(run.policy)

    # ---- log (over every episode sampled this step, before any filter); the curriculum reads the logged score
    elapsed = time.perf_counter() - t0
    extra = {
        "grad_norm": grad_norm, "lr": lr, "perf/step_s": elapsed,
        "perf/generate_s": t_gen, "perf/tokens_per_s": collected.sampled.rollout.completion_mask.sum() / elapsed,
    }  # fmt: skip
    if old.values is not None:
        extra.update(critic_metrics(old.values, returns, world, warming))
    if tc.max_staleness:  # groups of queued steps dropped as more than k updates stale (only after a smaller k)
        shaping_metrics["pipeline/dropped_groups"] = run.collector.dropped_groups  # alike in every process
    metrics = step_metrics(cfg, collected, {**losses, **shaping_metrics}, extra, run.curriculum, world)
    logged = run.logger.log(step + 1, metrics)
    if run.curriculum.update(logged.get("env/success_rate", logged["reward/total"])):
        run.collector.rebuild()
    run.state["curriculum"] = run.curriculum.state_dict()

    # ---- evaluate
    if tc.eval_every and (step + 1) % tc.eval_every == 0 and step + 1 < tc.total_steps:
        run.collector.wait()  # the evaluation seeds torch's generator, which the collector thread draws from
        # The validation split (`val/*`): what a run is watched and tuned on; the test split (`eval/*`) is scored
        # before and after the run, for the report.
        validation = held_out(run.policy, cfg, world, split="validation")
        run.logger.log(step + 1, {f"val/{k}": v for k, v in validation.metrics.items()})

    # ---- checkpoint (every process gathers, rank 0 writes)
    if saves_at(run, step, last):
        save(run, step)
    return logged


def saves_at(run: Run, step: int, last: int) -> bool:
    """Whether step `step` (0-based) ends with a checkpoint: every `trainer.save_every` steps, and the last one."""
    every = run.cfg.trainer.save_every
    return bool(every and (step + 1) % every == 0) or step + 1 == last


def save(run: Run, step: int) -> None:
    """The checkpoint of the end of step `step` (0-based)."""
    save_checkpoint(
        run.out, step + 1, run.policy, run.optimizer, run.scheduler, run.state, run.cfg.trainer.keep_checkpoints,
        world=run.world, master=run.master, extra=checkpoint_extra(run),
    )  # fmt: skip


def checkpoint_extra(run: Run) -> dict:
    """What a checkpoint carries beyond weights, optimiser and scheduler: the critic, the steps queued for
    asynchronous collection (played ones as episodes, the others as their weights, re-queued on resume)."""
    extra = {}
    if run.critic is not None:
        extra["critic"] = run.critic.state_dict()
    if run.cfg.trainer.max_staleness:
        # No wait: what is not played yet is played again on resume. Under torchrun a gather (every process is here).
        extra["prefetched"] = run.collector.checkpointed()
    return extra
