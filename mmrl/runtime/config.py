"""Configuration: frozen dataclasses are the schema, nested by feature (`algo.papo.*`, `model.lora.*`, ...); YAML
files in configs/ are presets, `section.field=value` arguments override any field. Unknown keys are errors that name
the key and the valid ones; a key that moved names its new place (`mmrl.runtime.schema.MOVED`).

Each section is a dataclass whose field comments are the fields' documentation and whose `__post_init__` checks its
own fields; `TrainConfig.__post_init__` holds the checks that read several sections. The `model` and `algo` sections
with their sub-sections live in `model_config.py` and `algo_config.py`, the rest here. The machinery (YAML,
overrides) is `mmrl.runtime.schema`'s, model-folder checks are `mmrl.runtime.folders`'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from rewards import REWARDS
from rewards.combine import RewardSpec
from sim.mix import ENV_REWARD
from sim.registry import ENVS, option_problem
from sim.seeds import TRAIN_SEEDS

from ..algos import CRITIC_ADVANTAGES
from ..types import Sampling
from .algo_config import (  # noqa: F401 (re-exported)
    GSPO_MAX_CLIP,
    LOSS_DEFAULTS,
    AlgoConfig,
    CareConfig,
    CriticConfig,
    OverlongConfig,
    PAPOConfig,
    TTRVConfig,
)
from .conventions import resolve_coordinates
from .model_config import FREEZE_PARTS, FlowConfig, LoRAConfig, ModelConfig  # noqa: F401 (re-exported)
from .schema import ConfigError, apply_overrides, from_dict, load, require, to_dict  # noqa: F401 (re-exported)

LOG_BACKENDS = ("jsonl", "tensorboard", "wandb")


@dataclass(frozen=True)
class EnvConfig:
    name: str = "grounding"
    options: dict[str, Any] = field(default_factory=dict)  # constructor options, checked by sim.make
    eval_metric: str = "iou"  # the reward component (or "reward", "success") printed as held-out score
    # Rewards in YAML (sim.mix): the env's reward becomes a weighted mix of registered rewards, each
    # {name, weight, kwargs}; `name: env` is the env's own reward (left out, the mix replaces it). Empty: the env's own.
    rewards: list[dict[str, Any]] = field(default_factory=list)
    # > 0 runs the worlds in this many Ray actors (sim.workers.RayVecEnv); 0 keeps them in this process.
    workers: int = 0
    worker_timeout_s: float = 120.0  # a worker that does not answer a call in this time is named, restarted, retried

    def __post_init__(self):
        # Each option against the env constructor's parameters and their annotations, so that a typo or a value of
        # the wrong type fails here naming `env.options.<key>`, not as a TypeError deep inside the env. An env not
        # registered (yet) is left to `sim.make`, which names the registered ones.
        if self.name in ENVS:
            cls = ENVS.get(self.name)
            for key, value in self.options.items():
                problem = option_problem(cls, key, value)
                require(problem is None, f"env.options.{key}", f"{problem} (an option of env {self.name!r})", sep=": ")
        require(self.workers >= 0, "env.workers", "must be >= 0 (0: the worlds live in this process)")
        require(self.worker_timeout_s > 0, "env.worker_timeout_s", "must be > 0")
        for entry in self.rewards:
            require(isinstance(entry, dict), "env.rewards", f"entries are {{name, weight, kwargs}}, got {entry!r}")
            try:
                spec = RewardSpec.from_dict(entry)
            except ValueError as error:
                raise ConfigError(f"env.rewards: {error}") from None
            require(
                spec.name == ENV_REWARD or spec.name in REWARDS,
                "env.rewards",
                f"unknown reward {spec.name!r}; registered: {', '.join(REWARDS.names())} (and {ENV_REWARD!r}, the "
                "env's own)",
                sep=": ",
            )

    def make_options(self, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """What `sim.make` takes: the env's options (`options`, default `self.options`) and the reward mix."""
        options = dict(self.options if options is None else options)
        return {**options, "rewards": [dict(entry) for entry in self.rewards]} if self.rewards else options


# How completions are drawn: the policy's own dataclass, so config and policy cannot drift apart.
SamplingConfig = Sampling


@dataclass(frozen=True)
class TrainerConfig:
    total_steps: int = 100
    prompts_per_step: int = 8  # B; each step trains on R = B*G completions
    micro_batch_size: int = 64  # rows per forward/backward; gradients accumulate over R / micro_batch_size
    lr: float = 1e-4  # what most presets train at; real-size LoRA presets use 2e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0  # the lr rises linearly over the policy's first updates: lr / warmup_steps at the first
    # After the warm-up: "constant", or "linear" / "cosine" decay to lr * min_lr_ratio at the policy's last update
    # (verl's optim.lr_scheduler_type and min_lr_ratio, transformers' get_cosine_schedule_with_warmup;
    # mmrl.runtime.lr_schedule). The critic's warm-up steps (algo.critic.warmup_steps) do not count: the policy waits,
    # and so does its schedule.
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    min_lr_ratio: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    eval_episodes: int = 200  # held-out seeds of each evaluation, disjoint from every training seed
    eval_batch_size: int = 100
    # > 0: the validation split is scored every this many steps (metrics val/*), for watching and tuning a run; the
    # test split (eval/*, eval.json) is scored before and after training alone, for the report (sim/seeds.py).
    eval_every: int = 0
    save_every: int = 25
    keep_checkpoints: int = 2
    threads: int = 0  # torch CPU threads; 0 leaves torch's default
    # > 0 packs micro-batches by tokens (prompt + completion) instead of rows: long rollouts get smaller slices.
    token_budget: int = 0
    # S > 0: the step's prompts are generated in S separately seeded shards, so the samples depend on S and never on
    # the number of processes K (any K dividing S); 0: one shard per process.
    generation_shards: int = 0
    # "float32" keeps float32 master copies of the trainable weights of a bfloat16/float16 model (model.dtype): the
    # optimiser steps them and the model computes with them rounded, so small updates (lr 1e-6 in bfloat16)
    # accumulate instead of rounding away; checkpoints hold them in float32 (mmrl.runtime.precision). A cold start
    # (sft.episodes > 0) then runs on the float32 model. "model": the optimiser steps the model's own weights.
    master_weights: Literal["model", "float32"] = "model"
    # K > 0 generates in K Ray actors (mmrl.stages.rollout_workers), each with a copy of the policy (synced every step) and
    # its own env, on this machine or a Ray cluster's (RAY_ADDRESS); this process trains on what they return. Shards go
    # to them in turn: generation_shards must be a multiple of K. Samples equal the in-process ones for the same
    # generation_shards (on CPUs with the same torch thread count: the workers use max(threads, 1)).
    rollout_workers: int = 0
    # Asynchronous collection with a staleness bound k: k >= 1 plays steps ahead in a thread (env, rendering,
    # generation by a copy of the policy, the rollout workers, or the vllm_process engine), step s with the weights of
    # step max(0, s - k), so each step trains on rows min(s, k) updates stale (the old log-probs are then recomputed
    # and the rollout correction applies, see algo.old_logprobs); 0 collects synchronously (mmrl/stages/collect.py).
    max_staleness: int = 0
    rollout_timeout_s: float = 600.0  # a worker that does not return a shard in this time is replaced, and it reruns
    # Where metrics go: "jsonl" (metrics.jsonl, always; resume and the returned history read it), "tensorboard"
    # (event files in <output_dir>/tensorboard; extra mmrl[tensorboard]), "wandb" (Weights & Biases, a run folder
    # in <output_dir>/wandb; extra mmrl[wandb]); the end-of-run plots go to both as images.
    log_with: list[str] = field(default_factory=lambda: ["jsonl"])
    wandb_project: str = "mmrl"
    wandb_mode: Literal["offline", "online"] = "offline"  # offline needs no network or account; `wandb sync` later

    def __post_init__(self):
        for name in ("prompts_per_step", "micro_batch_size", "eval_episodes", "eval_batch_size", "keep_checkpoints"):
            require(getattr(self, name) >= 1, f"trainer.{name}", f"must be >= 1, got {getattr(self, name)}")
        for name in ("total_steps", "warmup_steps", "eval_every", "save_every", "threads", "token_budget",
                     "generation_shards"):  # fmt: skip
            require(getattr(self, name) >= 0, f"trainer.{name}", f"must be >= 0, got {getattr(self, name)}")
        require(self.lr >= 0, "trainer.lr", "must be >= 0")
        require(0 <= self.min_lr_ratio <= 1, "trainer.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        require(self.weight_decay >= 0, "trainer.weight_decay", f"must be >= 0, got {self.weight_decay}")
        require(0 <= self.seed < TRAIN_SEEDS, "trainer.seed",
                 f"must be in [0, {TRAIN_SEEDS}): each run seed trains on its own range of worlds, got {self.seed}")  # fmt: skip
        require(self.max_grad_norm > 0, "trainer.max_grad_norm", "must be > 0")
        k = self.rollout_workers
        require(k >= 0, "trainer.rollout_workers", f"must be >= 0 (0: generate in this process), got {k}")
        require(
            self.max_staleness >= 0,
            "trainer.max_staleness",
            f"must be >= 0 (0: synchronous; k: collect up to k steps ahead), got {self.max_staleness}",
        )
        require(
            not k or self.rollout_timeout_s > 0,
            "trainer.rollout_timeout_s",
            f"must be > 0, got {self.rollout_timeout_s}",
        )
        unknown = [name for name in self.log_with if name not in LOG_BACKENDS]
        require(not unknown, "trainer.log_with", f"unknown {unknown}; choose from {', '.join(LOG_BACKENDS)}")
        require(
            "jsonl" in self.log_with,
            "trainer.log_with",
            f"must include jsonl (resume and the run's returned history read metrics.jsonl), got {self.log_with}",
        )


@dataclass(frozen=True)
class SFTConfig:
    """A supervised cold start on scripted demonstrations before RL (envs with an `expert_action`: continuous envs,
    whose labels become action tokens, and text envs, whose labels are the expert's answers)."""

    episodes: int = 0  # demonstration episodes; 0 skips the phase
    steps: int = 200  # optimiser steps
    batch_size: int = 64  # (observation, action) pairs per step
    lr: float = 1e-3
    # Executed actions get this much noise while the labels stay the expert's (DART): Gaussian in action units for
    # continuous envs; for text envs the env's own notion (jittered clicks, random meta-actions, perturbed numbers).
    noise: float = 0.3
    # > 0 labels with the expert's noisy answers instead: a sloppy demonstrator whose errors RL then corrects.
    label_noise: float = 0.0
    # With a curriculum: demonstrations spread evenly over all its levels (True) or at its first level only (False).
    all_levels: bool = False
    # Flow policies (π0): a chunk labelled at every step an episode runs (True), not only where a chunk starts (False);
    # `mmrl.policy.flow.demonstrations`. The token path labels every step already (set for a VLM, it is an error).
    every_step: bool = False

    def __post_init__(self):
        require(self.episodes >= 0, "sft.episodes", "must be >= 0 (0: no cold start)")
        for name in ("steps", "batch_size"):
            require(getattr(self, name) >= 1, f"sft.{name}", f"must be >= 1, got {getattr(self, name)}")
        require(self.noise >= 0 and self.label_noise >= 0, "sft.noise", "and sft.label_noise must be >= 0")


@dataclass(frozen=True)
class CurriculumConfig:
    option: str | None = None  # the env option to vary; None turns the curriculum off
    levels: list[Any] = field(default_factory=list)  # its values, easiest first
    promote_at: float | None = None  # advance when the recent success rate (or reward) reaches this
    window: int = 10  # steps averaged for promote_at
    steps_per_level: int = 0  # advance every this many steps (when promote_at is None)
    # Held-out evaluations also score every level (metrics `<metric>@<option>=<level>`), before and after RL.
    eval_levels: bool = False

    def __post_init__(self):
        if self.option is not None:
            require(bool(self.levels), "curriculum.levels", f"is empty but curriculum.option is {self.option!r}")
            require(
                self.promote_at is not None or self.steps_per_level >= 1,
                "curriculum.promote_at",
                "or curriculum.steps_per_level >= 1 is needed by a curriculum",
            )
        require(self.window >= 1, "curriculum.window", "must be >= 1")


@dataclass(frozen=True)
class EvalConfig:
    """`mmrl eval`'s sampled evaluation (the greedy one always runs, on `trainer.eval_episodes` held-out seeds)."""

    k: int = 0  # > 0: also sample k answers (episodes) per held-out item and report avg@k and pass@1..pass@k
    temperature: float = 1.0  # of the k samples
    episodes: int = 0  # held-out items for the k samples; 0: trainer.eval_episodes
    batch_size: int = 0  # episodes played at once (items x k); 0: trainer.eval_batch_size
    report_items: int = 5  # best and worst items shown in the report

    def __post_init__(self):
        for name in ("k", "episodes", "batch_size", "report_items"):
            require(getattr(self, name) >= 0, f"eval.{name}", f"must be >= 0, got {getattr(self, name)}")
        require(
            self.temperature > 0,
            "eval.temperature",
            f"must be > 0 (the greedy answers are always reported), got {self.temperature}",
        )


DEFAULT_RUBRIC = (
    "{image}The task for this image was: {instruction}\nThe answer given:\n{answer}\nHow well does the answer do the "
    "task for this image? Reply with one digit, 0 (wrong) to 9 (perfect)."
)


@dataclass(frozen=True)
class JudgeConfig:
    """A judge model as a reward (`mmrl.methods.judge`): a VLM scores each answer against the image it answers; the step's
    reward becomes `env reward + weight * score`, the score in [0, 1] logged as `reward/judge`."""

    model: str = ""  # a model folder (any AutoModelForImageTextToText with its processor); "" turns the judge off
    weight: float = 1.0
    # The judge's prompt: {image} places the image (else it comes first), {instruction} is the task's instruction
    # and {answer} the policy's answer; ask for one digit 0..max_score.
    rubric: str = DEFAULT_RUBRIC
    # "expected": the judge's probability-weighted score over the digit tokens 0..max_score after the prompt (one
    # forward, no sampling: G-Eval's score); "generate": its greedy reply, the first number in it (none: 0, a reason).
    mode: Literal["expected", "generate"] = "expected"
    max_score: int = 9
    answer_prefix: str = ""  # text the judge's reply starts with, after the chat template's assistant header
    max_new_tokens: int = 8  # of a "generate" reply
    max_prompt_tokens: int = 4096  # text tokens (the image not counted); a longer prompt scores 0 with the reason
    batch_size: int = 8  # prompts per forward
    cache_size: int = 4096  # (image, instruction, answer) -> score, least recently used out
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    remote: bool = False  # one Ray actor holds the judge for every process and rollout worker (else one per process)

    def __post_init__(self):
        require(1 <= self.max_score <= 9, "judge.max_score", f"must be in 1..9 (one digit), got {self.max_score}")
        for name in ("batch_size", "cache_size", "max_new_tokens", "max_prompt_tokens"):
            require(getattr(self, name) >= 1, f"judge.{name}", f"must be >= 1, got {getattr(self, name)}")
        require("{answer}" in self.rubric, "judge.rubric", "must contain {answer}, where the answer to judge goes")

    @property
    def enabled(self) -> bool:
        return bool(self.model)


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    output_dir: str = "runs/default"
    resume: bool = False  # continue from the last complete checkpoint in output_dir
    # A new run into an output_dir that holds an earlier run's metrics or checkpoints is refused unless this is set;
    # then the earlier run is moved aside, to `<output_dir>.previous-<n>`, before anything is written.
    overwrite: bool = False
    checkpoint: str | None = None  # a checkpoint folder to evaluate (mmrl eval) or to start from

    def __post_init__(self):
        """Checks that read more than one section; each section checks its own fields when it is built."""
        tc, model = self.trainer, self.model
        # The env's coordinate convention from the model's family unless set (mmrl.runtime.conventions); frozen: resolved
        # once, here, so the collector, evaluation, rollout workers and config.json all see the values in force.
        options = resolve_coordinates(self)
        if options is not None:
            object.__setattr__(self.env, "options", options)
        option = self.curriculum.option
        if option is not None and self.env.name in ENVS:  # each level is a value of that env option: check it as one
            cls = ENVS.get(self.env.name)
            for index, level in enumerate(self.curriculum.levels):
                problem = option_problem(cls, option, level)
                require(problem is None, f"curriculum.levels[{index}]", f"{problem} (values of env option "
                        f"{option!r})", sep=": ")  # fmt: skip
        if tc.master_weights == "float32":
            require(
                model.dtype != "float32",
                "trainer.master_weights",
                "='float32' needs model.dtype bfloat16 or float16: with model.dtype='float32' the weights are float32 "
                "already",
                sep="",
            )
            require(
                model.lora.r == 0,
                "trainer.master_weights",
                "='float32' is for full fine-tuning: with model.lora.r > 0 only the LoRA adapters train, and they are "
                "float32 already",
                sep="",
            )
        if tc.lr_schedule != "constant" and tc.total_steps:
            require(
                tc.warmup_steps < self.policy_updates,
                "trainer.warmup_steps",
                f"must be below the policy's {self.policy_updates} updates (trainer.total_steps less "
                f"algo.critic.warmup_steps) for lr_schedule {tc.lr_schedule!r} to decay, got {tc.warmup_steps}",
            )
        if tc.rollout_workers:
            require(
                self.algo.credit != "branch",
                "trainer.rollout_workers",
                "cannot play algo.credit branch yet (its greedy play with one sampled turn runs in this process); use "
                "trainer.rollout_workers=0",
            )
            require(
                not self.env.workers,
                "trainer.rollout_workers",
                "and env.workers cannot both be > 0: each rollout worker has its env",
            )
            require(
                model.generation_backend not in ("vllm", "vllm_process"),
                "trainer.rollout_workers",
                "runs CPU copies of the policy; it cannot use model.generation_backend vllm",
            )

    def check_validation_split(self) -> None:
        """A training run's check, not the config's (`mmrl eval` plays no mid-run evaluation): `trainer.eval_every`
        scores the validation split, which the dataset env holds only with `val_fraction > 0` or
        `hf_validation_split`; without one the run would stop at its first evaluation."""
        options = self.env.options
        require(
            not self.trainer.eval_every
            or self.env.name != "dataset"
            or options.get("split", "auto") != "auto"
            or bool(options.get("val_fraction"))
            or options.get("hf_validation_split") is not None,
            "trainer.eval_every",
            "scores the validation split, and the dataset env keeps no record for it: set env.options.val_fraction "
            "> 0 (its share of the records) or env.options.hf_validation_split (the data's own validation split), or "
            "trainer.eval_every=0",
        )

    @property
    def policy_updates(self) -> int:
        """The policy's optimiser steps in the run: `trainer.total_steps`, less the critic's warm-up steps (the value
        head trains alone) with a critic; the span a decaying lr schedule covers."""
        warmup = self.algo.critic.warmup_steps if self.algo.advantage in CRITIC_ADVANTAGES else 0
        return max(0, self.trainer.total_steps - warmup)

    @property
    def recompute_old_logprobs(self) -> bool:
        """Whether the trainer recomputes the old log-probs before the step's first update (`algo.old_logprobs`)."""
        ac = self.algo
        if ac.old_logprobs != "auto":
            return ac.old_logprobs == "recompute"
        return (
            self.model.generation_backend in ("vllm", "vllm_process")
            or self.trainer.max_staleness > 0
            or ac.rollout_correction not in ("auto", "none")
        )

    @property
    def correction(self) -> str | None:
        """The rollout correction's mode in force, or None (`algo.rollout_correction`, resolved)."""
        mode = self.algo.rollout_correction
        if mode == "auto":
            return "token_truncate" if self.recompute_old_logprobs else None
        return None if mode == "none" else mode


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """A `TrainConfig` from a YAML preset plus `section.field=value` overrides."""
    return load(TrainConfig, path, overrides)


def check_at_load(cfg: TrainConfig) -> None:
    """Refuse, before anything loads, what the schema leaves to the machine a run starts on: an `env.name` no env is
    registered under (`EnvConfig` leaves an unregistered name to this check: an env may be registered after the
    config is read), and a `model.device` torch does not know or this machine lacks (a config names cuda wherever it
    is read).

    Raises:
        ConfigError: naming `env.name` (and the registered envs) or `model.device`.
    """
    require(cfg.env.name in ENVS, "env.name", f"no env {cfg.env.name!r}; registered: {', '.join(ENVS.names())}",
            sep=": ")  # fmt: skip
    device = cfg.model.device
    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    require(kind is not None, "model.device", f"{device!r} is not a device (cpu, cuda, cuda:1, mps, ...)", sep=": ")
    require(kind != "cuda" or torch.cuda.is_available(), "model.device", f"{device!r}, but torch sees no CUDA GPU "
            "here: use model.device=cpu, or a CUDA build of torch on a machine with a GPU", sep=": ")  # fmt: skip
