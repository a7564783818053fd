"""Configuration: frozen dataclasses are the schema, YAML files in configs/ are presets, `section.field=value`
arguments override any field. Unknown keys are errors that name the key and the valid ones.

This module runs past the project's 600 lines on purpose: it is the schema, one dataclass per config
section whose field comments are the fields' documentation and whose `__post_init__` holds their checks; splitting
the sections apart would scatter one schema. The machinery (YAML, overrides) is `mmrl.runtime.schema`'s, model-folder
checks are `mmrl.runtime.folders`'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rewards import REWARDS
from rewards.combine import RewardSpec
from sim.mix import ENV_REWARD
from sim.registry import ENVS, option_problem
from sim.seeds import TRAIN_SEEDS

from ..algos import ADVANTAGES, CRITIC_ADVANTAGES, POLICY_LOSSES, STEP_ADVANTAGES, Aggregation
from ..types import Sampling
from .conventions import resolve_coordinates
from .schema import ConfigError, apply_overrides, from_dict, load, require, to_dict  # noqa: F401 (re-exported)

LOG_BACKENDS = ("jsonl", "tensorboard", "wandb")
FREEZE_PARTS = ("vision", "projector", "language")  # model.freeze: see mmrl.policy.lora.part_parameters
# Each policy loss's own clip range and aggregation: what algo.clip_low, algo.clip_high and algo.aggregation left at
# null resolve to (a loss not listed takes ppo_clip's). PPO's token ratio: DAPO's clip-higher range
# (https://arxiv.org/abs/2503.14476), room for unlikely tokens to rise, averaged over tokens. GSPO's sequence ratio, the
# geometric mean of its token ratios, stays far closer to 1: the paper clips it at 3e-4 / 4e-4 and averages per
# sequence (https://arxiv.org/abs/2507.18071, section 5.1), as gspo_loss's own defaults do.
LOSS_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo_clip": {"clip_low": 0.2, "clip_high": 0.28, "aggregation": "token_mean"},
    "dual_clip": {"clip_low": 0.2, "clip_high": 0.28, "aggregation": "token_mean"},
    "gspo": {"clip_low": 3e-4, "clip_high": 4e-4, "aggregation": "seq_mean_token_mean"},
}
# GSPO refuses a range wider than this, 25 times the paper's: one that wide is a token ratio's (PPO's 0.2 / 0.28 left
# in place), under which GSPO's sequence ratios would seldom clip.
GSPO_MAX_CLIP = 0.01


@dataclass(frozen=True)
class ModelConfig:
    # A checkpoint folder (or a hub id where a hub is reachable), or "tiny:<arch>" for a random tiny model
    # built from assets/ (arch: qwen2_vl, qwen2_5_vl, qwen3_vl).
    path: str = "assets/tiny_models/qwen3_vl_warm_start"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    # How an env instruction becomes the user turn of the chat; `{instruction}` is replaced.
    prompt_template: str = "{instruction}"
    # A system turn before every prompt (and conversation), rendered by the model's own chat template (Gemma 3 folds it
    # into the first user turn); TRL and verl users put it in each dataset row's messages, here it is one field.
    # "": no system turn (a template's own default stays: Qwen2-VL's "You are a helpful assistant.").
    system_prompt: str = ""
    # Multi-turn episodes as conversations: each turn's prompt keeps the world's last K turns (their images, the
    # instructions and the exact tokens the policy sampled as answers) before the current observation; 0: none.
    history_turns: int = 0
    seed: int = 0  # initialisation seed for "tiny:" models and LoRA adapters
    # A VLA: > 0 adds this many action tokens (uniform bins per action dimension, bounds from the env) so the model
    # acts in continuous-action envs; 0 keeps a text policy. A checkpoint that already has a codec keeps its own.
    action_bins: int = 0
    action_chunk: int = 1  # actions per generation (C*D tokens at once)
    # Real-size training on one GPU.
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory, ~30% slower)
    freeze_vision: bool = False  # keep the vision tower (and its merger) fixed; only the language model trains
    # Parts kept fixed, any of "vision" (the vision encoder), "projector" (its merger into the language model's
    # space; Qwen3-VL's deepstack mergers too), "language" (the language model, embeddings and head included).
    freeze: list[str] = field(default_factory=list)
    # Each image's area after resizing, in pixels, as qwen-vl-utils' min_pixels/max_pixels (0: the processor's own);
    # bounds the image tokens per image (about area / (patch * merge)^2).
    min_pixels: int = 0
    max_pixels: int = 0
    lora_r: int = 0  # > 0 trains LoRA adapters of this rank (PEFT) instead of every weight
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    # PEFT's target_modules: "all-linear" or comma-separated names; for a flow policy (π0) the parts that get
    # adapters: "backbone" (PaliGemma's language model), "expert" (the action expert), both, or all-linear for both
    lora_target_modules: str = "all-linear"
    # LoRA on the vision side too: adapters on every linear layer of the vision tower and its projector, added to
    # lora_target_modules' (which otherwise leave the vision tower out); needs model.lora_r > 0.
    lora_vision: bool = False
    # Generation backend behind the policy's one `generate`: "lean" (a sampling loop over the model's forward and
    # dynamic cache; each prompt prefilled once), "hf" (transformers' generate, the reference), "static" (static KV
    # cache + compiled decoding; GPU), "vllm" (a colocated vLLM engine; needs vllm installed).
    # "vllm_process": vLLM in a process of its own, which trainer.max_staleness >= 1 samples from while this one updates
    generation_backend: Literal["lean", "hf", "static", "vllm", "vllm_process"] = "lean"
    vllm_gpu_memory_utilization: float = 0.3  # share of GPU memory the colocated vLLM engine may take
    # A flow policy's (π0's) sampling; null keeps the model folder's own (processor_config.json), else the policy's
    # defaults (flow_sde, 0.5, the config's num_inference_steps). Set for any other model, they are refused (the policy
    # kind's check, `mmrl.policy.base`, which checks their values too).
    flow_noise_level: float | None = None  # Flow-SDE's noise level a (0: the deterministic ODE; πRL uses 0.5)
    flow_noise_method: str | None = None  # a denoising step's noise: "flow_sde" (noise level) or "flow_noise" (learned)
    flow_steps: int | None = None  # K denoising steps per action chunk (the rows' "tokens")

    def __post_init__(self):
        require(
            self.action_bins == 0 or self.action_bins >= 2, "model.action_bins", "must be 0 (a text policy) or >= 2"
        )
        require(self.action_chunk >= 1, "model.action_chunk", "must be >= 1")
        require(self.history_turns >= 0, "model.history_turns", "must be >= 0 (0: the current observation only)")
        require(self.lora_r >= 0, "model.lora_r", "must be >= 0 (0: no LoRA)")
        require(not self.lora_vision or self.lora_r > 0, "model.lora_vision", "needs model.lora_r > 0 (LoRA on)")
        require(0 < self.vllm_gpu_memory_utilization <= 1, "model.vllm_gpu_memory_utilization", "must be in (0, 1]")
        for name in ("min_pixels", "max_pixels"):
            require(
                getattr(self, name) >= 0,
                f"model.{name}",
                f"must be >= 0 (0: the processor's own), got {getattr(self, name)}",
            )
        require(
            not (self.min_pixels and self.max_pixels) or self.min_pixels <= self.max_pixels,
            "model.min_pixels",
            f"({self.min_pixels}) is above model.max_pixels ({self.max_pixels})",
        )
        unknown = [part for part in self.freeze if part not in FREEZE_PARTS]
        require(not unknown, "model.freeze", f"unknown part(s) {unknown}; choose from {', '.join(FREEZE_PARTS)}")


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
class AlgoConfig:
    group_size: int = 8  # G completions per prompt
    advantage: str = "grpo"  # mmrl.algos.ADVANTAGES (grpo, dr_grpo, rloo, reinforce_pp) or CRITIC_ADVANTAGES (gae)
    scale_by_std: bool = True
    loss: str = "ppo_clip"  # a name in mmrl.algos.POLICY_LOSSES: ppo_clip, dual_clip, gspo
    # The ratio's clip range [1 - clip_low, 1 + clip_high] and how per-token terms become one number; null: the loss's
    # own (LOSS_DEFAULTS: ppo_clip and dual_clip 0.2 / 0.28 / token_mean, gspo 3e-4 / 4e-4 / seq_mean_token_mean),
    # resolved when the config is built, so every reader sees the values in force.
    clip_low: float | None = None
    clip_high: float | None = None
    aggregation: Aggregation | None = None
    kl_coef: float = 0.0  # > 0 loads a frozen reference copy of the initial policy
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    entropy_coef: float = 0.0  # entropy bonus weight
    # Drop groups whose rewards are all equal (they carry no GRPO signal) before the update (DAPO).
    dynamic_sampling: bool = False
    # DAPO's overlong handling: leave completions cut off at max_new_tokens (no EOS) out of the loss, and/or add a
    # length penalty ramping from 0 to -overlong_penalty over the last overlong_cache_len tokens (0 turns it off).
    overlong_filter: bool = False
    overlong_penalty: float = 0.0
    overlong_cache_len: int = 8
    # Perception-aware policy optimisation (PAPO, https://arxiv.org/abs/2507.06448): a second pass on a masked
    # copy of each image; the KL between the two passes is pushed up with weight papo_gamma (0 turns PAPO off).
    papo_gamma: float = 0.0
    papo_eta: float = 0.0  # double-entropy regulariser weight (entropy of both passes), against loss hacking
    papo_mask: Literal["patches", "pixels"] = "patches"  # blacken whole vision patches, or pixel-tensor entries
    papo_mask_ratio: float = 0.6  # official: patches at 0.6; TRL's version: pixels at 0.3
    papo_grad_through_masked: bool = False  # official: no gradient through the masked pass
    papo_kl_bound: float | None = None  # clamp the per-token KL to [0, bound] (TRL used 0.2)
    # With papo_gamma 0: still run the masked pass (no gradient) and log papo/*, to measure how much a baseline
    # policy looks at its images (the same KL PAPO pushes up), at the cost of one more forward pass.
    papo_monitor: bool = False
    # Refill: with dynamic_sampling or a difficulty filter, sample up to this many batches of B prompts per step
    # until B groups pass (DAPO's max_num_gen_batches); 1 trains on whatever passed the first batch.
    max_sample_batches: int = 1
    # Online difficulty filtering: keep prompts whose group success rate (mean reward where the env has no
    # success) lies strictly inside (difficulty_low, difficulty_high); None on both turns it off.
    difficulty_low: float | None = None
    difficulty_high: float | None = None
    # Multi-turn credit: "episode" gives every turn the GRPO advantage of the episode's discounted return;
    # "step" compares each turn's return-to-go with the same turn of the other group members.
    # ("gigpo" with step credit: GiGPO, the episode's GRPO advantage plus gigpo_step_weight x the turn's return
    # normalised among the group's turns that saw the same observation, its anchor state.)
    # "branch": policy-iteration rollouts. Each group plays greedily except at one turn, drawn uniformly per group,
    # where its G worlds sample; only that turn's rows train, with the group advantage of the episode returns. The
    # greedy prefix is the same in every world of the group (same seed, same answers), so the returns differ only
    # through the sampled answer and the greedy play after it: each answer is scored by what the greedy policy,
    # the one evaluated, makes of it.
    credit: Literal["episode", "step", "branch"] = "episode"
    gamma: float = 1.0  # discount over turns
    gigpo_step_weight: float = 1.0
    # PPO epochs and mini-batches (verl's ppo_epochs / ppo_mini_batch_size): each rollout feeds ppo_epochs passes,
    # each pass split into mini-batches of mini_batch_groups prompt groups (0: the whole rollout) in a fresh order,
    # one optimiser step per mini-batch. With more than one step per rollout the ratio leaves 1 and the clips bind.
    ppo_epochs: int = 1
    mini_batch_groups: int = 0
    # The "old" log-probs of the ratio: the sampler's ("sampling"), or the trainer's own, recomputed before the
    # step's first update ("recompute"; the sampler's are then compared with them, `mismatch/*`). "auto": recompute
    # where the sampler is another computation (model.generation_backend vllm) or older weights
    # (trainer.max_staleness 1), or a correction is asked for.
    old_logprobs: Literal["auto", "sampling", "recompute"] = "auto"
    # Truncated (TIS) or masked (MIS) importance weights pi_old / pi_rollout, per token or per sequence, on the
    # surrogate (`mmrl.algos.correction`); "auto": token_truncate wherever the old log-probs are recomputed.
    rollout_correction: Literal[
        "auto", "none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
    ] = "auto"
    rollout_correction_cap: float = 2.0  # truncate at it; mask outside [1/cap, cap]
    # A critic (advantage: gae): a value head on the policy's last prompt hidden state (mmrl/methods/critic.py), GAE over
    # turns with `gamma` and gae_lambda, the clipped value loss; the head alone trains for critic_warmup_steps.
    gae_lambda: float = 0.95
    value_coef: float = 0.5
    value_clip: float = 0.2  # 0: no clip
    critic_lr: float = 1e-3
    critic_hidden: int = 256  # units of the head's hidden layer; 0: a linear head
    critic_warmup_steps: int = 0
    critic_trunk_grad: bool = False  # let the value loss train the policy's trunk too (a shared actor-critic)
    critic_time: bool = False  # the head also reads the share of the episode's turns left (time-aware values)
    # Label-free rewards (mmrl/methods/consistency.py). "ttrv": TTRV (https://arxiv.org/abs/2510.06783), each sample's reward is
    # the share of its group giving the same parsed answer plus ttrv_entropy_coef x its part in a low entropy of the
    # group's answer distribution; the env's reward (its labels) is then only logged, never trained on.
    label_free: Literal["off", "ttrv"] = "off"
    ttrv_entropy_coef: float = 0.5
    ttrv_answer: Literal["choice", "text"] = "choice"  # answers compared by letter (parse_choice) or normalised text
    # GRPO-CARE (https://arxiv.org/abs/2506.16141): > 0 adds this bonus to correct answers whose likelihood given their
    # reasoning, under an EMA copy of the policy, beats the mean of the group's correct samples; replaces the KL term.
    care_coef: float = 0.0
    care_ema_decay: float = 0.995  # the EMA reference's decay per update (1: frozen, 0: the policy itself)
    # SRPO (https://arxiv.org/abs/2511.15605): > 0 gives each failed episode up to this much reward for how close it
    # came to its group's successes, in the policy's own vision features (mmrl/methods/progress.py).
    progress_coef: float = 0.0

    def __post_init__(self):
        own = LOSS_DEFAULTS.get(self.loss, LOSS_DEFAULTS["ppo_clip"])
        for name, value in own.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)  # frozen: resolved once, here, before any check reads it
        require(self.group_size >= 1, "algo.group_size", "must be >= 1")
        known = list(dict.fromkeys([*ADVANTAGES.names(), *CRITIC_ADVANTAGES.names(), *STEP_ADVANTAGES.names()]))
        require(self.advantage in known, "algo.advantage", f"{self.advantage!r} is not one of {known}")
        require(
            self.credit == "step" or self.advantage in ADVANTAGES or self.advantage in CRITIC_ADVANTAGES,
            "algo.advantage",
            f"{self.advantage!r} gives each turn its own advantage: it needs algo.credit step, not {self.credit!r}",
        )
        require(self.gigpo_step_weight >= 0, "algo.gigpo_step_weight", "must be >= 0")
        critic = self.advantage in CRITIC_ADVANTAGES
        require(self.loss in POLICY_LOSSES, "algo.loss", f"{self.loss!r} is not one of {POLICY_LOSSES.names()}")
        require(
            not (critic and self.credit == "step"),
            "algo.credit",
            f"'step' cannot be combined with algo.advantage {self.advantage!r}: its advantages are per turn already "
            "(leave algo.credit at episode)",
        )
        require(
            critic or self.credit != "step" or self.advantage in STEP_ADVANTAGES,
            "algo.credit",
            f"'step' works with algo.advantage {' or '.join(STEP_ADVANTAGES.names())}, not {self.advantage!r} (use "
            "algo.credit=episode with it)",
        )
        require(
            self.credit != "branch" or self.advantage in ADVANTAGES,
            "algo.credit",
            f"'branch' compares the group's episode returns: it needs an episode estimator "
            f"({' or '.join(ADVANTAGES.names())}), not {self.advantage!r}",
        )
        require(
            self.credit != "branch" or self.group_size >= 2,
            "algo.credit",
            "'branch' compares the G answers sampled at the branch turn: it needs algo.group_size >= 2",
        )
        require(self.advantage != "rloo" or self.group_size >= 2, "algo.advantage", "rloo needs algo.group_size >= 2")
        for name in ("clip_low", "clip_high", "kl_coef", "entropy_coef", "overlong_penalty", "papo_gamma", "papo_eta"):
            require(getattr(self, name) >= 0, f"algo.{name}", f"must be >= 0, got {getattr(self, name)}")
        require(
            self.loss != "gspo" or max(self.clip_low, self.clip_high) <= GSPO_MAX_CLIP,
            "algo.clip_low and algo.clip_high",
            f"({self.clip_low} / {self.clip_high}) are a token ratio's range, but algo.loss gspo clips the sequence "
            f"ratio, which stays far closer to 1: set both <= {GSPO_MAX_CLIP}, or null for GSPO's own 3e-4 / 4e-4",
        )
        require(self.overlong_cache_len >= 1, "algo.overlong_cache_len", "must be >= 1")
        require(0 <= self.papo_mask_ratio <= 1, "algo.papo_mask_ratio", "must be in [0, 1]")
        require(self.papo_kl_bound is None or self.papo_kl_bound > 0, "algo.papo_kl_bound", "must be > 0 or null")
        require(self.max_sample_batches >= 1, "algo.max_sample_batches", "must be >= 1")
        low, high = self.difficulty_low, self.difficulty_high
        require(
            low is None or high is None or low < high,
            "algo.difficulty_low",
            f"must be below algo.difficulty_high, got {low} and {high}",
        )
        require(0 <= self.gamma <= 1, "algo.gamma", "must be in [0, 1]")
        require(self.ppo_epochs >= 1, "algo.ppo_epochs", f"must be >= 1, got {self.ppo_epochs}")
        require(self.mini_batch_groups >= 0, "algo.mini_batch_groups", "must be >= 0 (0: the whole rollout)")
        require(self.rollout_correction_cap > 1, "algo.rollout_correction_cap", "must be > 1")
        require(0 <= self.gae_lambda <= 1, "algo.gae_lambda", "must be in [0, 1]")
        for name in ("value_coef", "value_clip", "critic_hidden", "critic_warmup_steps"):
            require(getattr(self, name) >= 0, f"algo.{name}", f"must be >= 0, got {getattr(self, name)}")
        require(self.critic_lr > 0, "algo.critic_lr", "must be > 0")
        for name in ("critic_warmup_steps", "critic_trunk_grad", "critic_time"):
            require(
                critic or not getattr(self, name),
                f"algo.{name}",
                f"needs a critic: algo.advantage {' or '.join(CRITIC_ADVANTAGES.names())}, not {self.advantage!r}",
            )
        require(self.ttrv_entropy_coef >= 0, "algo.ttrv_entropy_coef", f"must be >= 0, got {self.ttrv_entropy_coef}")
        require(
            self.label_free == "off" or (self.difficulty_low is None and self.difficulty_high is None),
            "algo.label_free",
            f"{self.label_free!r} trains without labels; algo.difficulty_low/high filter groups by their labelled success "
            "(leave them null, or use algo.dynamic_sampling)",
        )
        require(self.progress_coef >= 0, "algo.progress_coef", f"must be >= 0 (0: off), got {self.progress_coef}")
        require(self.care_coef >= 0, "algo.care_coef", f"must be >= 0 (0: off), got {self.care_coef}")
        require(0 <= self.care_ema_decay <= 1, "algo.care_ema_decay", f"must be in [0, 1], got {self.care_ema_decay}")
        require(
            self.care_coef == 0 or self.kl_coef == 0,
            "algo.care_coef",
            f"> 0 (GRPO-CARE) replaces the KL penalty: set algo.kl_coef to 0, not {self.kl_coef}",
        )
        require(
            self.care_coef == 0 or self.label_free == "off",
            "algo.care_coef",
            "> 0 (GRPO-CARE) rewards correct answers; it needs labels, not algo.label_free " + repr(self.label_free),
        )
        require(
            self.old_logprobs != "sampling" or self.rollout_correction in ("auto", "none"),
            "algo.rollout_correction",
            f"{self.rollout_correction!r} compares the trainer's log-probs with the sampler's: it needs "
            "algo.old_logprobs recompute (or auto), not 'sampling'",
        )


@dataclass(frozen=True)
class TrainerConfig:
    total_steps: int = 100
    prompts_per_step: int = 8  # B; each step trains on R = B*G completions
    micro_batch_size: int = 64  # rows per forward/backward; gradients accumulate over R / micro_batch_size
    lr: float = 1e-4  # what most presets train at; real-size LoRA presets use 2e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    seed: int = 0
    eval_episodes: int = 200  # held-out seeds, disjoint from every training seed
    eval_batch_size: int = 100
    eval_every: int = 0  # 0: only before and after training
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
                model.lora_r == 0,
                "trainer.master_weights",
                "='float32' is for full fine-tuning: with model.lora_r > 0 only the LoRA adapters train, and they are "
                "float32 already",
                sep="",
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
