"""The data of a flow policy (`mmrl.policy.flow`): its rollout of denoising chains and its normalisation statistics."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ...types import CHECKPOINT_TYPES

STATS_FILE = "processor_config.json"  # where PI0Processor keeps the statistics, and so do we
NOISE_METHODS = ("flow_sde", "flow_noise")  # how a chain's steps are drawn (FlowRollout.noise_method)


def sampler_problem(method: str | None, level: float | None, steps: int | None) -> tuple[str, str] | None:
    """What is wrong with a flow sampler's settings, as `(the model field, why)`, or None; a None value is not checked
    (a folder's own fills it in later). The one check of the sampler's settings: the policy's constructor, its config
    check before loading and its options after loading all ask it."""
    if method is not None and method not in NOISE_METHODS:
        return "model.flow.noise_method", f"must be one of {', '.join(NOISE_METHODS)} or null, got {method!r}"
    if level is not None and not (math.isfinite(level) and level >= 0):
        return "model.flow.noise_level", f"must be >= 0 (0: the deterministic ODE) or null, got {level}"
    if steps is not None and steps < 1:
        return "model.flow.steps", f"must be >= 1 or null, got {steps}"
    if steps == 1 and (level or 0) > 0 and method in (None, "flow_sde"):
        return "model.flow.steps", (
            f"is 1, but Flow-SDE at noise level {level} needs >= 2 denoising steps (its sigma is infinite at t = 1): "
            "set model.flow.steps >= 2, or model.flow.noise_level=0 (the ODE)"
        )
    return None


# ---------------------------------------------------------------------------------------------- the rollout


@dataclass(frozen=True)
class FlowRollout:
    """R = B*G sampled action chunks and their denoising chains, rows grouped contiguously; quacks like
    `mmrl.types.Rollout` where the update reads one (`len`, `select`, `rows`, the masks and log-probs)."""

    prompt_ids: torch.Tensor  # [R, P] left padded: <image> x (T*V), <bos>, instruction, "\n"
    prompt_mask: torch.Tensor  # [R, P] bool
    pixel_values: torch.Tensor  # [R, V, 3, S, S] float, normalised images of every view
    pixel_attention_mask: torch.Tensor  # [R, V] bool
    state: torch.Tensor  # [R, Smax] normalised proprioceptive state, zero padded
    chain: torch.Tensor  # [R, K+1, C, A] x_K (noise) ... x_0 (the normalised chunk), A = max_action_dim
    actions: torch.Tensor  # [R, C, D] the executed actions, in env units
    completion_ids: torch.Tensor  # [R, K] long, the denoising step index (the rows' "tokens")
    completion_mask: torch.Tensor  # [R, K] bool, True where the step was sampled (all False for greedy rows)
    logprobs: torch.Tensor  # [R, K] per denoising step at sampling time, 0 where masked
    group_size: int
    noise_level: float  # a, the Flow-SDE noise level the chain was drawn with (0: the ODE)
    texts: list[str]  # R empty strings (no text is written; evaluation code reads this field)
    noise_method: str = "flow_sde"  # how the chain's steps were drawn: "flow_sde" or "flow_noise" (a learned std)

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    @staticmethod
    def cat_rows(parts: list[FlowRollout], pad_token_id: int = 0) -> FlowRollout:
        """`cat_flow_rollouts` (`Rollout.cat_rows`'s counterpart: collection, refill and shards join rows by it)."""
        return cat_flow_rollouts(parts, pad_token_id)

    def select(self, rows: torch.Tensor) -> FlowRollout:
        """The rows `rows` (a `[r]` long tensor)."""
        rows = rows.to(torch.long).cpu()
        picked = {name: getattr(self, name)[rows.to(getattr(self, name).device)] for name in _ROW_TENSORS}
        return replace(self, **picked, texts=[self.texts[k] for k in rows.tolist()])

    def __getitem__(self, rows: torch.Tensor) -> FlowRollout:
        # The update's mini-batches index what is not a `Rollout` as a tensor (`x[rows]`): the same rows.
        return self.select(rows)

    def rows(self, start: int, stop: int) -> FlowRollout:
        """Rows [start, stop) as a self-contained rollout (a micro-batch)."""
        picked = {name: getattr(self, name)[start:stop] for name in _ROW_TENSORS}
        return replace(self, **picked, texts=self.texts[start:stop])



CHECKPOINT_TYPES.append(FlowRollout)  # a checkpoint of queued flow steps holds them (`weights_only` loads it)

_ROW_TENSORS = (
    "prompt_ids", "prompt_mask", "pixel_values", "pixel_attention_mask", "state", "chain", "actions",
    "completion_ids", "completion_mask", "logprobs",
)  # fmt: skip


def cat_flow_rollouts(parts: list[FlowRollout], pad_token_id: int = 0) -> FlowRollout:
    """Rows of several flow rollouts in one (every turn of an episode batch), prompts re-padded on the left."""
    if not parts:
        raise ValueError("nothing to concatenate")
    width = max(p.prompt_ids.shape[1] for p in parts)
    left = lambda x, value: F.pad(x, (width - x.shape[1], 0), value=value)  # noqa: E731
    joined = {name: torch.cat([getattr(p, name) for p in parts]) for name in _ROW_TENSORS}
    joined["prompt_ids"] = torch.cat([left(p.prompt_ids, pad_token_id) for p in parts])
    joined["prompt_mask"] = torch.cat([left(p.prompt_mask, False) for p in parts])
    return replace(parts[0], **joined, texts=[t for p in parts for t in p.texts])


# ---------------------------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class FlowStats:
    """Normalisation statistics of the proprioceptive state and the actions (mean and std per dimension), as π0's
    `PI0Processor` keeps them; computed from demonstrations (`from_demonstrations`)."""

    state_mean: tuple[float, ...]  # [P]
    state_std: tuple[float, ...]  # [P]
    actions_mean: tuple[float, ...]  # [D]
    actions_std: tuple[float, ...]  # [D]

    def __post_init__(self):
        for a, b in (("state_mean", "state_std"), ("actions_mean", "actions_std")):
            if len(getattr(self, a)) != len(getattr(self, b)) or not getattr(self, a):
                raise ValueError(f"{a} and {b} must be non-empty and of one length")
            if any(not s > 0 for s in getattr(self, b)):
                raise ValueError(f"{b} must be > 0 everywhere, got {getattr(self, b)}")

    @property
    def state_dim(self) -> int:
        return len(self.state_mean)

    @property
    def action_dim(self) -> int:
        return len(self.actions_mean)

    @classmethod
    def from_demonstrations(cls, proprio: torch.Tensor, actions: torch.Tensor, floor: float = 1e-3) -> FlowStats:
        """Mean and std of `proprio` `[M, P]` and `actions` `[M, D]` (or `[M, C, D]`), std at least `floor`."""
        actions = actions.reshape(-1, actions.shape[-1]).double()
        proprio = proprio.double()
        as_tuple = lambda x: tuple(float(v) for v in x.float())  # noqa: E731  (float32 values: exact in JSON)
        return cls(
            as_tuple(proprio.mean(0)), as_tuple(proprio.std(0, correction=0).clamp(min=floor)),
            as_tuple(actions.mean(0)), as_tuple(actions.std(0, correction=0).clamp(min=floor)),
        )  # fmt: skip

    @classmethod
    def read(cls, folder: Path) -> FlowStats | None:
        """The statistics a folder carries in its `processor_config.json` (PI0Processor's fields), else None."""
        path = Path(folder) / STATS_FILE
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        names = ("state_mean", "state_std", "actions_mean", "actions_std")
        if any(data.get(k) is None for k in names):
            return None
        return cls(*(tuple(float(v) for v in data[k]) for k in names))

    def to_json(self) -> dict:
        return {k: list(getattr(self, k)) for k in ("state_mean", "state_std", "actions_mean", "actions_std")}
