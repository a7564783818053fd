"""Token-level pieces shared by the policy and its generation backends, and the `Protocol` backends sample for.

A leaf of `mmrl.policy`: backends (`backends.py`, `vllm_backend.py`) and model options (`options.py`) depend on this
and on the model, never on `VLMPolicy` itself, so `vlm.py` can import them at module level without a circle.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from transformers import LogitsProcessor


class GenerationTarget(Protocol):
    """What a generation backend reads of the policy it samples for (`VLMPolicy` is one)."""

    model: Any  # the transformers model (or its PEFT wrapper)
    processor: Any  # its `VisionTextProcessor`
    prompt_template: str
    action_codec: Any  # a VLA's `ActionCodec`, or None
    eos_token_ids: list[int]
    pad_token_id: int | None
    suppress_token_ids: list[int]  # never sampled (vision placeholders)

    @property
    def device(self) -> torch.device: ...

    def token_index(self, completion_ids: torch.Tensor) -> torch.Tensor: ...


class ModelHolder(Protocol):
    """What the model options (`mmrl.policy.lora`) read and replace: the model, a VLA's codec, the backend."""

    model: Any
    action_codec: Any
    generation_backend: str

    def set_generation_backend(self, name: str, **options) -> None: ...


class AllowOnly(LogitsProcessor):
    """Bans every token but `allowed` (the action tokens of a VLA) at every generation step."""

    def __init__(self, allowed: torch.Tensor):
        self.allowed = allowed

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        banned = torch.ones(scores.shape[-1], dtype=torch.bool, device=scores.device)
        banned[self.allowed.to(scores.device)] = False
        return scores.masked_fill(banned, float("-inf"))


def completion_mask_from_ids(completion_ids: torch.Tensor, eos_token_ids: list[int]) -> torch.Tensor:
    """True for every token up to and including the first EOS of each row.

    Args:
        completion_ids: `[R, L]` generated tokens.
        eos_token_ids: ids that end a completion.

    Returns:
        `[R, L]` bool.
    """
    is_eos = torch.isin(completion_ids, torch.tensor(eos_token_ids, device=completion_ids.device))
    # A token is kept if no EOS came strictly before it.
    eos_before = is_eos.int().cumsum(-1) - is_eos.int()
    return eos_before == 0


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(token) under softmax(logits / temperature).

    Args:
        logits: `[R, L, V]`.
        tokens: `[R, L]`.

    Returns:
        `[R, L]` per token.
    """
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    # logsumexp + gather avoids materialising a second [R, L, V] tensor of log-probs.
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)
