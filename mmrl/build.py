"""Building a run: config -> env (the collector), shaping, the starting policy; then, after the cold start, the rest
of what the loop touches: reference, resumed weights, sharding, optimiser, critic, logger, initial evaluation.

`build(cfg, ...)` returns a `Setup` (the policy as loaded and fitted to the env); the trainer runs the cold start
stage on it (`mmrl.stages.cold_start`) and `assemble(setup)` returns the `Run` holding everything the loop touches.
Under torchrun every process builds its own `Run` (the model sharded by FSDP2, see `mmrl.runtime.distributed`); only
rank 0 prints and writes.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from sim.errors import InputError
from sim.seeds import eval_seeds

from .algos import CRITIC_ADVANTAGES
from .families import FAMILIES
from .methods.critic import Critic
from .methods.curriculum import Curriculum
from .policy import Policy, check_run, load_policy
from .report import report_before
from .runtime import distributed, precision
from .runtime.checkpoint import earlier_run, load_training_state, resume_checkpoint, set_aside, set_rng_state
from .runtime.config import TrainConfig, check_at_load, to_dict
from .runtime.conventions import model_coordinates
from .runtime.folders import check_output_dir, make_output_dir
from .runtime.lr_schedule import lr_scheduler
from .runtime.metrics import MetricsLogger, TensorBoardSink, WandbSink, require_backends
from .runtime.precision import DTYPES
from .runtime.schema import require
from .stages.cold_start import FOLDER as COLD_START
from .stages.collect import Collector
from .stages.evaluate import held_out
from .stages.shaping import Shaping
from .stages.update import Learner
from .types import Sampling


@dataclass
class Run:
    """Everything the training loop touches, built by `build`."""

    cfg: TrainConfig  # as given, with this process's GPU as model.device under torchrun
    world: distributed.World
    out: Path  # the run's output folder
    policy: Policy  # what trains (its `model` may be FSDP-sharded: see `model`)
    model: torch.nn.Module  # the policy's module as trained (sharded under torchrun)
    reference: Policy | None  # the frozen KL anchor (kl_coef > 0)
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


@dataclass
class Setup:
    """What `build` makes before the cold start: the run's place, its env and shaping, and the starting policy."""

    cfg: TrainConfig  # as given, with this process's GPU as model.device under torchrun, pixel bounds filled in
    load_cfg: TrainConfig  # what the policy loads with (float32 where master weights keep float32 copies)
    world: distributed.World
    out: Path
    resume_from: Path | None  # the checkpoint a resumed run continues from
    state: dict[str, Any]  # a resumed run's training state (its curriculum, eval_before, step)
    curriculum: Curriculum
    shaping: Shaping
    collector: Collector
    policy: Policy | None  # the starting policy, fitted to the env (None: a resumed run without a KL anchor)
    cold_started: bool  # the policy is the one a cold start left in output_dir (no cold start to run)
    live: ExitStack

    @property
    def needs_cold_start(self) -> bool:
        return self.policy is not None and not self.cold_started and self.cfg.sft.episodes > 0


def build(cfg: TrainConfig, policy: Policy | None, generation_shards: int | None, live: ExitStack) -> Setup:
    """Everything a training run needs before its cold start: checked against the policy's kind before anything
    loads, the output folder, the env (the collector) and shaping, and the starting policy (`policy`, or the one
    `cfg.model` names) fitted to the env; resumed from `output_dir`'s last checkpoint when `cfg.resume` is set.

    What holds processes (the env, rollout workers) is registered on `live` as soon as it exists, so it is closed
    however the run ends, also when building fails half-way.
    """
    tc = cfg.trainer
    require_backends(tc.log_with)  # a missing logging extra fails here, before anything is loaded or trained
    world = distributed.init_world(cfg.model.device)
    if policy is None:
        check_run(cfg, world.size)  # what the run asks of the model's kind, before anything loads
    else:
        type(policy).check_config(cfg, world.size)
    out = Path(cfg.output_dir)
    check_at_load(cfg)
    check_output_dir(out)
    # Before anything is written there: with no complete checkpoint left, resume refuses and the folder stays as is;
    # a new run never writes over an earlier one's history (`no_run_overwritten`).
    resume_from = resume_checkpoint(out, warn=world.is_main) if cfg.resume else None
    no_run_overwritten(cfg, out, resume_from, world)
    if world.device.startswith("cuda"):  # "cuda" or "cuda:0" in the config: under torchrun, this process's GPU
        cfg = replace(cfg, model=replace(cfg.model, device=world.device))
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    # With float32 master weights the model loads in float32: those are the masters' starting values (a resumed
    # run's, saved in float32); it computes in model.dtype from the sharding or MasterWeights on.
    # (As a config of its own that is a float32 model, which has no masters.)
    load_cfg = cfg
    if tc.master_weights == "float32":
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
    check_eval_metric(cfg, collector.env)  # before the model loads: a metric the env does not report is named
    # The starting policy is needed to train from, or as the KL anchor (also after a resume); load it only then.
    env, cold_started = collector.env, False
    if resume_from is None or cfg.algo.kl_coef > 0:
        if cfg.sft.episodes > 0 and (out / COLD_START / "config.json").exists():  # a cold start done before
            policy, cold_started = load_policy(load_cfg.model, checkpoint=out / COLD_START), True
        elif policy is None:
            policy = load_policy(
                load_cfg.model, checkpoint=cfg.checkpoint, action_dim=getattr(env, "action_dim", None)
            )
        policy = policy.fit(load_cfg, env)
        live.callback(policy.close)  # its engine, if it starts one, shuts down however the run ends
    cfg.check_validation_split()  # after the env's and the model's own checks: a bad dataset or folder is named first
    # Written once everything the run needs has loaded and fitted, so that a refused run leaves no folder behind.
    make_output_dir(out)
    if world.is_main:
        (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    return Setup(cfg, load_cfg, world, out, resume_from, state, curriculum, shaping, collector,
                 policy if resume_from is None or cfg.algo.kl_coef > 0 else None, cold_started, live)  # fmt: skip


def check_eval_metric(cfg: TrainConfig, env: Any) -> None:
    """Refuse an `env.eval_metric` that a single-step env does not report, before the model loads, from one step of
    empty answers (or zero actions) on the run's env, which every collection resets first. A multi-step env's
    metrics may show only at its episodes' ends: `held_out` checks those at the first evaluation.

    Raises:
        ConfigError: naming `env.eval_metric`, the env and the metrics it reports.
    """
    metric = cfg.env.eval_metric
    if metric in ("reward", "episode_steps") or "@task=" in metric or env.max_episode_steps != 1:
        return
    env.reset(seed=eval_seeds(1)[0])
    if env.action_kind == "text":
        actions: Any = [""] * env.num_envs
    else:
        actions = torch.zeros(env.num_envs, env.action_dim)
    info = env.step(actions).info
    reported = [
        "reward",
        "episode_steps",
        *info.get("reward_components", {}),
        *(["success"] if "success" in info else []),
    ]
    require(metric in reported, "env.eval_metric", f"{metric!r} is not a metric env {cfg.env.name!r} reports; it "
            f"reports {', '.join(reported)}", sep=": ")  # fmt: skip


def no_run_overwritten(cfg: TrainConfig, out: Path, resume_from: Path | None, world: distributed.World) -> None:
    """Refuse what would write over an earlier run, or resume nothing, naming the ways on.

    Raises:
        InputError: `resume=true` with nothing to resume in `out`; a new run into a folder holding an earlier run's
            metrics or checkpoints without `overwrite=true` (with it, the earlier run is moved aside first).
    """
    earlier = earlier_run(out)
    if cfg.resume:
        if resume_from is None and earlier is None:
            raise InputError(f"resume=true: nothing to resume in {out} (no checkpoint, no metrics.jsonl): check "
                             "output_dir, or drop resume=true to start a new run there")  # fmt: skip
        return
    if earlier is None:
        return
    if not cfg.overwrite:
        raise InputError(f"output_dir {out} holds an earlier run ({earlier}): continue it with resume=true, or start "
                         f"a new run there with overwrite=true, which moves the earlier one aside")  # fmt: skip
    world.barrier()  # every process has seen the earlier run before rank 0 moves it
    if world.is_main:
        print(f"overwrite=true: the earlier run in {out} is now {set_aside(out)}", file=sys.stderr)
    world.barrier()


def assemble(setup: Setup) -> Run:
    """The `Run` from a built (and cold-started) `Setup`: the frozen reference (a copy of the starting policy), a
    resumed run's weights, the model sharded, the optimiser and schedule, the critic, the logger, and the initial
    model's held-out score (logged at step 0)."""
    cfg, world, out, live, state = setup.cfg, setup.world, setup.out, setup.live, setup.state
    collector = setup.collector
    tc, ac, resume_from, policy = cfg.trainer, cfg.algo, setup.resume_from, setup.policy
    compute_dtype = DTYPES[cfg.model.dtype]
    use_masters = tc.master_weights == "float32"
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
        policy = load_policy(setup.load_cfg.model, checkpoint=resume_from).fit(setup.load_cfg, collector.env)
        live.callback(policy.close)
    if use_masters:
        precision.cast_parameters(policy.model, torch.float32)  # no-op for a float32 load, not for a policy passed in
    # Before the optimiser: it holds the sharded parameters. Under FSDP the float32 shards are the master weights.
    model = distributed.shard_model(policy.model, world, compute_dtype=compute_dtype if use_masters else None)
    model.train()
    sampling = policy.row_sampling(cfg.sampling)
    collector.sampling = sampling

    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA adapters, or all but a frozen vision tower
    master = precision.MasterWeights(model, compute_dtype) if use_masters and world.size == 1 else None
    trainable = master.params if master is not None else trainable  # the optimiser steps the float32 copies
    optimizer = torch.optim.AdamW(trainable, lr=tc.lr, weight_decay=tc.weight_decay)
    scheduler = lr_scheduler(optimizer, tc.lr_schedule, tc.warmup_steps, cfg.policy_updates, tc.min_lr_ratio)
    critic = None
    if ac.advantage in CRITIC_ADVANTAGES:
        head = ac.critic
        critic = Critic(
            policy.value_input(model), width=head.hidden, lr=head.lr, trunk_grad=head.trunk_grad, seed=tc.seed,
            device=cfg.model.device, time=head.time,
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
        setup.curriculum, setup.shaping, logger, start_step, state, critic,
    )  # fmt: skip


def metric_sinks(cfg: TrainConfig, out: Path, resume_step: int | None) -> list:
    """The TensorBoard / W&B sinks `trainer.log_with` asks for (the JSON lines are the logger itself)."""
    tc, sinks = cfg.trainer, []
    if "tensorboard" in tc.log_with:
        sinks.append(TensorBoardSink(out / "tensorboard", purge_step=None if resume_step is None else resume_step + 1))
    if "wandb" in tc.log_with:
        sinks.append(WandbSink(out / "wandb", tc.wandb_project, tc.wandb_mode, to_dict(cfg), resume_step is not None))
    return sinks
