"""The GRPO trainer: one loop, read top to bottom.

build (config -> env, policy, reference, optimiser) -> collect a rollout -> score -> advantages -> update
(micro-batches, gradient accumulation) -> log -> evaluate -> checkpoint.
Under torchrun the loop runs in K processes, the model sharded by FSDP2, each collecting its share of the prompts
(`mmrl.distributed`); rank 0 alone prints and writes. A single process never touches `torch.distributed`.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from sim.seeds import TRAIN_SEED_STRIDE, train_seeds

from . import algos, distributed, precision
from .algos import aggregate, entropy_bonus_loss, kl_estimate
from .algos.data import (
    difficulty_filter_keep,
    discounted_returns,
    dynamic_sampling_keep,
    overlong_mask,
    soft_overlong_penalty,
    step_group_advantages,
)
from .algos.papo import papo_loss_terms
from .batching import token_budget_slices, trim_padding
from .checkpoint import latest_checkpoint, load_training_state, save_checkpoint, set_rng_state
from .config import AlgoConfig, ModelConfig, TrainConfig, to_dict
from .curriculum import Curriculum
from .evaluate import EvalResult, evaluate
from .logging import MetricsLogger, read_metrics
from .policy import VLMPolicy, add_action_tokens, apply_model_options, build_tiny, masked_images
from .rollout import collect_episodes
from .types import Episodes, cat_episodes

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
METRIC_LABELS = {"iou": "mean IoU", "reward": "mean reward", "success": "success"}


def load_policy(cfg: ModelConfig, checkpoint: str | Path | None = None) -> VLMPolicy:
    """The policy a config names: a checkpoint folder, a model folder, or a random "tiny:<arch>" model."""
    kwargs = {"prompt_template": cfg.prompt_template}
    if checkpoint is not None:
        return VLMPolicy.from_pretrained(checkpoint, dtype=DTYPES[cfg.dtype], device=cfg.device, **kwargs)
    if cfg.path.startswith("tiny:"):
        policy = build_tiny(cfg.path.removeprefix("tiny:"), seed=cfg.seed, **kwargs)
        policy.model.to(device=cfg.device, dtype=DTYPES[cfg.dtype])
        return policy
    path = Path(cfg.path)
    if not path.is_absolute() and not path.exists():
        # Presets name assets relative to the repository; let them run from any working directory.
        candidate = Path(__file__).resolve().parents[1] / path
        path = candidate if candidate.exists() else path
    return VLMPolicy.from_pretrained(path, dtype=DTYPES[cfg.dtype], device=cfg.device, **kwargs)


def held_out(policy: VLMPolicy, cfg: TrainConfig, world: distributed.World | None = None) -> EvalResult:
    """Greedy play on the held-out seeds; under torchrun every process plays its 1/K of them (rank 0 gets the
    samples) and must call this."""
    with distributed.full_weights(policy.model):  # under FSDP: whole weights, so processes may play unevenly
        return evaluate(
            policy,
            cfg.env.name,
            cfg.env.options,
            episodes=cfg.trainer.eval_episodes,
            batch_size=cfg.trainer.eval_batch_size,
            max_new_tokens=cfg.sampling.max_new_tokens,
            world=world,
        )


def starting_policy(
    cfg: TrainConfig, policy: VLMPolicy | None, env, out: Path, world: distributed.World | None = None
) -> VLMPolicy:
    """The policy RL starts from: the configured model, given action tokens for a continuous env, and cold-started
    on the env's scripted demonstrations when `sft.episodes > 0` (kept in `<output_dir>/cold_start`, so a resumed
    run finds it instead of repeating it). Only rank 0 prints and writes `cold_start`."""
    from .sft import collect_demonstrations, train_on_demonstrations

    world = world or distributed.World()
    main = world.is_main
    cold_start = out / "cold_start"
    if cfg.sft.episodes > 0 and (cold_start / "config.json").exists():
        return apply_model_options(load_policy(cfg.model, checkpoint=cold_start), cfg.model)
    policy = policy if policy is not None else load_policy(cfg.model, checkpoint=cfg.checkpoint)
    if env.action_kind == "continuous" and policy.action_codec is None:
        if cfg.model.action_bins < 2:
            raise ValueError(f"env {cfg.env.name!r} takes continuous actions: set model.action_bins (e.g. 256)")
        add_action_tokens(policy, env.action_low, env.action_high, cfg.model.action_bins, cfg.model.action_chunk)
    # After the action tokens exist (LoRA keeps their rows trainable), before anything trains.
    policy = apply_model_options(policy, cfg.model)
    if cfg.sft.episodes > 0:
        if not hasattr(env, "expert_action"):
            raise ValueError(f"sft.episodes > 0 needs an env with a scripted expert; {cfg.env.name!r} has none")
        initial = held_out(policy, cfg, world)
        images, instructions, labels, rate = collect_demonstrations(
            env, policy.action_codec, cfg.sft.episodes, noise=cfg.sft.noise, seed=cfg.trainer.seed,
            label_noise=cfg.sft.label_noise,
        )  # fmt: skip
        if main:
            print(f"held-out {cfg.env.eval_metric} of the initial model: {initial.metrics[cfg.env.eval_metric]:.3f}\n"
                  f"{len(instructions)} demonstration steps from {cfg.sft.episodes} episodes "
                  f"(demonstrator success {rate:.2f}; noise {cfg.sft.noise}, label noise {cfg.sft.label_noise})",
                  file=sys.stderr)  # fmt: skip
        # Every process runs the seeded cold start (no long wait at a barrier); shard_model gives all rank 0's.
        train_on_demonstrations(
            policy, images, instructions, labels, steps=cfg.sft.steps, batch_size=cfg.sft.batch_size, lr=cfg.sft.lr,
            seed=cfg.trainer.seed,
        )  # fmt: skip
        if main:
            tmp = out / "cold_start.tmp"
            shutil.rmtree(tmp, ignore_errors=True)  # a half-written one from a killed run
            policy.save_pretrained(tmp)
            (tmp / "initial_eval.json").write_text(json.dumps(initial.metrics, indent=2))
            tmp.rename(cold_start)  # atomic: a folder named cold_start is always complete
    return policy


def make_env(cfg: TrainConfig, num_envs: int, curriculum: Curriculum):
    """The training env: in this process, or its worlds spread over `env.workers` Ray actors."""
    from sim.workers import make_vec_env

    options = curriculum.options(cfg.env.options)
    return make_vec_env(cfg.env.name, num_envs, cfg.env.workers, cfg.env.worker_timeout_s, **options)


def _check_rollout_workers(cfg: TrainConfig, generation_shards: int | None) -> None:
    """Refuse `trainer.rollout_workers` settings that cannot work, naming the fields (before anything is loaded)."""
    tc = cfg.trainer
    k = tc.rollout_workers
    if k < 0:
        raise ValueError(f"trainer.rollout_workers must be >= 0 (0: generate in this process), got {k}")
    if not k:
        return
    if tc.rollout_timeout_s <= 0:
        raise ValueError(f"trainer.rollout_timeout_s must be > 0, got {tc.rollout_timeout_s}")
    if cfg.env.workers:
        raise ValueError("trainer.rollout_workers and env.workers cannot both be > 0: each rollout worker has its env")
    if cfg.model.generation_backend == "vllm":
        raise ValueError(
            "trainer.rollout_workers runs CPU copies of the policy; it cannot use generation_backend vllm"
        )
    shards = generation_shards or tc.generation_shards or 1  # 0: one shard per process, and there is one
    if shards % k:
        raise ValueError(
            f"trainer.rollout_workers={k} needs trainer.generation_shards set to a multiple of {k} (a step's shards "
            f"are what the workers share); got {generation_shards or tc.generation_shards}"
        )


def keep_groups(episodes: Episodes, ac: AlgoConfig) -> torch.Tensor:
    """`[B]` bool: the groups the data-side filters keep (all, when none is on)."""
    returns = episodes.returns(ac.gamma)
    keep = torch.ones(returns.numel() // ac.group_size, dtype=torch.bool)
    if ac.dynamic_sampling:
        # Groups whose returns are all equal have zero advantage everywhere: no signal, only noise.
        keep &= dynamic_sampling_keep(returns, ac.group_size)
    if ac.difficulty_low is not None or ac.difficulty_high is not None:
        accuracy = episodes.success.float() if episodes.success is not None else returns
        low = ac.difficulty_low if ac.difficulty_low is not None else float("-inf")
        high = ac.difficulty_high if ac.difficulty_high is not None else float("inf")
        keep &= difficulty_filter_keep(accuracy, ac.group_size, low, high)
    return keep


def shaped_step_rewards(episodes: Episodes, ac: AlgoConfig, max_new_tokens: int) -> torch.Tensor:
    """`[R, T]` turn rewards plus DAPO's soft overlong penalty of each turn's completion (when it is on)."""
    step_rewards = episodes.step_rewards.clone()
    if ac.overlong_penalty > 0:
        lengths = episodes.rollout.completion_mask.sum(-1)  # [M] generated tokens
        penalty = soft_overlong_penalty(lengths, max_new_tokens, ac.overlong_cache_len, ac.overlong_penalty)
        step_rewards.index_put_((episodes.world, episodes.turn), penalty, accumulate=True)
    return step_rewards


def write_episode_media(result: EvalResult, stem: Path) -> None:
    """An animated GIF and a frame strip of the held-out episodes that `result` recorded (multi-step tasks)."""
    if result.frames is None:
        return
    from . import plots

    try:
        plots.episode_gif(result.frames, stem.with_suffix(".gif"), success=result.success)
        plots.frame_strip(result.frames[0], stem.with_name(stem.name + "_strip.png"), title=result.instructions[0])
    except ImportError as e:
        print(f"skipped episode pictures: {e}", file=sys.stderr)


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
        stop_after: end right after the checkpoint of this step, as if killed there (used by resume tests).
        generation_shards: S, the number of separately seeded generations the step's B prompts are split into
            (default: one per process, K). Samples then depend on S, never on K: one process with S = K draws
            exactly what a K-process torchrun run draws.
    """
    precision.check_master_weights(cfg)
    _check_rollout_workers(cfg, generation_shards)
    live: dict[str, Any] = {}  # what holds processes or contexts (env, rollout workers): closed however the run ends
    try:
        return _train(cfg, policy, stop_after, generation_shards, live)
    finally:
        for name, thing in live.items():
            try:
                thing.close()
            except Exception as error:  # noqa: BLE001  (the run's own error, if any, is the one to see)
                print(f"closing the {name} failed: {error!r}", file=sys.stderr)


def _train(
    cfg: TrainConfig,
    policy: VLMPolicy | None,
    stop_after: int | None,
    generation_shards: int | None,
    live: dict[str, Any],
) -> list[dict]:
    """`train`'s body; it keeps what must be closed in `live` (closed by `train`, on success or failure)."""
    tc, ac = cfg.trainer, cfg.algo
    world = distributed.init_world(cfg.model.device)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if world.is_main:
        (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    if world.device.startswith("cuda"):  # "cuda" or "cuda:0" in the config: under torchrun, this process's GPU
        cfg = replace(cfg, model=replace(cfg.model, device=world.device))
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    compute_dtype = DTYPES[cfg.model.dtype]
    use_masters = tc.master_weights == "float32"
    # With float32 master weights the model loads in float32: those are the masters' starting values (a resumed
    # run's, saved in float32); it computes in model.dtype from the sharding or MasterWeights on.
    load_cfg = replace(cfg, model=replace(cfg.model, dtype="float32")) if use_masters else cfg

    # ------------------------------------------------------------------ BUILD
    group_size, batch = ac.group_size, tc.prompts_per_step
    num_shards = generation_shards or tc.generation_shards or world.size
    my_shards = distributed.prompt_shards(batch, num_shards, world)
    shard_rows = batch // num_shards * group_size  # worlds of one shard; the env holds one shard at a time
    rows = len(my_shards) * shard_rows  # this process's R
    curriculum = Curriculum(cfg.curriculum)
    resume_from = latest_checkpoint(out) if cfg.resume else None
    state = load_training_state(resume_from)[0] if resume_from is not None else {}
    if "curriculum" in state:
        curriculum.load_state_dict(state["curriculum"])
    if tc.rollout_workers and world.size > 1:
        raise ValueError("trainer.rollout_workers > 0 under torchrun is not supported: use one trainer process")
    env = live["env"] = make_env(cfg, shard_rows, curriculum)
    # The starting policy is needed to train from, or as the KL anchor (also after a resume); load it only then.
    if resume_from is None or ac.kl_coef > 0:
        policy = starting_policy(load_cfg, policy, env, out, world)
    reference = None
    if ac.kl_coef > 0:
        reference = copy.deepcopy(policy)  # before sharding: an FSDP module cannot be copied
        reference.model.requires_grad_(False).eval()
        if use_masters:  # loaded in float32 for the masters; the reference needs none
            precision.cast_parameters(reference.model, compute_dtype)
        distributed.shard_model(
            reference.model, world, frozen=True, compute_dtype=compute_dtype if use_masters else None
        )
    if resume_from is not None:
        policy = apply_model_options(load_policy(load_cfg.model, checkpoint=resume_from), cfg.model)
    if use_masters:
        precision.cast_parameters(policy.model, torch.float32)  # no-op for a float32 load, not for a policy passed in
    # Before the optimiser: it holds the sharded parameters. Under FSDP the float32 shards are the master weights.
    model = distributed.shard_model(policy.model, world, compute_dtype=compute_dtype if use_masters else None)
    model.train()

    advantage_fn = algos.ADVANTAGES.get(ac.advantage)
    loss_fn = algos.POLICY_LOSSES.get(ac.loss)
    sampling = cfg.sampling
    if policy.action_codec is not None:  # a VLA emits exactly C*D action tokens per generation
        sampling = replace(sampling, max_new_tokens=policy.action_codec.tokens_per_generation)

    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA adapters, or all but a frozen vision tower
    master = precision.MasterWeights(model, compute_dtype) if use_masters and world.size == 1 else None
    trainable = master.params if master is not None else trainable  # the optimiser steps the float32 copies
    optimizer = torch.optim.AdamW(trainable, lr=tc.lr, weight_decay=tc.weight_decay)
    warmup = max(tc.warmup_steps, 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)

    start_step = 0
    if resume_from is not None:
        _, states = load_training_state(resume_from)
        distributed.load_optimizer_state(model, optimizer, states["optimizer"], world)
        scheduler.load_state_dict(states["scheduler"])
        set_rng_state(states["rng"])
        start_step = state["step"]
        if world.is_main:
            print(f"resumed from {resume_from} (step {start_step})", file=sys.stderr)
    rollout_workers = None
    if tc.rollout_workers > 0:
        from .rollout_workers import RolloutWorkers

        rollout_workers = live["rollout workers"] = RolloutWorkers(
            policy, cfg.env.name, shard_rows, curriculum.options(cfg.env.options), tc.rollout_workers,
            threads=max(tc.threads, 1), timeout_s=tc.rollout_timeout_s,
        )  # fmt: skip
    # Rank 0 writes the metrics; the others log into the void (they still use the logged values).
    metrics_path = out / "metrics.jsonl" if world.is_main else os.devnull
    logger = MetricsLogger(metrics_path, resume_step=start_step if resume_from is not None else None)

    label = METRIC_LABELS.get(cfg.env.eval_metric, cfg.env.eval_metric)
    if "eval_before" not in state:
        before = held_out(policy, cfg, world)
        state["eval_before"] = before.metrics
        logger.log(0, {f"eval/{k}": v for k, v in before.metrics.items()})
        if world.is_main:
            print(f"held-out {label} before training: {before.metrics[cfg.env.eval_metric]:.3f}", file=sys.stderr)
            write_episode_media(before, out / "episodes_before")

    # ------------------------------------------------------------------ LOOP
    bar = tqdm(
        range(start_step, tc.total_steps), initial=start_step, total=tc.total_steps, desc="grpo", dynamic_ncols=True,
        disable=not world.is_main,
    )  # fmt: skip
    for step in bar:
        t0 = time.perf_counter()

        # ---- collect: G worlds per prompt reset with the same seed, episodes run to their end. Filters (dynamic
        # sampling, difficulty) drop groups; more batches are sampled until B groups pass or the budget is spent.
        # Each process collects whole groups of its B/K prompts, one seeded shard at a time (sampling_seed), with
        # whole weights: generation runs no collective, so processes may make different numbers of forward passes.
        sampled, kept_parts, kept_groups = [], [], 0
        with distributed.full_weights(model):
            if rollout_workers is not None:
                rollout_workers.sync(policy)
            for attempt in range(max(ac.max_sample_batches, 1)):
                seeds = train_seeds(
                    step + attempt * tc.total_steps, batch, group_size, base=tc.seed * TRAIN_SEED_STRIDE
                )
                jobs = [
                    (seeds[shard * shard_rows : (shard + 1) * shard_rows], group_size, sampling,
                     distributed.sampling_seed(tc.seed, step, shard, attempt))
                    for shard in my_shards
                ]  # fmt: skip
                if rollout_workers is not None:
                    parts = rollout_workers.collect(jobs)
                else:
                    parts = []
                    for shard_seeds, _, _, sampling_seed in jobs:
                        torch.manual_seed(sampling_seed)
                        parts.append(collect_episodes(policy, env, shard_seeds, group_size, sampling))
                episodes = cat_episodes(parts, policy.pad_token_id or 0)
                sampled.append(episodes)
                keep = keep_groups(episodes, ac)  # [B/K]
                if keep.any():
                    kept_parts.append(episodes.select_worlds(keep.repeat_interleave(group_size).nonzero().squeeze(-1)))
                    kept_groups += int(keep.sum())
                if kept_groups >= batch // world.size:
                    break
        t_gen = time.perf_counter() - t0
        stats = cat_episodes(sampled, policy.pad_token_id or 0)  # everything sampled, for logging
        # Nothing passed the filters: train on the first batch (zero advantages; only KL/entropy terms act).
        episodes = cat_episodes(kept_parts, policy.pad_token_id or 0) if kept_parts else sampled[0]
        if episodes.num_worlds > rows:
            episodes = episodes.select_worlds(torch.arange(rows))
        rollout = episodes.rollout

        # ---- score: episode returns (discounted over turns), plus any length shaping of the rows
        step_rewards = shaped_step_rewards(episodes, ac, sampling.max_new_tokens)  # [R', T]
        if ac.overlong_filter:
            # Truncated = no EOS generated; such rows stay in the group statistics but leave the loss.
            truncated = ~torch.isin(rollout.completion_ids, torch.tensor(policy.eos_token_ids)).any(-1)  # [M]
            rollout = replace(rollout, completion_mask=overlong_mask(rollout.completion_mask, 0, truncated=truncated))
        if ac.credit == "step":
            returns = discounted_returns(step_rewards, episodes.dones, ac.gamma)  # [R', T] returns-to-go
            turn_advantages = step_group_advantages(returns, episodes.active, group_size, scale_by_std=ac.scale_by_std)
            advantages = turn_advantages[episodes.world, episodes.turn]  # [M]
        else:
            discount = ac.gamma ** torch.arange(step_rewards.shape[1], dtype=torch.float32)
            returns = (step_rewards * discount).sum(-1)  # [R']
            # Over every process's returns: an estimator may normalise over the whole batch (REINFORCE++).
            all_returns, first = world.gather_rows(returns)
            advantages = advantage_fn(all_returns, group_size=group_size, scale_by_std=ac.scale_by_std)
            advantages = advantages[first : first + len(returns)][episodes.world]
        masked = None
        if ac.papo_gamma > 0:
            mask_rng = torch.Generator().manual_seed(tc.seed * 1_000_003 + step + (world.rank << 32))
            masked = masked_images(policy, rollout, ac.papo_mask, ac.papo_mask_ratio, mask_rng)

        # ---- update: one pass over micro-batches. Each slice's loss is weighted by its share of the batch
        # (tokens for token_mean, rows for the per-sequence means; of every process) so the sum over slices and
        # processes equals the full-batch loss.
        optimizer.zero_grad(set_to_none=True)
        total_tokens = world.sum(rollout.completion_mask.sum()).clamp(min=1)
        sums: dict[str, torch.Tensor | float] = {"loss/policy": 0.0, "loss/kl": 0.0}
        n_rows = len(rollout)
        total_rows = world.sum(n_rows)
        with_entropy = ac.entropy_coef > 0 or ac.papo_eta > 0
        # FSDP's forward and backward are collectives: every process runs as many slices as the one with the most
        # rows, and a process out of rows repeats its first slice with weight 0.
        if tc.token_budget > 0:  # slices of at most token_budget padded tokens, each trimmed of its padding
            slices = token_budget_slices(rollout.prompt_mask, rollout.completion_mask, tc.token_budget)
        else:
            slices = [(a, min(a + tc.micro_batch_size, n_rows)) for a in range(0, n_rows, tc.micro_batch_size)]
        for index in range(world.max(len(slices))):
            idle = index >= len(slices)
            start, stop = slices[0] if idle else slices[index]
            mb = rollout.rows(start, stop)
            mb = trim_padding(mb) if tc.token_budget > 0 else mb
            if ac.aggregation == "token_mean":
                weight = mb.completion_mask.sum() / total_tokens
            else:
                weight = torch.tensor((stop - start) / total_rows)
            weight = torch.zeros_like(weight) if idle else weight
            out_lp = policy.logprobs(mb, temperature=sampling.temperature, with_entropy=with_entropy)
            logprobs, entropy = out_lp if with_entropy else (out_lp, None)  # [r, L] each
            # One update per rollout: the sampling-time log-probs are the "old" ones (ratio 1 at the start).
            lo = loss_fn(
                logprobs,
                mb.logprobs,
                advantages[start:stop],
                mb.completion_mask,
                clip_low=ac.clip_low,
                clip_high=ac.clip_high,
                aggregation=ac.aggregation,
                max_len=sampling.max_new_tokens,
            )
            loss = lo.loss
            if reference is not None:
                with torch.no_grad():
                    ref_logprobs = reference.logprobs(mb, temperature=sampling.temperature)
                per_token_kl = kl_estimate(logprobs, ref_logprobs, ac.kl_estimator, mask=mb.completion_mask)
                kl = aggregate(per_token_kl, mb.completion_mask, ac.aggregation, max_len=sampling.max_new_tokens)
                loss = loss + ac.kl_coef * kl
                sums["loss/kl"] += kl.detach() * weight
            extras = []
            if ac.entropy_coef > 0:
                extras.append(
                    entropy_bonus_loss(
                        entropy, mb.completion_mask, coef=ac.entropy_coef, aggregation=ac.aggregation,
                        max_len=sampling.max_new_tokens,
                    )
                )  # fmt: skip
            if masked is not None:
                # PAPO: the same tokens scored with part of the image hidden; their KL to the real pass is pushed up.
                with torch.set_grad_enabled(ac.papo_grad_through_masked):
                    mb_masked = masked.rows(start, stop)
                    mb_masked = trim_padding(mb_masked) if tc.token_budget > 0 else mb_masked
                    out_m = policy.logprobs(mb_masked, sampling.temperature, with_entropy=with_entropy)
                masked_logprobs, masked_entropy = out_m if with_entropy else (out_m, None)
                extras.append(
                    papo_loss_terms(
                        logprobs, masked_logprobs, mb.completion_mask, gamma=ac.papo_gamma, eta=ac.papo_eta,
                        entropy=entropy, masked_entropy=masked_entropy, bound=ac.papo_kl_bound,
                        aggregation=ac.aggregation, max_len=sampling.max_new_tokens,
                    )
                )  # fmt: skip
            for extra in extras:
                loss = loss + extra.loss
            # FSDP averages gradients over the K processes; the weights already divide by the whole batch.
            (loss * weight * world.size).backward()
            sums["loss/policy"] += lo.loss.detach() * weight
            for k, v in [m for o in (lo, *extras) for m in o.metrics.items()]:
                sums[k] = sums.get(k, 0.0) + v * weight
        grad_norm = distributed.clip_grad_norm(trainable, tc.max_grad_norm)  # of the whole gradient, every process
        optimizer.step()
        if master is not None:
            master.copy_to_model()
        scheduler.step()

        # ---- log (over every episode sampled this step, before any filter)
        metrics = {
            "reward/total": shaped_step_rewards(stats, ac, sampling.max_new_tokens).sum(-1).mean(),
            **{f"reward/{k}": v.mean() for k, v in stats.components.items()},
            **sums,
            "grad_norm": grad_norm,
            "lr": scheduler.get_last_lr()[0],
            "completion_len": stats.rollout.completion_mask.sum(-1).float().mean(),  # as generated
            "perf/step_s": time.perf_counter() - t0,
            "perf/generate_s": t_gen,
            "perf/tokens_per_s": stats.rollout.completion_mask.sum() / (time.perf_counter() - t0),
        }
        if ac.overlong_penalty > 0:
            metrics["reward/overlong"] = (
                (shaped_step_rewards(stats, ac, sampling.max_new_tokens) - stats.step_rewards).sum(-1).mean()
            )
        if stats.step_rewards.shape[1] > 1:
            metrics["env/episode_steps"] = stats.env_steps.float().mean()
        if ac.dynamic_sampling or ac.difficulty_low is not None or ac.difficulty_high is not None:
            metrics["data/kept_groups"] = kept_groups
            metrics["data/sampled_batches"] = len(sampled)
        if stats.success is not None:
            metrics["env/success_rate"] = stats.success.float().mean()
        if curriculum.enabled:
            metrics["curriculum/level"] = curriculum.level
        metrics = world.reduce_metrics(  # the whole batch's, alike in every process (the curriculum reads them)
            metrics, weight=stats.num_worlds, weights={"completion_len": len(stats.rollout)},
            summed=(*sums, "data/kept_groups", "perf/tokens_per_s"),
            maxed=("grad_norm", "lr", "perf/step_s", "perf/generate_s", "data/sampled_batches", "curriculum/level"),
        )  # fmt: skip
        logged = logger.log(step + 1, metrics)
        bar.set_postfix(reward=f"{logged['reward/total']:.3f}", loss=f"{logged['loss/policy']:+.3f}")
        score = logged.get("env/success_rate", logged["reward/total"])
        if curriculum.update(score):
            live.pop("env").close()
            env = live["env"] = make_env(cfg, shard_rows, curriculum)
            if rollout_workers is not None:
                rollout_workers.set_env(curriculum.options(cfg.env.options))
            if world.is_main:
                print(f"curriculum: {cfg.curriculum.option} = {cfg.curriculum.levels[curriculum.level]}",
                      file=sys.stderr)  # fmt: skip
        state["curriculum"] = curriculum.state_dict()

        # ---- evaluate
        if tc.eval_every and (step + 1) % tc.eval_every == 0 and step + 1 < tc.total_steps:
            logger.log(step + 1, {f"eval/{k}": v for k, v in held_out(policy, cfg, world).metrics.items()})

        # ---- checkpoint
        if (tc.save_every and (step + 1) % tc.save_every == 0) or step + 1 == tc.total_steps or step + 1 == stop_after:
            # Full weights and optimiser state, gathered by every process, written by rank 0.
            saved_policy, saved_optimizer = distributed.checkpoint_views(policy, optimizer, world)
            if master is not None:  # the float32 master weights, not their rounding
                saved_policy = distributed.with_weights(policy, master.state_dict())
            if world.is_main:
                save_checkpoint(out, step + 1, saved_policy, saved_optimizer, scheduler, state, tc.keep_checkpoints)
        if stop_after is not None and step + 1 >= stop_after:
            bar.close()
            world.barrier()  # rank 0 has written what the others read back
            return read_metrics(out / "metrics.jsonl")
    bar.close()

    # ------------------------------------------------------------------ REPORT
    for name in ("env", "rollout workers"):  # not needed by the held-out evaluation, which builds its own envs
        if name in live:
            live.pop(name).close()
    after = held_out(policy, cfg, world)
    logger.log(tc.total_steps, {f"eval/{k}": v for k, v in after.metrics.items()})
    if world.is_main:
        write_episode_media(after, out / "episodes_after")
        report(cfg, policy, state["eval_before"], after, out)
    world.barrier()
    return read_metrics(out / "metrics.jsonl")


def report(cfg: TrainConfig, policy: VLMPolicy, before: dict, after: EvalResult, out: Path) -> None:
    """Print the held-out line and draw the run's pictures."""
    from . import plots

    metric = cfg.env.eval_metric
    label = METRIC_LABELS.get(metric, metric)
    metrics = read_metrics(out / "metrics.jsonl")
    keys = tuple(dict.fromkeys(k for m in metrics for k in m if k.startswith("reward/")))  # every component, in order
    try:
        plots.reward_curve(metrics, out / "reward_curve.png", keys=keys or ("reward/total",))
        if "target_box" in after.info and "pred_box" in after.info:
            plots.box_grid(
                after.images,
                after.info["target_box"],
                after.info["pred_box"],
                after.instructions,
                out / "predictions.png",
            )
    except ImportError as e:  # matplotlib is an extra; the run's numbers matter more than its pictures
        print(f"skipped plots: {e}", file=sys.stderr)
    scores = {"before": before, "after": after.metrics}
    initial_file = out / "cold_start" / "initial_eval.json"
    if (
        cfg.sft.episodes > 0 and initial_file.exists()
    ):  # a cold start ran: the run's "before" is the model before the demonstrations
        scores["initial"] = json.loads(initial_file.read_text())
        print(f"held-out {label} (initial model -> after demonstrations -> after RL): {scores['initial'][metric]:.3f}"
              f" -> {before[metric]:.3f} -> {after.metrics[metric]:.3f}")  # fmt: skip
        before = scores["initial"]
    (out / "eval.json").write_text(json.dumps(scores, indent=2))
    print(f"held-out {label}: {before[metric]:.3f} -> {after.metrics[metric]:.3f}")
