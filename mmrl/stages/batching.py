"""Micro-batches packed by tokens instead of rows, and padding trimmed per micro-batch.

A row-count micro-batch (`trainer.micro_batch_size`) sized for short completions runs out of memory when a rollout
holds long ones (an SVG policy writing 500 tokens), and one sized for long completions wastes the GPU on short
ones. `token_budget_slices` cuts the R rows of a rollout into contiguous slices whose *padded* token count stays
within a budget, so the activation memory of one forward/backward is bounded whatever the lengths.

The cost of a slice is what its forward pass computes once its padding is trimmed (`trim_padding`): every row is
padded to the longest prompt and the longest completion *of the slice*, so

    cost(a, b) = (b - a) * (max prompt length in rows [a, b) + max completion length in rows [a, b)).

Slices stay contiguous (no sorting by length): rows are grouped contiguously (`x.view(-1, G)`) and the trainer
weights each slice by its share of the batch, which needs no reordering. Image patches are not counted: the vision
tower sees `4x` as many patches as the prompt holds image tokens, the same for every row of a task.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..types import Rollout


def token_budget_slices(
    prompt_mask: torch.Tensor, completion_mask: torch.Tensor, budget: int
) -> list[tuple[int, int]]:
    """Contiguous row slices `[(start, stop), ...]` covering all rows, each within `budget` padded tokens.

    Slices are grown greedily from the first row: a slice takes the next row as long as
    `rows * (max prompt length + max completion length)` over its rows stays within `budget`. The cost of a slice
    never drops when it takes a row, so greedy growth gives the fewest contiguous slices. A single row longer than
    the budget still gets a slice of its own (it cannot be split; it may not fit in memory either, which the
    caller will then see as an out-of-memory error rather than a silently dropped row).

    Args:
        prompt_mask: `[R, P]` bool, True on real prompt tokens (left padding False).
        completion_mask: `[R, L]` bool, True on completion tokens that count (right padding False).
        budget: the most padded tokens (prompt + completion) one slice may hold; > 0.

    Returns:
        `[(start, stop)]` with `start < stop`, consecutive, from 0 to R.

    >>> p = torch.tensor([[1, 1], [0, 1], [1, 1]], dtype=torch.bool)  # prompt lengths 2, 1, 2
    >>> c = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)  # completion lengths 3, 1, 2
    >>> token_budget_slices(p, c, budget=10)  # rows 0-1 cost 2 * (2 + 3) = 10; adding row 2 costs 15
    [(0, 2), (2, 3)]
    """
    if budget <= 0:
        raise ValueError(f"token budget must be > 0, got {budget}")
    if prompt_mask.shape[0] != completion_mask.shape[0]:
        raise ValueError(f"prompt_mask has {prompt_mask.shape[0]} rows, completion_mask {completion_mask.shape[0]}")
    # One host transfer, then a scan over R integers: the scan is sequential by nature (each slice starts where
    # the previous one stopped), and R is the number of rows of one step (hundreds), not tokens.
    prompt_lens = _left_extent(prompt_mask).tolist()  # [R]
    completion_lens = _right_extent(completion_mask).tolist()  # [R]
    slices, start, longest_prompt, longest_completion = [], 0, 0, 0
    for row, (p, c) in enumerate(zip(prompt_lens, completion_lens)):
        grown_prompt, grown_completion = max(longest_prompt, p), max(longest_completion, c)
        if row > start and (row - start + 1) * (grown_prompt + grown_completion) > budget:
            slices.append((start, row))
            start, grown_prompt, grown_completion = row, p, c
        longest_prompt, longest_completion = grown_prompt, grown_completion
    if len(prompt_lens) > start:
        slices.append((start, len(prompt_lens)))
    return slices


def trim_padding(batch: Rollout) -> Rollout:
    """`batch` without the prompt columns that are padding in every row and the completion columns masked in all.

    `Rollout.rows` keeps the width of the whole rollout; a slice of short rows trimmed this way costs what
    `token_budget_slices` counted. Left padding (its amount and content) does not change a row's log-probs, and
    dropping completion columns past every row's end cannot change the earlier ones (causal attention), so
    `policy.logprobs(trim_padding(b))` equals `policy.logprobs(b)[:, :L']` on the kept columns.

    Returns:
        A rollout with prompts `[r, P']` and completions `[r, L']`, `P' <= P`, `L' <= L` (at least one column each).
    """
    prompt_width = max(int(_left_extent(batch.prompt_mask).max()), 1) if len(batch) else 1
    completion_width = max(int(_right_extent(batch.completion_mask).max()), 1) if len(batch) else 1
    return replace(
        batch,
        prompt_ids=batch.prompt_ids[:, -prompt_width:],
        prompt_mask=batch.prompt_mask[:, -prompt_width:],
        completion_ids=batch.completion_ids[:, :completion_width],
        completion_mask=batch.completion_mask[:, :completion_width],
        logprobs=batch.logprobs[:, :completion_width],
    )


def _right_extent(mask: torch.Tensor) -> torch.Tensor:
    """`[R]` columns up to and including each row's last True (0 for an all-False row) of a `[R, L]` mask."""
    if mask.shape[-1] == 0:
        return torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device)
    columns = torch.arange(1, mask.shape[-1] + 1, device=mask.device)  # [L]
    return (mask.bool().long() * columns).amax(-1)


def _left_extent(mask: torch.Tensor) -> torch.Tensor:
    """`[R]` columns from each row's first True to the end (0 for an all-False row) of a left-padded `[R, P]` mask."""
    return _right_extent(mask.flip(-1))


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward's rows of a rollout, self-contained, with its share of the batch's loss."""

    rollout: Rollout  # r rows (padding trimmed with a token budget)
    masked: Rollout | None  # the same rows with masked images (PAPO), or None
    advantages: torch.Tensor  # [r]
    weight: torch.Tensor  # [] the slice's share of the whole batch (of every process); 0 for an idle slice
    start: int = 0  # the slice's first row in the rollout it was cut from
    row_weight: torch.Tensor | float = 0.0  # [] its share of the batch's rows (of every process); 0 when idle
    rollout_logprobs: torch.Tensor | None = None  # [r, L'] the sampler's log-probs when `rollout`'s are recomputed


def micro_batches(
    rollout: Rollout,
    advantages: torch.Tensor,
    masked: Rollout | None,
    *,
    micro_batch_size: int,
    token_budget: int,
    aggregation: str,
    world,
    rollout_logprobs: torch.Tensor | None = None,
    idle: bool = False,
) -> list[MicroBatch]:
    """The rollout's rows as micro-batches whose weighted losses sum to the full-batch loss over every process.

    Each slice is weighted by its share of the batch: tokens for `token_mean`, rows for the per-sequence means, of
    every process (`world.sum`), so the sum over slices and processes equals the full-batch loss. FSDP's forward and
    backward are collectives: every process runs as many slices as the one with the most, and a process out of rows
    repeats its first slice with weight 0 (an idle slice).

    Args:
        rollout: `[R]` rows; `advantages` `[R]` and `masked` (R rows, or None) line up with them.
        micro_batch_size: rows per slice when `token_budget` is 0.
        token_budget: > 0 packs slices by padded tokens instead (`token_budget_slices`) and trims their padding.
        aggregation: the loss aggregation (`token_mean` weighs by tokens, the others by rows).
        world: this process's `mmrl.runtime.distributed.World`.
        rollout_logprobs: `[R, L]` the sampler's log-probs, sliced alongside, when `rollout.logprobs` are the trainer's.
        idle: this process has no rows in this batch while others have (a mini-batch it holds no group of): its
            slices run `rollout`'s rows with weight 0 and count for nothing in the totals.
    """
    total_tokens = world.sum(rollout.completion_mask.sum() * (not idle)).clamp(min=1)
    n_rows = len(rollout)
    total_rows = world.sum(0 if idle else n_rows)
    if token_budget > 0:
        slices = token_budget_slices(rollout.prompt_mask, rollout.completion_mask, token_budget)
    else:
        slices = [(a, min(a + micro_batch_size, n_rows)) for a in range(0, n_rows, micro_batch_size)]
    out = []
    for index in range(world.max(len(slices))):
        start, stop = slices[0] if index >= len(slices) else slices[index]
        mb = rollout.rows(start, stop)
        mb_masked = masked.rows(start, stop) if masked is not None else None
        if token_budget > 0:
            mb = trim_padding(mb)
            mb_masked = trim_padding(mb_masked) if mb_masked is not None else None
        if aggregation == "token_mean":
            weight = mb.completion_mask.sum() / total_tokens
        else:
            weight = torch.tensor((stop - start) / total_rows)
        weight = torch.zeros_like(weight) if idle or index >= len(slices) else weight
        sampler = None if rollout_logprobs is None else rollout_logprobs[start:stop, : mb.completion_ids.shape[1]]
        row_weight = 0.0 if idle or index >= len(slices) else (stop - start) / max(total_rows, 1)
        out.append(MicroBatch(mb, mb_masked, advantages[start:stop], weight, start, row_weight, sampler))
    return out


def mini_batch_rows(
    row_groups: torch.Tensor, first_group: int, total_groups: int, groups_per_batch: int, generator: torch.Generator
) -> list[torch.Tensor | None]:
    """The rows of each mini-batch of one pass over a rollout: whole prompt groups, in a fresh random order.

    The mini-batches are cut from the groups of every process together (the same draw in each), so a K-process run
    takes the optimiser steps one process generating the same K shards takes; a process takes its rows of each.

    Args:
        row_groups: `[M]` long, the prompt group each of this process's rows belongs to (`episode // group_size`).
        first_group: the index of this process's first group among every process's (0 in one process).
        total_groups: the groups of every process.
        groups_per_batch: the most groups one mini-batch takes; 0 takes them all.
        generator: draws the order of the groups (seeded alike in every process).

    Returns:
        One entry per mini-batch, alike in count in every process: the sorted indices of this process's rows in it
        (empty where it holds none of its groups), or `[None]` for one mini-batch of every row in order (no draw:
        the default path is untouched).
    """
    count = mini_batch_count(total_groups, groups_per_batch)
    if count <= 1:
        return [None]
    order = torch.randperm(total_groups, generator=generator)
    return [torch.isin(row_groups + first_group, part).nonzero().squeeze(-1) for part in order.tensor_split(count)]


def mini_batch_count(total_groups: int, groups_per_batch: int) -> int:
    """How many mini-batches `mini_batch_rows` cuts `total_groups` groups into (1 when it takes them all at once)."""
    per = groups_per_batch or total_groups
    return max(-(-total_groups // per), 1) if total_groups else 1
