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
from .algos.data import dynamic_sampling_keep, overlong_mask, soft_overlong_penalty
from .algos.papo import papo_loss_terms
from .checkpoint import latest_checkpoint, load_training_state, save_checkpoint, set_rng_state
from .config import ModelConfig, TrainConfig, to_dict
from .evaluate import EvalResult, evaluate, train_seeds
from .logging import MetricsLogger, read_metrics
from .policy import VLMPolicy, build_tiny, masked_images

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
    resume_from = latest_checkpoint(out) if cfg.resume else None
    # The starting policy is needed to train from, or as the KL anchor (also after a resume); load it only then.
    if policy is None and (resume_from is None or ac.kl_coef > 0):
        policy = load_policy(cfg.model, checkpoint=cfg.checkpoint)
    reference = None
    if ac.kl_coef > 0:
        reference = copy.deepcopy(policy)
        reference.model.requires_grad_(False).eval()
    if resume_from is not None:
        policy = load_policy(cfg.model, checkpoint=resume_from)
    model = policy.model
    model.train()
    (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))

    group_size, batch = ac.group_size, tc.prompts_per_step
    rows = batch * group_size
    env = sim.make(cfg.env.name, num_envs=rows, **cfg.env.options)
    advantage_fn = algos.ADVANTAGES.get(ac.advantage)
    loss_fn = algos.POLICY_LOSSES.get(ac.loss)
    sampling = cfg.sampling

    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    warmup = max(tc.warmup_steps, 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)

    start_step, state = 0, {}
    if resume_from is not None:
        state, states = load_training_state(resume_from)
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

    # ------------------------------------------------------------------ LOOP
    bar = tqdm(
        range(start_step, tc.total_steps), initial=start_step, total=tc.total_steps, desc="grpo", dynamic_ncols=True
    )
    for step in bar:
        t0 = time.perf_counter()
        # Sampling randomness is a function of (seed, step) alone, so a resumed run samples what an
        # uninterrupted one would have.
        torch.manual_seed(tc.seed * 1_000_003 + step)

        # ---- collect: G worlds per prompt, reset with the same seed
        obs = env.reset(seed=train_seeds(step, batch, group_size, base=tc.seed * 100_000_000))
        rollout = policy.generate(obs, group_size=group_size, sampling=sampling)
        t_gen = time.perf_counter() - t0

        # ---- score
        result = env.step(rollout.texts)
        rewards = result.reward  # [R]
        lengths = rollout.completion_mask.sum(-1)  # [R] generated tokens
        if ac.overlong_penalty > 0:
            penalty = soft_overlong_penalty(
                lengths, sampling.max_new_tokens, ac.overlong_cache_len, ac.overlong_penalty
            )
            result.info.setdefault("reward_components", {})["overlong"] = penalty
            rewards = rewards + penalty
        if ac.overlong_filter:
            # Truncated = no EOS generated; such rows stay in the group statistics but leave the loss.
            truncated = ~torch.isin(rollout.completion_ids, torch.tensor(policy.eos_token_ids)).any(-1)  # [R]
            rollout = replace(rollout, completion_mask=overlong_mask(rollout.completion_mask, 0, truncated=truncated))
        advantages = advantage_fn(rewards, group_size=group_size, scale_by_std=ac.scale_by_std)  # [R]
        kept_groups = batch
        if ac.dynamic_sampling:
            # Groups whose rewards are all equal have zero advantage everywhere: train on the others only.
            keep = dynamic_sampling_keep(rewards, group_size)  # [B]
            kept_groups = int(keep.sum())
            if 0 < kept_groups < batch:
                kept_rows = keep.repeat_interleave(group_size).nonzero().squeeze(-1)
                rollout, advantages = rollout.select(kept_rows), advantages[kept_rows]
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

        # ---- log
        metrics = {
            "reward/total": rewards.mean(),
            **{f"reward/{k}": v.float().mean() for k, v in result.info.get("reward_components", {}).items()},
            **sums,
            "grad_norm": grad_norm,
            "lr": scheduler.get_last_lr()[0],
            "completion_len": lengths.float().mean(),  # as generated, before any filtering
            "perf/step_s": time.perf_counter() - t0,
            "perf/generate_s": t_gen,
            "perf/tokens_per_s": lengths.sum() / (time.perf_counter() - t0),
        }
        if ac.dynamic_sampling:
            metrics["data/kept_groups"] = kept_groups
        if "success" in result.info:
            metrics["env/success_rate"] = result.info["success"].float().mean()
        logged = logger.log(step + 1, metrics)
        bar.set_postfix(reward=f"{logged['reward/total']:.3f}", loss=f"{logged['loss/policy']:+.3f}")

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
