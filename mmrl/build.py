"""Building a run: config -> policy, reference, env (the collector), optimiser, logger, resumed state.

`build(cfg, ...)` returns a `Run` holding everything the trainer's loop touches; `load_policy` and
`starting_policy` are the pieces the CLI and the tests also use. Under torchrun every process builds its own
`Run` (the model sharded by FSDP2, see `mmrl.runtime.distributed`); only rank 0 prints and writes.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

import sim

from .algos import CRITIC_ADVANTAGES
from .families import FAMILIES
from .methods.critic import Critic
from .methods.curriculum import Curriculum
from .policy import VLMPolicy, add_action_tokens, apply_model_options, build_tiny
from .policy.flow import (
    TINY_PI0,
    FlowPolicy,
    FlowStats,
    apply_flow_options,
    build_tiny_flow,
    is_flow_folder,
    read_image_settings,
)
from .policy.flow.demonstrations import check_flow_run, collect_flow_demonstrations, train_flow_on_demonstrations
from .policy.vlm.demonstrations import (
    collect_demonstrations,
    longest_target,
    merge_demonstrations,
    train_on_demonstrations,
)
from .report import report_before
from .runtime import distributed, precision
from .runtime.checkpoint import load_training_state, resume_checkpoint, set_rng_state
from .runtime.config import ModelConfig, TrainConfig, to_dict
from .runtime.conventions import model_coordinates
from .runtime.metrics import MetricsLogger, TensorBoardSink, WandbSink, require_backends
from .runtime.schema import require
from .stages.collect import Collector
from .stages.evaluate import held_out
from .stages.shaping import Shaping
from .stages.update import Learner
from .types import Sampling

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Run:
    """Everything the training loop touches, built by `build`."""

    cfg: TrainConfig  # as given, with this process's GPU as model.device under torchrun
    world: distributed.World
    out: Path  # the run's output folder
    policy: VLMPolicy  # what trains (its `model` may be FSDP-sharded: see `model`)
    model: torch.nn.Module  # the policy's module as trained (sharded under torchrun)
    reference: VLMPolicy | None  # the frozen KL anchor (kl_coef > 0)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    trainable: list[torch.nn.Parameter]  # what the optimiser steps (float32 masters with master_weights)
    master: precision.MasterWeights | None  # float32 master weights (one process, master_weights=float32)
    sampling: Sampling  # as configured; a VLA's max_new_tokens is its C*D action tokens
    collector: Collector
    curriculum: Curriculum
    shaping: Shaping  # every transform between the env's reward and the advantages
    logger: MetricsLogger
    start_step: int  # steps done before (a resumed run's)
    state: dict[str, Any] = field(default_factory=dict)  # what checkpoints carry besides weights (eval_before...)
    critic: Critic | None = None  # the value head (algo.advantage gae)

    @property
    def learner(self) -> Learner:
        """The pieces an update steps and reads."""
        return Learner(
            self.policy, self.reference, self.critic, self.optimizer, self.scheduler, self.trainable, self.master,
            self.world,
        )  # fmt: skip


def load_policy(
    cfg: ModelConfig, checkpoint: str | Path | None = None, action_dim: int | None = None
) -> VLMPolicy | FlowPolicy:
    """The policy a config names: a checkpoint folder, a model folder, or a random "tiny:<arch>" model; a π0
    folder (config.json's model_type "pi0") or "tiny:pi0" gives a flow policy (`FlowPolicy`). `action_dim`, the
    env's, widens tiny:pi0's padded action width where the asset's is narrower (`tiny_flow_for`)."""
    kwargs = {"prompt_template": cfg.prompt_template, "history_turns": cfg.history_turns}
    if checkpoint is not None:
        if is_flow_folder(checkpoint):
            return FlowPolicy.from_pretrained(checkpoint, dtype=DTYPES[cfg.dtype], device=cfg.device)
        return VLMPolicy.from_pretrained(checkpoint, dtype=DTYPES[cfg.dtype], device=cfg.device, **kwargs)
    if cfg.path == "tiny:pi0":
        policy = tiny_flow_for(cfg.seed, action_dim)
        policy.model.to(device=cfg.device, dtype=DTYPES[cfg.dtype])
        return policy
    if cfg.path.startswith("tiny:"):
        policy = build_tiny(cfg.path.removeprefix("tiny:"), seed=cfg.seed, **kwargs)
        policy.model.to(device=cfg.device, dtype=DTYPES[cfg.dtype])
        return policy
    path = Path(cfg.path)
    if not path.is_absolute() and not path.exists():
        # Presets name assets relative to the repository; let them run from any working directory.
        candidate = Path(__file__).resolve().parents[1] / path
        path = candidate if candidate.exists() else path
    if is_flow_folder(path):
        return FlowPolicy.from_pretrained(path, dtype=DTYPES[cfg.dtype], device=cfg.device)
    return VLMPolicy.from_pretrained(path, dtype=DTYPES[cfg.dtype], device=cfg.device, **kwargs)


def tiny_flow_for(seed: int, action_dim: int | None) -> FlowPolicy:
    """tiny:pi0 for an env of `action_dim`-D actions: the asset's model (`build_tiny_flow`) where its padded action
    width (`max_action_dim` 4) holds them, as for reach; otherwise the same model built with `max_action_dim =
    action_dim` (LIBERO's 7), from the same seed, tokenizer and image settings."""
    from transformers import AutoConfig, AutoTokenizer, PI0ForConditionalGeneration

    config = AutoConfig.from_pretrained(TINY_PI0)
    if action_dim is None or action_dim <= config.max_action_dim:
        return build_tiny_flow(seed=seed)
    config.max_action_dim = int(action_dim)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = PI0ForConditionalGeneration(config)
    return FlowPolicy(model, AutoTokenizer.from_pretrained(TINY_PI0), read_image_settings(TINY_PI0))


def starting_policy(
    cfg: TrainConfig, policy: VLMPolicy | None, env, out: Path, world: distributed.World | None = None
) -> VLMPolicy:
    """The policy RL starts from: the configured model, given action tokens for a continuous env, and cold-started
    on the env's scripted demonstrations when `sft.episodes > 0` (kept in `<output_dir>/cold_start`, so a resumed
    run finds it instead of repeating it). Only rank 0 prints and writes `cold_start`."""
    world = world or distributed.World()
    cold_start = out / "cold_start"
    if cfg.sft.episodes > 0 and (cold_start / "config.json").exists():
        return _model_options(load_policy(cfg.model, checkpoint=cold_start), cfg.model)
    if policy is None:
        policy = load_policy(cfg.model, checkpoint=cfg.checkpoint, action_dim=getattr(env, "action_dim", None))
    if isinstance(policy, FlowPolicy):
        return flow_starting_policy(cfg, _model_options(policy, cfg.model), env, out, world)
    if env.action_kind == "continuous" and policy.action_codec is None:
        if cfg.model.action_bins < 2:
            raise ValueError(f"env {cfg.env.name!r} takes continuous actions: set model.action_bins (e.g. 256)")
        add_action_tokens(
            policy, env.action_low, env.action_high, cfg.model.action_bins, cfg.model.action_chunk,
            seed=cfg.trainer.seed,
        )  # fmt: skip
    # After the action tokens exist (LoRA keeps their rows trainable), before anything trains.
    policy = apply_model_options(policy, cfg.model)
    if cfg.sft.episodes <= 0:
        return policy
    if not hasattr(env, "expert_action"):
        raise ValueError(f"sft.episodes > 0 needs an env with a scripted expert; {cfg.env.name!r} has none")
    sft = cfg.sft
    images, instructions, labels, rate, previous = demonstrations(cfg, env, policy)
    if env.action_kind == "text":
        answer, need = longest_target(policy, labels)
        if need > cfg.sampling.max_new_tokens:
            raise ValueError(
                f"sampling.max_new_tokens={cfg.sampling.max_new_tokens} cuts the expert's answers: {answer!r} is "
                f"{need} tokens with EOS, so the policy could never finish what the cold start teaches it; set "
                f"sampling.max_new_tokens >= {need}"
            )
    initial = held_out(policy, cfg, world)
    if world.is_main:
        print(f"held-out {cfg.env.eval_metric} of the initial model: {initial.metrics[cfg.env.eval_metric]:.3f}\n"
              f"{len(instructions)} demonstration steps from {sft.episodes} episodes "
              f"(demonstrator success {rate:.2f}; noise {sft.noise}, label noise {sft.label_noise})",
              file=sys.stderr)  # fmt: skip
    # Every process runs the seeded cold start (no long wait at a barrier); shard_model gives all rank 0's.
    train_on_demonstrations(
        policy, images, instructions, labels, steps=sft.steps, batch_size=sft.batch_size, lr=sft.lr,
        seed=cfg.trainer.seed, previous=previous,
    )  # fmt: skip
    if world.is_main:
        tmp = out / "cold_start.tmp"
        shutil.rmtree(tmp, ignore_errors=True)  # a half-written one from a killed run
        policy.save_pretrained(tmp)
        (tmp / "initial_eval.json").write_text(json.dumps(initial.metrics, indent=2))
        tmp.rename(cold_start)  # atomic: a folder named cold_start is always complete
    return policy


def _model_options(policy: VLMPolicy | FlowPolicy, cfg: ModelConfig) -> VLMPolicy | FlowPolicy:
    return apply_flow_options(policy, cfg) if isinstance(policy, FlowPolicy) else apply_model_options(policy, cfg)


def flow_starting_policy(cfg: TrainConfig, policy: FlowPolicy, env, out: Path, world: distributed.World) -> FlowPolicy:
    """`starting_policy` for a flow policy: checked against the env before anything trains, then cold-started by
    the flow-matching loss on the env's expert (`mmrl.policy.flow.demonstrations`) when `sft.episodes > 0`; the demonstrations
    give the normalisation statistics when the policy carries none."""
    check_flow_run(cfg)
    policy.check_env(env)
    if cfg.sft.episodes <= 0:
        if policy.stats is None:
            raise ValueError(f"model.path {cfg.model.path!r} carries no normalisation statistics (state_mean, ...): "
                             "cold-start it on demonstrations (sft.episodes > 0)")  # fmt: skip
        return policy
    if not hasattr(env, "expert_action"):
        raise ValueError(f"sft.episodes > 0 needs an env with a scripted expert; {cfg.env.name!r} has none")
    sft = cfg.sft
    images, instructions, proprio, chunks, rate = collect_flow_demonstrations(
        env, policy.chunk, sft.episodes, noise=sft.noise, seed=cfg.trainer.seed, every_step=sft.every_step
    )
    if policy.stats is None:
        policy.set_stats(FlowStats.from_demonstrations(proprio, chunks))
    policy.check_env(env)  # the statistics' widths now
    initial = held_out(policy, cfg, world)
    if world.is_main:
        print(f"held-out {cfg.env.eval_metric} of the initial model: {initial.metrics[cfg.env.eval_metric]:.3f}\n"
              f"{len(instructions)} demonstration chunks from {sft.episodes} episodes "
              f"(demonstrator success {rate:.2f}; noise {sft.noise})", file=sys.stderr)  # fmt: skip
    train_flow_on_demonstrations(
        policy, images, instructions, proprio, chunks, steps=sft.steps, batch_size=sft.batch_size, lr=sft.lr,
        seed=cfg.trainer.seed,
    )  # fmt: skip
    if world.is_main:
        tmp = out / "cold_start.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        policy.save_pretrained(tmp)
        (tmp / "initial_eval.json").write_text(json.dumps(initial.metrics, indent=2))
        tmp.rename(out / "cold_start")  # atomic: a folder named cold_start is always complete
    return policy


def demonstrations(cfg: TrainConfig, env, policy: VLMPolicy) -> tuple:
    """The cold start's demonstrations: from `env` (the curriculum's first level), or with `sft.all_levels` an even
    share of `sft.episodes` at every level of the curriculum, each level in an env of its own."""
    sft, cur = cfg.sft, cfg.curriculum
    if not (sft.all_levels and cur.option is not None):
        return collect_demonstrations(
            env, policy.action_codec, sft.episodes, noise=sft.noise, seed=cfg.trainer.seed, label_noise=sft.label_noise
        )
    parts = []
    for index, level in enumerate(cur.levels):
        episodes = sft.episodes // len(cur.levels) + (index < sft.episodes % len(cur.levels))
        level_env = sim.make(cfg.env.name, num_envs=env.num_envs, **{**cfg.env.make_options(), cur.option: level})
        try:
            part = collect_demonstrations(
                level_env, policy.action_codec, episodes, noise=sft.noise, seed=cfg.trainer.seed + index,
                label_noise=sft.label_noise,
            )  # fmt: skip
        finally:
            level_env.close()
        parts.append((part, episodes))
    return merge_demonstrations(parts)


def native_pixel_bounds(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with the dataset env's `min_pixels`/`max_pixels`/`factor` filled in from the model where it shows
    images at their own sizes (`env.options.resize: native`) and they are not set: `model.min_pixels`/`max_pixels`,
    else the model's processor's own bounds, and its patch grid (patch x merge size), for a Qwen-VL-like family,
    whose processor then resizes those images no further; other families resize to their own sizes, and the env
    keeps its defaults. `sim` cannot import `mmrl`, so the bounds reach it as env options.

    Raises:
        ConfigError: naming `sft.episodes` when a cold start would show the images at one size (its demonstrations
            keep one image tensor).
    """
    options = cfg.env.options
    if cfg.env.name != "dataset" or options.get("resize") != "native":
        return cfg
    require(
        cfg.sft.episodes == 0,
        "sft.episodes",
        "must be 0 with env.options.resize 'native': the cold start's demonstrations keep one image size (use "
        "resize 'letterbox')",
    )
    _, folder, family = model_coordinates(cfg.checkpoint or cfg.model.path)
    if folder is None or family not in FAMILIES or not FAMILIES[family].pixel_bounds:
        return cfg
    path = folder / "preprocessor_config.json"
    settings = json.loads(path.read_text()) if path.is_file() else {}
    size = settings.get("size", {})
    bounds = {
        "min_pixels": cfg.model.min_pixels or size.get("shortest_edge") or settings.get("min_pixels"),
        "max_pixels": cfg.model.max_pixels or size.get("longest_edge") or settings.get("max_pixels"),
        "factor": int(settings.get("patch_size", 14)) * int(settings.get("merge_size", 2)),
    }
    filled = {**{k: int(v) for k, v in bounds.items() if v}, **options}  # what the user set wins
    return replace(cfg, env=replace(cfg.env, options=filled)) if filled != options else cfg


def build(cfg: TrainConfig, policy: VLMPolicy | None, generation_shards: int | None, live: ExitStack) -> Run:
    """Everything a training run needs, resumed from `output_dir`'s last checkpoint when `cfg.resume` is set.

    What holds processes (the env, rollout workers) is registered on `live` as soon as it exists, so it is closed
    however the run ends, also when building fails half-way.
    """
    tc, ac = cfg.trainer, cfg.algo
    require_backends(tc.log_with)  # a missing logging extra fails here, before anything is loaded or trained
    world = distributed.init_world(cfg.model.device)
    out = Path(cfg.output_dir)
    # Before anything is written there: with no complete checkpoint left, resume refuses and the folder stays as is.
    resume_from = resume_checkpoint(out, warn=world.is_main) if cfg.resume else None
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
    # (As a config of its own that is a float32 model, which has no masters.)
    load_cfg = cfg
    if use_masters:
        load_cfg = replace(cfg, model=replace(cfg.model, dtype="float32"), trainer=replace(tc, master_weights="model"))

    cfg = native_pixel_bounds(cfg)  # before any env is made: the collector's, evaluation's and workers' alike
    curriculum = Curriculum(cfg.curriculum)
    state = load_training_state(resume_from)[0] if resume_from is not None else {}
    if "curriculum" in state:
        curriculum.load_state_dict(state["curriculum"])
    shaping = Shaping(cfg, world)
    live.callback(shaping.close)
    collector = Collector(cfg, world, curriculum, cfg.sampling, shaping, generation_shards)
    live.callback(collector.close)
    # The starting policy is needed to train from, or as the KL anchor (also after a resume); load it only then.
    if resume_from is None or ac.kl_coef > 0:
        policy = starting_policy(load_cfg, policy, collector.env, out, world)
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
        policy = _model_options(load_policy(load_cfg.model, checkpoint=resume_from), cfg.model)
    live.callback(policy.close)  # its vLLM engine, if it starts one, shuts down however the run ends (even in `build`)
    if "coordinates" in cfg.env.options and not isinstance(policy, FlowPolicy):
        # Its checkpoints say which units it answers in, whatever its family's (mmrl.runtime.conventions reads them).
        policy.model.config.grounding_coordinates = cfg.env.options["coordinates"]
    if use_masters:
        precision.cast_parameters(policy.model, torch.float32)  # no-op for a float32 load, not for a policy passed in
    # Before the optimiser: it holds the sharded parameters. Under FSDP the float32 shards are the master weights.
    model = distributed.shard_model(policy.model, world, compute_dtype=compute_dtype if use_masters else None)
    model.train()
    sampling = cfg.sampling
    if policy.action_codec is not None:  # a VLA emits exactly C*D action tokens per generation
        sampling = replace(sampling, max_new_tokens=policy.action_codec.tokens_per_generation)
    elif isinstance(policy, FlowPolicy):  # a flow policy's rows hold K denoising steps
        sampling = replace(sampling, max_new_tokens=policy.num_steps)
    collector.sampling = sampling

    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA adapters, or all but a frozen vision tower
    master = precision.MasterWeights(model, compute_dtype) if use_masters and world.size == 1 else None
    trainable = master.params if master is not None else trainable  # the optimiser steps the float32 copies
    optimizer = torch.optim.AdamW(trainable, lr=tc.lr, weight_decay=tc.weight_decay)
    warmup = max(tc.warmup_steps, 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    critic = None
    if ac.advantage in CRITIC_ADVANTAGES:
        critic = Critic(
            model, width=ac.critic_hidden, lr=ac.critic_lr, trunk_grad=ac.critic_trunk_grad, seed=tc.seed,
            device=cfg.model.device, time=ac.critic_time,
        )  # fmt: skip
    start_step = 0
    if resume_from is not None:
        _, states = load_training_state(resume_from)
        if critic is not None:
            critic.load_state_dict(states["critic"])
        collector.restore(states.get("prefetched"))
        distributed.load_optimizer_state(model, optimizer, states["optimizer"], world)
        scheduler.load_state_dict(states["scheduler"])
        set_rng_state(states["rng"])
        start_step = state["step"]
        if world.is_main:
            print(f"resumed from {resume_from} (step {start_step})", file=sys.stderr)
    collector.start_workers(policy)
    # Rank 0 writes the metrics; the others log into the void (they still use the logged values).
    metrics_path = out / "metrics.jsonl" if world.is_main else os.devnull
    logger = MetricsLogger(
        metrics_path,
        resume_step=start_step if resume_from is not None else None,
        final_step=tc.total_steps,
        sinks=metric_sinks(cfg, out, start_step if resume_from is not None else None) if world.is_main else (),
    )
    live.callback(logger.close)
    if "eval_before" not in state:
        before = held_out(policy, cfg, world)
        state["eval_before"] = before.metrics
        logger.log(0, {f"eval/{k}": v for k, v in before.metrics.items()})
        if world.is_main:
            report_before(cfg, before, out)
    return Run(
        cfg, world, out, policy, model, reference, optimizer, scheduler, trainable, master, sampling, collector,
        curriculum, shaping, logger, start_step, state, critic,
    )  # fmt: skip


def metric_sinks(cfg: TrainConfig, out: Path, resume_step: int | None) -> list:
    """The TensorBoard / W&B sinks `trainer.log_with` asks for (the JSON lines are the logger itself)."""
    tc, sinks = cfg.trainer, []
    if "tensorboard" in tc.log_with:
        sinks.append(TensorBoardSink(out / "tensorboard", purge_step=None if resume_step is None else resume_step + 1))
    if "wandb" in tc.log_with:
        sinks.append(WandbSink(out / "wandb", tc.wandb_project, tc.wandb_mode, to_dict(cfg), resume_step is not None))
    return sinks
