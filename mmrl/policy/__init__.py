"""Policies: each kind a sub-package behind one interface (`mmrl.policy.base.Policy`), registered in `POLICY_KINDS`.

Kinds: `vlm` (`VLMPolicy`, a transformers image-text-to-text model over tokens; a VLA with an action codec) and `flow`
(`FlowPolicy`, transformers' π0). Importing this package registers them. `load_policy` is the one way a config's
model becomes a policy: the kind the path holds (`kind_of`), loaded from a folder or built tiny.
"""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError

from sim.errors import InputError

from ..runtime.config import ConfigError, ModelConfig, TrainConfig
from ..runtime.paths import TINY_PREFIX, local_path
from ..runtime.precision import DTYPES
from ..types import Completions, Rollout, Sampling, cat_rollouts
from .base import FEATURES, POLICY_KINDS, Feature, Policy, kind_of, tiny_names
from .engines.backends import BACKENDS, GenerationBackend
from .flow import FlowPolicy
from .lora import apply_lora, enable_gradient_checkpointing, find_vision_modules, freeze_vision, is_lora, merge_lora
from .tokens import GenerationTarget, ModelHolder, completion_mask_from_ids, token_logprobs
from .vlm import VLMPolicy, build_tiny
from .vlm.action_codec import ActionCodec, add_action_tokens
from .vlm.options import apply_model_options
from .vlm.processing import VisionTextProcessor
from .vlm.tiny import ALL_TINY_ARCHS, FAMILY_ARCHS, TINY_ARCHS


def load_policy(cfg: ModelConfig, checkpoint: str | Path | None = None, action_dim: int | None = None) -> Policy:
    """The policy a config names: `checkpoint` when given (a run's checkpoint folder), else `cfg.path` (a model
    folder, a repository-relative preset path, a hub id, or "tiny:<name>", a random tiny model of the kind that
    builds it). `action_dim` (the env's) sizes a tiny model's actions where its kind needs it. The options of
    `cfg` are not applied: `Policy.fit` does that for a run."""
    path = str(checkpoint if checkpoint is not None else cfg.path)
    kind = kind_of(path)
    if path.startswith(TINY_PREFIX):
        policy = kind.tiny(path.removeprefix(TINY_PREFIX), cfg, action_dim)
        policy.model.to(device=cfg.device, dtype=DTYPES[cfg.dtype])
        return policy
    field = "checkpoint" if checkpoint is not None else "model.path"
    try:
        return kind.load(local_path(path), cfg, DTYPES[cfg.dtype])
    except (InputError, ConfigError) as error:  # the folder's own checks: named with the field it came from
        raise type(error)(f"{field}: {error}") from error
    except (OSError, SafetensorError) as error:  # a file missing, unreadable or cut short, as transformers found it
        raise InputError(f"{field}: cannot load the model in {path}: {' '.join(str(error).split())}") from error


def check_run(cfg: TrainConfig, world_size: int = 1) -> type[Policy]:
    """The kind `cfg`'s model is (its checkpoint's, for `mmrl eval`), checked against what `cfg` asks of it before
    anything loads: a feature it lacks is one `ConfigError` naming every field (`Policy.check_config`)."""
    kind = kind_of(cfg.checkpoint or cfg.model.path)
    if cfg.checkpoint is not None and not cfg.model.path.startswith(TINY_PREFIX):
        try:
            preset = kind_of(cfg.model.path)
        except (OSError, ValueError):  # a hub id not cached here: its kind is unknown, the checkpoint's decides
            preset = kind
        if preset is not kind:
            raise ConfigError(f"checkpoint: {cfg.checkpoint} holds a model for {kind.label}, the config's "
                              f"model.path {cfg.model.path} one for {preset.label}: use a config made for "
                              "the checkpoint's kind")  # fmt: skip
    kind.check_config(cfg, world_size)
    return kind


__all__ = [
    "ALL_TINY_ARCHS",
    "BACKENDS",
    "DTYPES",
    "FAMILY_ARCHS",
    "FEATURES",
    "POLICY_KINDS",
    "TINY_ARCHS",
    "ActionCodec",
    "Completions",
    "Feature",
    "FlowPolicy",
    "GenerationBackend",
    "GenerationTarget",
    "ModelHolder",
    "Policy",
    "Rollout",
    "Sampling",
    "VLMPolicy",
    "VisionTextProcessor",
    "add_action_tokens",
    "apply_lora",
    "apply_model_options",
    "build_tiny",
    "cat_rollouts",
    "check_run",
    "completion_mask_from_ids",
    "enable_gradient_checkpointing",
    "find_vision_modules",
    "freeze_vision",
    "is_lora",
    "kind_of",
    "load_policy",
    "merge_lora",
    "tiny_names",
    "token_logprobs",
]
