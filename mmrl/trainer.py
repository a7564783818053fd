"""The GRPO trainer: one loop, read top to bottom.

build (config -> env, policy, reference, optimiser) -> collect a rollout -> score -> advantages -> update
(micro-batches, gradient accumulation) -> log -> evaluate -> checkpoint.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

import sim

from . import algos
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
from .checkpoint import latest_checkpoint, load_training_state, save_checkpoint, set_rng_state
from .config import AlgoConfig, ModelConfig, TrainConfig, to_dict
from .curriculum import Curriculum
from .evaluate import EvalResult, evaluate, train_seeds
from .logging import MetricsLogger, read_metrics
from .policy import VLMPolicy, add_action_tokens, build_tiny, masked_images
from .rollout import Episodes, cat_episodes, collect_episodes

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


def held_out(policy: VLMPolicy, cfg: TrainConfig) -> EvalResult:
    return evaluate(
        policy,
        cfg.env.name,
        cfg.env.options,
        episodes=cfg.trainer.eval_episodes,
        batch_size=cfg.trainer.eval_batch_size,
        max_new_tokens=cfg.sampling.max_new_tokens,
    )


def starting_policy(cfg: TrainConfig, policy: VLMPolicy | None, env, out: Path) -> VLMPolicy:
    """The policy RL starts from: the configured model, given action tokens for a continuous env, and cold-started
    on the env's scripted demonstrations when `sft.episodes > 0` (kept in `<output_dir>/cold_start`, so a resumed
    run finds it instead of repeating it)."""
    from .sft import collect_demonstrations, train_on_demonstrations

    cold_start = out / "cold_start"
    if cfg.sft.episodes > 0 and (cold_start / "config.json").exists():
        return load_policy(cfg.model, checkpoint=cold_start)
    policy = policy if policy is not None else load_policy(cfg.model, checkpoint=cfg.checkpoint)
    if env.action_kind == "continuous" and policy.action_codec is None:
        if cfg.model.action_bins < 2:
            raise ValueError(f"env {cfg.env.name!r} takes continuous actions: set model.action_bins (e.g. 256)")
        add_action_tokens(policy, env.action_low, env.action_high, cfg.model.action_bins, cfg.model.action_chunk)
    if cfg.sft.episodes > 0:
        if policy.action_codec is None:
            raise ValueError("sft.episodes > 0 needs a continuous-action env with a scripted expert")
        initial = held_out(policy, cfg)
        print(f"held-out {cfg.env.eval_metric} of the initial model: {initial.metrics[cfg.env.eval_metric]:.3f}",
              file=sys.stderr)  # fmt: skip
        images, instructions, tokens, rate = collect_demonstrations(
            env, policy.action_codec, cfg.sft.episodes, noise=cfg.sft.noise, seed=cfg.trainer.seed
        )
        print(f"{len(instructions)} demonstration steps from {cfg.sft.episodes} episodes "
              f"(expert success {rate:.2f} under noise {cfg.sft.noise})", file=sys.stderr)  # fmt: skip
        train_on_demonstrations(
            policy, images, instructions, tokens, steps=cfg.sft.steps, batch_size=cfg.sft.batch_size, lr=cfg.sft.lr,
            seed=cfg.trainer.seed,
        )  # fmt: skip
        tmp = out / "cold_start.tmp"
        policy.save_pretrained(tmp)
        (tmp / "initial_eval.json").write_text(json.dumps(initial.metrics, indent=2))
        tmp.rename(cold_start)  # atomic: a folder named cold_start is always complete
    return policy


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


def train(cfg: TrainConfig, policy: VLMPolicy | None = None, stop_after: int | None = None) -> list[dict]:
    """Train with GRPO and return the logged metrics (one dict per step).

    Args:
        cfg: the run's configuration.
        policy: a policy to train instead of the one `cfg.model` names (tests pass tiny ones).
        stop_after: end right after the checkpoint of this step, as if killed there (used by resume tests).
    """
    tc, ac = cfg.trainer, cfg.algo
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)

    # ------------------------------------------------------------------ BUILD
    group_size, batch = ac.group_size, tc.prompts_per_step
    rows = batch * group_size
    curriculum = Curriculum(cfg.curriculum)
    resume_from = latest_checkpoint(out) if cfg.resume else None
    state = load_training_state(resume_from)[0] if resume_from is not None else {}
    if "curriculum" in state:
        curriculum.load_state_dict(state["curriculum"])
    env = sim.make(cfg.env.name, num_envs=rows, **curriculum.options(cfg.env.options))
    # The starting policy is needed to train from, or as the KL anchor (also after a resume); load it only then.
    if resume_from is None or ac.kl_coef > 0:
        policy = starting_policy(cfg, policy, env, out)
    reference = None
    if ac.kl_coef > 0:
        reference = copy.deepcopy(policy)
        reference.model.requires_grad_(False).eval()
    if resume_from is not None:
        policy = load_policy(cfg.model, checkpoint=resume_from)
    model = policy.model
    model.train()
    (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))

    advantage_fn = algos.ADVANTAGES.get(ac.advantage)
    loss_fn = algos.POLICY_LOSSES.get(ac.loss)
    sampling = cfg.sampling
    if policy.action_codec is not None:  # a VLA emits exactly C*D action tokens per generation
        sampling = replace(sampling, max_new_tokens=policy.action_codec.tokens_per_generation)

    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    warmup = max(tc.warmup_steps, 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)

    start_step = 0
    if resume_from is not None:
        _, states = load_training_state(resume_from)
        optimizer.load_state_dict(states["optimizer"])
        scheduler.load_state_dict(states["scheduler"])
        set_rng_state(states["rng"])
        start_step = state["step"]
        print(f"resumed from {resume_from} (step {start_step})", file=sys.stderr)
    logger = MetricsLogger(out / "metrics.jsonl", resume_step=start_step if resume_from is not None else None)

    label = METRIC_LABELS.get(cfg.env.eval_metric, cfg.env.eval_metric)
    if "eval_before" not in state:
        before = held_out(policy, cfg)
        state["eval_before"] = before.metrics
        logger.log(0, {f"eval/{k}": v for k, v in before.metrics.items()})
        print(f"held-out {label} before training: {before.metrics[cfg.env.eval_metric]:.3f}", file=sys.stderr)
        write_episode_media(before, out / "episodes_before")

    # ------------------------------------------------------------------ LOOP
    bar = tqdm(
        range(start_step, tc.total_steps), initial=start_step, total=tc.total_steps, desc="grpo", dynamic_ncols=True
    )
    for step in bar:
        t0 = time.perf_counter()
        # Sampling randomness is a function of (seed, step) alone, so a resumed run samples what an
        # uninterrupted one would have.
        torch.manual_seed(tc.seed * 1_000_003 + step)

        # ---- collect: G worlds per prompt reset with the same seed, episodes run to their end. Filters (dynamic
        # sampling, difficulty) drop groups; more batches are sampled until B groups pass or the budget is spent.
        sampled, kept_parts, kept_groups = [], [], 0
        for attempt in range(max(ac.max_sample_batches, 1)):
            seeds = train_seeds(step + attempt * tc.total_steps, batch, group_size, base=tc.seed * 100_000_000)
            episodes = collect_episodes(policy, env, seeds, group_size, sampling)
            sampled.append(episodes)
            keep = keep_groups(episodes, ac)  # [B]
            if keep.any():
                kept_parts.append(episodes.select_worlds(keep.repeat_interleave(group_size).nonzero().squeeze(-1)))
                kept_groups += int(keep.sum())
            if kept_groups >= batch:
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
            advantages = advantage_fn(returns, group_size=group_size, scale_by_std=ac.scale_by_std)[episodes.world]
        masked = None
        if ac.papo_gamma > 0:
            mask_rng = torch.Generator().manual_seed(tc.seed * 1_000_003 + step)
            masked = masked_images(policy, rollout, ac.papo_mask, ac.papo_mask_ratio, mask_rng)

        # ---- update: one pass over micro-batches. Each slice's loss is weighted by its share of the batch
        # (tokens for token_mean, rows for the per-sequence means) so the sum equals the full-batch loss.
        optimizer.zero_grad(set_to_none=True)
        total_tokens = rollout.completion_mask.sum().clamp(min=1)
        sums: dict[str, torch.Tensor | float] = {"loss/policy": 0.0, "loss/kl": 0.0}
        n_rows = len(rollout)
        with_entropy = ac.entropy_coef > 0 or ac.papo_eta > 0
        for start in range(0, n_rows, tc.micro_batch_size):
            stop = min(start + tc.micro_batch_size, n_rows)
            mb = rollout.rows(start, stop)
            if ac.aggregation == "token_mean":
                weight = mb.completion_mask.sum() / total_tokens
            else:
                weight = torch.tensor((stop - start) / n_rows)
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
                    out_m = policy.logprobs(masked.rows(start, stop), sampling.temperature, with_entropy=with_entropy)
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
            (loss * weight).backward()
            sums["loss/policy"] += lo.loss.detach() * weight
            for k, v in [m for o in (lo, *extras) for m in o.metrics.items()]:
                sums[k] = sums.get(k, 0.0) + v * weight
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.max_grad_norm)
        optimizer.step()
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
        logged = logger.log(step + 1, metrics)
        bar.set_postfix(reward=f"{logged['reward/total']:.3f}", loss=f"{logged['loss/policy']:+.3f}")
        score = logged.get("env/success_rate", logged["reward/total"])
        if curriculum.update(score):
            env.close()
            env = sim.make(cfg.env.name, num_envs=rows, **curriculum.options(cfg.env.options))
            print(f"curriculum: {cfg.curriculum.option} = {cfg.curriculum.levels[curriculum.level]}", file=sys.stderr)
        state["curriculum"] = curriculum.state_dict()

        # ---- evaluate
        if tc.eval_every and (step + 1) % tc.eval_every == 0 and step + 1 < tc.total_steps:
            logger.log(step + 1, {f"eval/{k}": v for k, v in held_out(policy, cfg).metrics.items()})

        # ---- checkpoint
        if (tc.save_every and (step + 1) % tc.save_every == 0) or step + 1 == tc.total_steps or step + 1 == stop_after:
            save_checkpoint(out, step + 1, policy, optimizer, scheduler, state, keep=tc.keep_checkpoints)
        if stop_after is not None and step + 1 >= stop_after:
            bar.close()
            return read_metrics(out / "metrics.jsonl")
    bar.close()

    # ------------------------------------------------------------------ REPORT
    after = held_out(policy, cfg)
    logger.log(tc.total_steps, {f"eval/{k}": v for k, v in after.metrics.items()})
    write_episode_media(after, out / "episodes_after")
    report(cfg, policy, state["eval_before"], after, out)
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
    (out / "eval.json").write_text(json.dumps({"before": before, "after": after.metrics}, indent=2))
    print(f"held-out {label}: {before[metric]:.3f} -> {after.metrics[metric]:.3f}")
