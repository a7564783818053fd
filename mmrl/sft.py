"""Supervised fine-tuning on (observation, target text) pairs: the cold start the RL papers run before RL."""

from __future__ import annotations

import torch

from sim.base import Observation

from .policy.vlm import Rollout, VLMPolicy


def supervised_batch(policy: VLMPolicy, obs: Observation, targets: list[str]) -> Rollout:
    """A `Rollout` whose completions are the given target texts (each followed by EOS), for teacher forcing."""
    inputs = policy.encode(obs)
    tok = policy.processor.tokenizer
    ids = [tok(t, add_special_tokens=False)["input_ids"] + [policy.eos_token_ids[0]] for t in targets]
    length = max(map(len, ids))
    completion_ids = torch.full((len(ids), length), policy.pad_token_id, dtype=torch.long)
    for i, row in enumerate(ids):
        completion_ids[i, : len(row)] = torch.tensor(row)
    # Lengths, not token values, decide the mask: some real configs use the EOS id as the pad id.
    lengths = torch.tensor([len(row) for row in ids])
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    device = policy.device
    return Rollout(
        prompt_ids=inputs["input_ids"],
        prompt_mask=inputs["attention_mask"].bool(),
        pixel_values=inputs["pixel_values"],
        image_grid_thw=inputs["image_grid_thw"],
        completion_ids=completion_ids.to(device),
        completion_mask=mask.to(device),
        logprobs=torch.zeros(completion_ids.shape, device=device),
        texts=list(targets),
        group_size=1,
    )


def sft_loss(logprobs: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood over the target tokens.

    Args:
        logprobs: `[R, L]` per token.
        completion_mask: `[R, L]` bool.
    """
    mask = completion_mask.to(logprobs.dtype)
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1)
