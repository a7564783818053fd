"""The data that flows through a run: sampling settings, completions, rollouts and episodes, and their concatenation.

A leaf module: it imports nothing of the project (only torch), so every other module can depend on it and no import
circle can form around the policy. Rows are grouped contiguously (`x.view(-1, G)` gives the groups).

* `Sampling`: how completions are drawn (also the config's `sampling` section).
* `Completions`: what a generation backend returns, `[R, L]` ids, mask and sampling log-probs.
* `Rollout`: R self-contained model inputs plus completions (micro-batches are row slices of it).
* `Episodes`: the rows of R episodes (M generations over T turns), with per-turn rewards and outcomes.
* `Collected`: one training step's episodes, as collection hands them to the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch


@dataclass(frozen=True)
class Sampling:
    """How completions are drawn. `temperature=0` means greedy."""

    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        # Checked here, not in mmrl.runtime.config, because this leaf imports nothing: the config's `sampling` section is this.
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0 (0: greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0 (0: off), got {self.top_k}")


@dataclass(frozen=True)
class Turn:
    """One earlier turn of a world's conversation: what it showed and the answer the policy sampled."""

    views: torch.Tensor  # [V, H, W, 3] uint8, the turn's images
    instruction: str
    answer_ids: list[int]  # the sampled tokens, exactly (up to and including EOS where it ended)


@dataclass(frozen=True)
class Rollout:
    """R = B*G sampled completions, rows grouped contiguously (`x.view(-1, G)` gives the groups).

    Every tensor has R rows: prompts and images are repeated per completion so that any contiguous slice of
    rows is a self-contained model input (micro-batches are slices).
    """

    prompt_ids: torch.Tensor  # [R, P] left padded
    prompt_mask: torch.Tensor  # [R, P] bool
    # The images of every row, row by row, in a layout every model family fits: `pixel_values` stacks "units" along
    # its first dimension (a Qwen-VL patch row `[C*T*p*p]`, a Gemma 3 image `[3, H, W]`, an Idefics3 tile), and
    # `image_units` says how many units each image has. `image_inputs` holds the extra forward inputs with one entry
    # per image (Qwen's `image_grid_thw` `[images, 3]`), `unit_inputs` those with one per unit (Idefics3's
    # `pixel_attention_mask`). Which family lays out what: `mmrl.families`.
    pixel_values: torch.Tensor  # [sum of units over R rows, ...]
    image_units: torch.Tensor  # [sum of images over R rows] long, row by row
    completion_ids: torch.Tensor  # [R, L] right padded after EOS
    completion_mask: torch.Tensor  # [R, L] bool, True up to and including EOS
    logprobs: torch.Tensor  # [R, L] per token, at sampling time (temperature-scaled), 0 where masked
    texts: list[str]  # R decoded completions
    group_size: int
    # Images of each row: an int when every row has as many (its V views), else a `[R]` long tensor (a
    # conversation's rows hold the images of the turns they show).
    images_per_row: int | torch.Tensor = 1
    image_inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [images, ...]
    unit_inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [units, ...]

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def image_grid_thw(self) -> torch.Tensor:
        """Qwen-VL's `[images, 3]` patch grid of each image (a KeyError for families without one)."""
        return self.image_inputs["image_grid_thw"]

    def image_counts(self) -> torch.Tensor:
        """`[R]` long: how many images (and `image_units` entries) each row holds."""
        if isinstance(self.images_per_row, torch.Tensor):
            return self.images_per_row.to(torch.long).cpu()
        return torch.full((len(self),), int(self.images_per_row), dtype=torch.long)

    def select(self, rows: torch.Tensor) -> Rollout:
        """The rows `rows` (a `[r]` long tensor), e.g. the groups dynamic sampling keeps."""
        return _select(self, rows)

    @staticmethod
    def cat_rows(parts: list[Rollout], pad_token_id: int = 0) -> Rollout:
        """`cat_rollouts`: every kind of rollout joins its own rows (`type(rollout).cat_rows`)."""
        return cat_rollouts(parts, pad_token_id)

    def rows(self, start: int, stop: int) -> Rollout:
        """Rows [start, stop) as a self-contained rollout (a micro-batch)."""
        first = torch.cat([torch.zeros(1, dtype=torch.long), self.image_counts().cumsum(0)])  # [R+1] image offsets
        a, b = int(first[start]), int(first[stop])
        units = self.image_units.cpu()
        offsets = torch.cat([units.new_zeros(1), units.cumsum(0)])
        u, v = int(offsets[a]), int(offsets[b])
        counts = self.images_per_row
        return replace(
            self,
            prompt_ids=self.prompt_ids[start:stop],
            prompt_mask=self.prompt_mask[start:stop],
            pixel_values=self.pixel_values[u:v],
            image_units=self.image_units[a:b],
            image_inputs={k: x[a:b] for k, x in self.image_inputs.items()},
            unit_inputs={k: x[u:v] for k, x in self.unit_inputs.items()},
            images_per_row=counts[start:stop] if isinstance(counts, torch.Tensor) else counts,
            completion_ids=self.completion_ids[start:stop],
            completion_mask=self.completion_mask[start:stop],
            logprobs=self.logprobs[start:stop],
            texts=self.texts[start:stop],
        )


def _spans(starts: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The ranges `starts[i] .. starts[i] + counts[i] - 1`, concatenated in order, without a Python loop."""
    total = torch.arange(int(counts.sum()), device=counts.device)
    return total + (starts - (counts.cumsum(0) - counts)).repeat_interleave(counts)


def _select(batch: Rollout, rows: torch.Tensor) -> Rollout:
    rows = rows.to(torch.long).cpu()
    per_row = batch.image_counts()  # [R]
    first = torch.cat([per_row.new_zeros(1), per_row.cumsum(0)])[:-1]  # [R] each row's first image
    images = _spans(first[rows], per_row[rows])  # the selected rows' image indices, in order
    units = batch.image_units.cpu()  # [images]
    offsets = torch.cat([units.new_zeros(1), units.cumsum(0)])
    kept = _spans(offsets[images], units[images])  # every unit of those images
    return replace(
        batch,
        prompt_ids=batch.prompt_ids[rows],
        prompt_mask=batch.prompt_mask[rows],
        pixel_values=batch.pixel_values[kept.to(batch.pixel_values.device)],
        image_units=batch.image_units[images.to(batch.image_units.device)],
        image_inputs={k: x[images.to(x.device)] for k, x in batch.image_inputs.items()},
        unit_inputs={k: x[kept.to(x.device)] for k, x in batch.unit_inputs.items()},
        completion_ids=batch.completion_ids[rows],
        completion_mask=batch.completion_mask[rows],
        logprobs=batch.logprobs[rows],
        texts=[batch.texts[k] for k in rows.tolist()],
        images_per_row=batch.images_per_row[rows]
        if isinstance(batch.images_per_row, torch.Tensor)
        else batch.images_per_row,
    )


def cat_rollouts(parts: list[Rollout], pad_token_id: int = 0) -> Rollout:
    """Rows of several rollouts in one (e.g. every turn of multi-turn episodes), re-padded to common lengths.

    Prompts stay left padded and completions right padded (with `pad_token_id`, always under a False mask); parts
    with different images per row give per-row counts.
    """
    if not parts:
        raise ValueError("nothing to concatenate")
    uniform = {p.images_per_row for p in parts if not isinstance(p.images_per_row, torch.Tensor)}
    if len(uniform) == 1 and not any(isinstance(p.images_per_row, torch.Tensor) for p in parts):
        images_per_row: int | torch.Tensor = uniform.pop()
    else:
        images_per_row = torch.cat([p.image_counts() for p in parts])
    prompt_len = max(p.prompt_ids.shape[1] for p in parts)
    completion_len = max(p.completion_ids.shape[1] for p in parts)

    def left(x: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (prompt_len - x.shape[1], 0), value=value)

    def right(x: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, completion_len - x.shape[1]), value=value)

    return Rollout(
        prompt_ids=torch.cat([left(p.prompt_ids, pad_token_id) for p in parts]),
        prompt_mask=torch.cat([left(p.prompt_mask, False) for p in parts]),
        pixel_values=torch.cat([p.pixel_values for p in parts]),
        image_units=torch.cat([p.image_units for p in parts]),
        image_inputs={k: torch.cat([p.image_inputs[k] for p in parts]) for k in parts[0].image_inputs},
        unit_inputs={k: torch.cat([p.unit_inputs[k] for p in parts]) for k in parts[0].unit_inputs},
        completion_ids=torch.cat([right(p.completion_ids, pad_token_id) for p in parts]),
        completion_mask=torch.cat([right(p.completion_mask, False) for p in parts]),
        logprobs=torch.cat([right(p.logprobs, 0.0) for p in parts]),
        texts=[t for p in parts for t in p.texts],
        group_size=parts[0].group_size,
        images_per_row=images_per_row,
    )


@dataclass(frozen=True)
class Completions:
    """What a backend returns: R = B*G completions, rows grouped contiguously by prompt."""

    completion_ids: torch.Tensor  # [R, L] right padded with the pad token after each row's end
    completion_mask: torch.Tensor  # [R, L] bool, True up to and including EOS (or to the row's last token)
    logprobs: torch.Tensor  # [R, L] per token, at sampling time (temperature-scaled), 0 where masked


@dataclass(frozen=True)
class Episodes:
    """R episodes (G contiguous worlds per group) and the M generations made in them, flattened into rows.

    Row m is the generation of world `world[m]` at turn `turn[m]`. A turn is one generation; with action chunks it
    spans several env steps, whose rewards are summed into that turn's reward.
    """

    rollout: Rollout  # [M] rows
    world: torch.Tensor  # [M] long, the episode a row belongs to
    turn: torch.Tensor  # [M] long, its turn within the episode
    step_rewards: torch.Tensor  # [R, T] float, reward of each turn (0 after the episode ended)
    active: torch.Tensor  # [R, T] bool, the world generated at turn t
    success: torch.Tensor | None  # [R] bool, the episode succeeded at some step (None: the env has no success)
    components: dict[str, torch.Tensor]  # name -> [R], each reward component summed over the episode
    env_steps: torch.Tensor  # [R] long, env steps the episode lasted
    info: dict[str, Any]  # the first step's info, all R worlds (single-step tasks keep their boxes etc. here)
    start: Any = None  # sim.base.Observation the episodes started from, all R worlds (or None)
    frames: torch.Tensor | None = None  # [K, S+1, H, W, 3] uint8 observations of the first K worlds, if recorded
    state_keys: torch.Tensor | None = None  # [R, T] long, a hash of what each turn saw (equal: the same state)
    # What each row answered, kept only when a judge model scores the answers after collection (`mmrl.stages.shaping`):
    answered_images: torch.Tensor | None = None  # [M, H, W, 3] (or [M, V, H, W, 3]) uint8, the observation's images
    answered_instructions: list[str] | None = None  # [M] the observation's instruction

    @property
    def num_worlds(self) -> int:
        return self.step_rewards.shape[0]

    @property
    def dones(self) -> torch.Tensor:
        """`[R, T]` bool, True at each episode's last turn."""
        last = self.active.long().sum(-1).clamp(min=1) - 1  # [R]
        return torch.nn.functional.one_hot(last, self.active.shape[1]).bool() & self.active

    def returns(self, gamma: float = 1.0) -> torch.Tensor:
        """`[R]` discounted sum of turn rewards, `sum_t gamma^t r_t`."""
        discount = gamma ** torch.arange(self.step_rewards.shape[1], dtype=torch.float32)
        return (self.step_rewards * discount).sum(-1)

    def select_worlds(self, worlds: torch.Tensor) -> Episodes:
        """The episodes `worlds` (`[r]` long, ascending, whole groups) and their rows, renumbered 0..r-1."""
        renumber = torch.full((self.num_worlds,), -1, dtype=torch.long)
        renumber[worlds] = torch.arange(len(worlds))
        rows = (renumber[self.world] >= 0).nonzero().squeeze(-1)
        return replace(
            self,
            rollout=self.rollout.select(rows),
            world=renumber[self.world[rows]],
            turn=self.turn[rows],
            step_rewards=self.step_rewards[worlds],
            active=self.active[worlds],
            success=None if self.success is None else self.success[worlds],
            components={k: v[worlds] for k, v in self.components.items()},
            env_steps=self.env_steps[worlds],
            state_keys=None if self.state_keys is None else self.state_keys[worlds],
            answered_images=None if self.answered_images is None else self.answered_images[rows],
            answered_instructions=None
            if self.answered_instructions is None
            else [self.answered_instructions[k] for k in rows.tolist()],
            info=_select_info(self.info, worlds, self.num_worlds),
            start=None,
            frames=None,
        )


@dataclass(frozen=True)
class Collected:
    """What one step collected."""

    episodes: Episodes  # what trains: the kept groups (at most this process's share of rows)
    sampled: Episodes  # every episode sampled this step, before any filter (for the step's metrics)
    kept_groups: int  # groups that passed the filters (over every batch sampled)
    sampled_batches: int  # batches of B prompts sampled (more than 1 only with refill)
    stale: int = 0  # updates between the weights that played these episodes and the ones they train (at most k)
    version: int = 0  # the weights that played them: trainer steps completed when they were taken


def cat_episodes(parts: list[Episodes], pad_token_id: int = 0) -> Episodes:
    """Episodes of several collections as one (worlds renumbered in order), e.g. batches refilled by filters."""
    if len(parts) == 1:
        return parts[0]
    turns = max(p.step_rewards.shape[1] for p in parts)
    pad_t = lambda x: torch.nn.functional.pad(x, (0, turns - x.shape[1]))  # noqa: E731
    offsets = torch.tensor([0] + [p.num_worlds for p in parts]).cumsum(0)
    keys = set.intersection(*(set(p.components) for p in parts))
    info_keys = set.intersection(*(set(p.info) for p in parts))
    info = {}
    for k in info_keys:
        values = [p.info[k] for p in parts]
        if all(isinstance(v, torch.Tensor) for v in values) and len({v.shape[1:] for v in values}) == 1:
            info[k] = torch.cat(values)
        elif all(isinstance(v, list) for v in values):
            info[k] = [x for v in values for x in v]
    rollouts = [p.rollout for p in parts]
    return Episodes(
        rollout=type(rollouts[0]).cat_rows(rollouts, pad_token_id),  # each kind of rollout joins its own rows
        world=torch.cat([p.world + offsets[i] for i, p in enumerate(parts)]),
        turn=torch.cat([p.turn for p in parts]),
        step_rewards=torch.cat([pad_t(p.step_rewards) for p in parts]),
        active=torch.cat([pad_t(p.active) for p in parts]),
        success=None if any(p.success is None for p in parts) else torch.cat([p.success for p in parts]),
        components={k: torch.cat([p.components[k] for p in parts]) for k in keys},
        env_steps=torch.cat([p.env_steps for p in parts]),
        info=info,
        frames=None,
        state_keys=None
        if any(p.state_keys is None for p in parts)
        else torch.cat([pad_t(p.state_keys) for p in parts]),
        answered_images=None
        if any(p.answered_images is None for p in parts)
        else torch.cat([p.answered_images for p in parts]),
        answered_instructions=None
        if any(p.answered_instructions is None for p in parts)
        else [text for p in parts for text in p.answered_instructions],
    )


def _select_info(info: dict[str, Any], worlds: torch.Tensor, n: int) -> dict[str, Any]:
    out = {}
    for k, v in info.items():
        if isinstance(v, torch.Tensor) and v.ndim >= 1 and v.shape[0] == n:
            out[k] = v[worlds]
        elif isinstance(v, list) and len(v) == n:
            out[k] = [v[i] for i in worlds.tolist()]
    return out


@dataclass
class Demonstrations:
    """A cold start's rows: what the policy is shown and the expert's labels, in the kind's own form.

    `images[m]`, `instructions[m]` and `labels[m]` describe row m; `extra` holds what a kind needs beside them (the
    proprioceptive state, an episode's previous row).
    """

    images: torch.Tensor  # [M, (V,) H, W, 3] uint8
    instructions: list[str]  # [M]
    labels: Any  # [M, ...] tensor, or M strings (text answers)
    success_rate: float  # the demonstrator's, over its episodes
    episodes: int
    extra: dict[str, Any]

    def __len__(self) -> int:
        return len(self.instructions)

    def describe(self) -> str:
        return (f"{len(self)} demonstration rows from {self.episodes} episodes (demonstrator success "
                f"{self.success_rate:.2f})")


# The batch types a checkpoint may hold (the steps queued ahead by asynchronous collection): `torch.load` with
# `weights_only=True` builds these and nothing else of the project (`mmrl.runtime.checkpoint`). A kind whose rollout
# is a type of its own appends it where it defines it.
CHECKPOINT_TYPES: list[type] = [Collected, Episodes, Rollout]
