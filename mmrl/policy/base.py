"""The policy interface: the verbs the stages call, the features a kind declares, and the registry of kinds.

A **kind** of policy (a token policy over a VLM, a flow-matching VLA, ...) is a subclass of `Policy` registered in
`POLICY_KINDS` under a name. The trainer, the objective and the checkpoints see only this interface:

* loading: `load(folder, cfg, dtype)` and `tiny(name, cfg, action_dim)` (classmethods), `save_pretrained(path)`;
* fitting to a run: `check_config(cfg, world_size)` (classmethod, before anything loads), `apply_options(cfg.model)`,
  `fit(cfg, env)` (the model options and what the env needs of the policy), `check_env(env)`, `chunk` (actions one generation executes) and
  `row_sampling(sampling)` (the sampling its rows are drawn with);
* acting and scoring: `generate(obs, group_size, sampling, history)` -> a rollout with the sampling-time log-probs,
  `actions(rollout)` -> the continuous actions it carries, `logprobs(batch)` -> `[R, L]` under the current weights
  with gradients (L indexes what carries a log-prob: tokens, or denoising steps), `value_input(model)` (the module
  whose input a critic's value head reads);
* the cold start: `demonstrations(env, cfg)` and `demonstration_loss(demonstrations, rows, generator)`, which
  `mmrl.stages.cold_start` runs in its one loop;
* engines: `release_memory()` around an update, `close()` when the run ends, `expect_version(v)` and
  `sampled_version()` for an engine that samples with pushed weights (nothing to do for a kind that holds none).

What a kind supports beyond these is a set of named **features** (`FEATURES`): each names the config fields that ask
for it and, where the kind has it, the verb it brings (PAPO's `masked`, a conversation's `history`, ...).
`check_config` refuses, in one error naming every field, what a run asks of a kind that lacks it, so no stage asks
which kind it holds. Adding a kind is a sub-package of `mmrl.policy` and one registration.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from rewards.registry import Registry

from ..runtime.config import FREEZE_PARTS, ModelConfig, TrainConfig
from ..runtime.paths import TINY_PREFIX, folder_config, model_folder
from ..runtime.schema import ConfigError
from ..types import Demonstrations, Sampling

if TYPE_CHECKING:
    from sim.base import Observation, VecEnv


@dataclass(frozen=True)
class Feature:
    """What a run may ask of a policy beyond the common verbs: the config fields that ask for it."""

    fields: tuple[str, ...]  # the config fields that ask for it, named in a refusal
    asked: Callable[[TrainConfig, int], bool]  # (config, number of processes) -> whether the run asks for it
    brings: str = ""  # the verb or attribute a kind that has it provides, for a reader adding a kind


FEATURES: dict[str, Feature] = {
    "papo": Feature(
        ("algo.papo.gamma", "algo.papo.monitor"),
        lambda c, k: c.algo.papo.masked_pass,
        "masked(batch, domain, ratio, generator): the batch with its images masked",
    ),
    "branching": Feature(
        ("algo.credit",),
        lambda c, k: c.algo.credit == "branch",
        "greedy play at every turn but one (temperature 0 in `generate`)",
    ),
    "judge": Feature(("judge.model",), lambda c, k: c.judge.enabled, "text answers a judge model reads"),
    "history": Feature(
        ("model.history_turns",),
        lambda c, k: c.model.history_turns > 0,
        "history_turns, and `generate(..., history=)` taking earlier turns",
    ),
    "rollout_workers": Feature(
        ("trainer.rollout_workers",),
        lambda c, k: c.trainer.rollout_workers > 0,
        "a copy that plays in a worker process",
    ),
    "sharded_async": Feature(
        ("trainer.max_staleness",),
        lambda c, k: c.trainer.max_staleness > 0 and k > 1,
        "a whole copy of an FSDP-sharded policy for the collector thread under torchrun",
    ),
    "text_answers": Feature(
        ("algo.overlong.filter", "algo.overlong.penalty", "algo.label_free", "algo.care.coef"),
        lambda c, k: (
            c.algo.overlong.filter or c.algo.overlong.penalty > 0 or c.algo.label_free != "off" or c.algo.care.coef > 0
        ),
        "eos_token_ids and a processor: rows that end by an EOS token, answers as text (overlong shaping, TTRV "
        "votes, GRPO-CARE's consistency)",
    ),
    "progress": Feature(
        ("algo.progress_coef",),
        lambda c, k: c.algo.progress_coef > 0,
        "vision_inputs(rollout) and processor.features: image embeddings for SRPO's progress",
    ),
    "engines": Feature(
        ("model.generation_backend",),
        lambda c, k: c.model.generation_backend != "lean",
        "set_generation_backend(name, **options): generation backends other than its own loop",
    ),
    "system_prompt": Feature(
        ("model.system_prompt",), lambda c, k: bool(c.model.system_prompt), "a chat template to put a system turn in"
    ),
    "pixel_range": Feature(
        ("model.min_pixels", "model.max_pixels"),
        lambda c, k: c.model.min_pixels > 0 or c.model.max_pixels > 0,
        "images resized within an area range",
    ),
    "action_tokens": Feature(
        ("model.action_bins", "model.action_chunk"),
        lambda c, k: c.model.action_bins > 0 or c.model.action_chunk != 1,
        "continuous actions as added tokens (an action codec)",
    ),
    "flow_sampler": Feature(
        ("model.flow.noise_level", "model.flow.noise_method", "model.flow.steps"),
        lambda c, k: any(
            v is not None for v in (c.model.flow.noise_level, c.model.flow.noise_method, c.model.flow.steps)
        ),
        "a stochastic denoising sampler (Flow-SDE / Flow-Noise)",
    ),
    "chunk_labels": Feature(
        ("sft.every_step",),
        lambda c, k: c.sft.every_step and c.sft.episodes > 0,
        "demonstration chunks labelled at every step",
    ),
    "untied_expert": Feature(
        ("model.freeze",),
        lambda c, k: c.model.lora.r == 0 and not set(FREEZE_PARTS) - set(c.model.freeze),
        "a part model.freeze never freezes (an action expert), so freezing every part still trains something",
    ),
}


class Policy(ABC):
    """A policy behind the stages' verbs (see the module docstring); one subclass per kind, registered by name.

    Class attributes a kind sets:
        features: the names of `FEATURES` it supports.
        refusals: why it lacks a feature, by name, for the error that refuses it (optional).
        label: how errors name the kind ("flow policies (π0)").
        model_types: the `config.json` model_type values (or LeRobot `type`s) of the folders it loads; empty for the
            kind that loads any other folder (the fallback: transformers' image-text-to-text models).
        tiny_names: the `tiny:<name>` model paths it builds (random tiny models from `assets/`).
    """

    features: ClassVar[frozenset[str]] = frozenset()
    refusals: ClassVar[dict[str, str]] = {}
    label: ClassVar[str] = "policies"
    model_types: ClassVar[frozenset[str]] = frozenset()
    tiny_names: ClassVar[tuple[str, ...]] = ()
    model: torch.nn.Module
    pad_token_id: int | None
    chunk: int  # actions one generation executes, open-loop

    # ------------------------------------------------------------------------------------------------ loading
    @classmethod
    @abstractmethod
    def load(cls, folder: str | Path, cfg: ModelConfig, dtype: torch.dtype) -> Policy:
        """The policy saved in `folder` (a model folder or a checkpoint), on `cfg.device`."""

    @classmethod
    @abstractmethod
    def tiny(cls, name: str, cfg: ModelConfig, action_dim: int | None = None) -> Policy:
        """A random tiny model `tiny:<name>` (seeded by `cfg.seed`) for an env of `action_dim`-D actions (None: a
        text env)."""

    @abstractmethod
    def save_pretrained(self, path: str | Path) -> None:
        """Write the policy to `path`, loadable by `load`."""

    # ------------------------------------------------------------------------------------------ fitting to a run
    @classmethod
    def check_config(cls, cfg: TrainConfig, world_size: int = 1) -> None:
        """Refuse, before anything loads, what `cfg` asks of this kind that it lacks: one `ConfigError` naming every
        field. A kind extends it with checks of its own fields' values."""
        bad = []
        for name, feature in FEATURES.items():
            if name not in cls.features and feature.asked(cfg, world_size):
                fields = [f for f in feature.fields if _set(cfg, f)] or list(feature.fields)  # those set, by name
                why = cls.refusals.get(name, "")
                bad.append(f"{', '.join(fields)}: not built for {cls.label}" + (f": {why}" if why else ""))
        if bad:
            raise ConfigError("; ".join(bad))

    @abstractmethod
    def apply_options(self, cfg: ModelConfig) -> Policy:
        """Apply `cfg`'s model options (LoRA, frozen parts, checkpointing, sampling settings) to the loaded policy;
        returns it (LoRA may wrap its model)."""

    @abstractmethod
    def fit(self, cfg: TrainConfig, env: VecEnv) -> Policy:
        """Make a loaded policy ready for the run: its model options (LoRA, frozen parts, ...) and what `env` needs
        of it, checked against `env`. Returns the policy (LoRA may wrap its model). Called before the optimiser."""

    @abstractmethod
    def check_env(self, env: VecEnv) -> None:
        """Raise a ValueError naming what does not fit if the policy cannot act in `env`."""

    @abstractmethod
    def row_sampling(self, sampling: Sampling) -> Sampling:
        """`sampling` as this policy's rows are drawn: `max_new_tokens` is what a row holds when its length is fixed
        (a VLA's C*D action tokens, a flow policy's K denoising steps)."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------------------------ acting and scoring
    @abstractmethod
    def generate(self, obs: Observation, group_size: int, sampling: Sampling, history: list | None = None) -> Any:
        """`group_size` samples per observation (rows grouped contiguously), with the sampling-time log-probs."""

    @abstractmethod
    def actions(self, rollout: Any) -> torch.Tensor:
        """`[R, C, D]` the continuous actions a rollout's rows carry (for a continuous env)."""

    @abstractmethod
    def logprobs(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        """`[R, L]` log-probs of `batch`'s rows under the current weights, with gradients."""

    @abstractmethod
    def value_input(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module of `model` (the policy's module as trained) whose input a value head reads, at position 0."""

    # ------------------------------------------------------------------------------------------- the cold start
    @abstractmethod
    def demonstrations(self, env: VecEnv, cfg: TrainConfig) -> Demonstrations:
        """The env expert's demonstrations for the cold start (`cfg.sft`), in this kind's labels."""

    @abstractmethod
    def demonstration_loss(
        self, demonstrations: Demonstrations, rows: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """The imitation loss of demonstration rows `rows` (`[b]`), drawing what it draws from `generator`."""

    # ------------------------------------------------------------------------------------------------ engines
    def release_memory(self) -> None:  # noqa: B027 (a kind without an engine holds nothing to free)
        """Free what a generation engine holds (weights, KV cache) while the update runs; the next `generate`
        takes it back."""

    def close(self) -> None:  # noqa: B027 (a kind without processes or engines holds nothing)
        """Let go of processes and engines when the run ends."""

    def expect_version(self, version: int | None) -> None:  # noqa: B027 (it samples with its own weights)
        """Tell an engine process which weights version the next samples must come from (None: any)."""

    def sampled_version(self) -> int | None:
        """The weights version an engine process last sampled with; None where `generate` samples with the policy's
        own weights, which are always the current ones."""
        return None


def _set(cfg: TrainConfig, name: str) -> bool:
    """Whether field `name` ("section.field", or deeper: "algo.papo.gamma") of `cfg` differs from its section's
    default."""
    *path, field_name = name.split(".")
    section = cfg
    for part in path:
        section = getattr(section, part)
    return getattr(section, field_name) != getattr(type(section)(), field_name)


POLICY_KINDS: Registry[type[Policy]] = Registry("policy kind")


def kind_of(path: str | Path) -> type[Policy]:
    """The registered kind that loads the model at `path` (a folder, a checkpoint, "tiny:<name>", a cached hub id):
    the one whose `tiny_names` or `model_types` name it, else the fallback kind (no `model_types`). The one detector
    of which kind a path holds; it reads `config.json` only."""
    path = str(path)
    kinds = [POLICY_KINDS.get(name) for name in POLICY_KINDS.names()]
    if path.startswith(TINY_PREFIX):
        name = path.removeprefix(TINY_PREFIX)
        for kind in kinds:
            if name in kind.tiny_names:
                return kind
        raise ConfigError(f"model.path: unknown tiny model {name!r}; choose one of {', '.join(tiny_names())}")
    config = folder_config(model_folder(path))
    declared = {config.get("model_type"), config.get("type")} - {None}
    for kind in kinds:
        if kind.model_types & declared:
            return kind
    fallback = [kind for kind in kinds if not kind.model_types]
    assert len(fallback) == 1, f"exactly one policy kind loads the other folders, not {fallback}"
    return fallback[0]


def tiny_names() -> tuple[str, ...]:
    """Every `tiny:<name>` a registered kind builds."""
    return tuple(name for kind in POLICY_KINDS.names() for name in POLICY_KINDS.get(kind).tiny_names)
