"""A VLA is a VLM plus an action codec: continuous actions <-> action tokens.

Each action dimension is discretised into K uniform bins between the env's bounds (RT-2 and OpenVLA use 256), and
bin k of any dimension is the token `<|action_k|>`. An action of D dimensions is D tokens; an action chunk of C
steps is C*D tokens generated at once (fewer generations per episode).

The K tokens are **added** to the tokenizer and the embedding matrix grows by K rows. OpenVLA instead reused the
256 least-used tokens of the vocabulary, which overwrote real tokens (openvla/openvla#71, #226, #246); here no
existing token changes meaning. A model that already carries the tokens (a saved VLA) reuses them.

Bin k of a dimension decodes to `low + k * (high - low) / (K - 1)`: the bounds themselves are bins, so the
saturated actions that scripted experts often emit are exact.

>>> import torch
>>> codec = ActionCodec(low=torch.tensor([-1.0, 0.0]), high=torch.tensor([1.0, 2.0]), token_ids=list(range(100, 105)))
>>> codec.encode(torch.tensor([[1.0, 0.0]]))  # bin 4 of [-1, 1], bin 0 of [0, 2]
tensor([[104, 100]])
>>> codec.decode(torch.tensor([[102, 103]]))  # [1, C=1, D=2]
tensor([[[0.0000, 1.5000]]])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from sim.seeds import stream_seed

CODEC_FILE = "action_codec.json"


def action_token(k: int) -> str:
    return f"<|action_{k}|>"


class ActionCodec:
    """Continuous actions `[N, C, D]` <-> token ids `[N, C*D]` with K uniform bins per dimension.

    Args:
        low: `[D]` lower bounds of the action space.
        high: `[D]` upper bounds.
        token_ids: K token ids; the k-th one stands for bin k.
        chunk: C, actions per generation.
    """

    def __init__(self, low: torch.Tensor, high: torch.Tensor, token_ids: Sequence[int], chunk: int = 1):
        self.low = torch.as_tensor(low, dtype=torch.float32).flatten()  # [D]
        self.high = torch.as_tensor(high, dtype=torch.float32).flatten()  # [D]
        if self.low.shape != self.high.shape or not bool((self.high > self.low).all()):
            raise ValueError(f"action bounds must be [D] tensors with high > low, got {self.low} and {self.high}")
        if not torch.isfinite(torch.cat([self.low, self.high])).all():
            raise ValueError("action bounds must be finite to be discretised into bins")
        if len(token_ids) < 2:
            raise ValueError(f"need at least 2 bins, got {len(token_ids)}")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.token_ids = torch.tensor(list(token_ids), dtype=torch.long)  # [K]
        self.chunk = chunk
        # id -> bin lookup; -1 marks ids that are not action tokens.
        self._bin_of = torch.full((int(self.token_ids.max()) + 1,), -1, dtype=torch.long)
        self._bin_of[self.token_ids] = torch.arange(len(self.token_ids))

    @property
    def bins(self) -> int:
        return len(self.token_ids)

    @property
    def action_dim(self) -> int:
        return self.low.numel()

    @property
    def tokens_per_generation(self) -> int:
        """C*D: the fixed number of tokens one generation emits."""
        return self.chunk * self.action_dim

    def to_bins(self, actions: torch.Tensor) -> torch.Tensor:
        """Nearest bin of each entry, actions clipped to the bounds. `[..., D]` -> `[..., D]` long."""
        unit = (actions.float() - self.low) / (self.high - self.low)  # [..., D] in [0, 1] inside the bounds
        return (unit.clamp(0, 1) * (self.bins - 1)).round().long()

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """Token ids of actions `[N, D]` or chunks `[N, C, D]` -> `[N, C*D]` (C = 1 for `[N, D]`)."""
        if actions.shape[-1] != self.action_dim:
            raise ValueError(f"actions have {actions.shape[-1]} dimensions, the codec {self.action_dim}")
        bins = self.to_bins(actions)
        return self.token_ids[bins].reshape(actions.shape[0], -1)

    def decode(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Actions `[N, C, D]` from generated ids `[N, C*D]`; an id that is not an action token raises."""
        ids = token_ids.long().cpu()
        if ids.shape[-1] != self.tokens_per_generation:
            raise ValueError(f"expected {self.tokens_per_generation} action tokens per row, got {ids.shape[-1]}")
        inside = (ids >= 0) & (ids < len(self._bin_of))
        bins = torch.where(inside, self._bin_of[ids.clamp(0, len(self._bin_of) - 1)], -1)
        if (bins < 0).any():
            bad = ids[bins < 0][:5].tolist()
            raise ValueError(f"ids {bad} are not action tokens (generation must be restricted to the codec's tokens)")
        unit = bins.view(ids.shape[0], self.chunk, self.action_dim).float() / (self.bins - 1)  # [N, C, D]
        return self.low + unit * (self.high - self.low)

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict:
        return {"low": self.low.tolist(), "high": self.high.tolist(), "bins": self.bins, "chunk": self.chunk}

    def save(self, folder: str | Path) -> None:
        (Path(folder) / CODEC_FILE).write_text(json.dumps(self.state_dict(), indent=2))


def action_rows_seed(seed: int) -> int:
    """The generator seed of the new action-token rows for run seed `seed`: a hash, not `seed` itself, because other
    streams start from `torch.Generator().manual_seed(seed)` (the cold start's batches), whose first draws the rows'
    perturbations would otherwise be)."""
    return stream_seed("action-token rows", seed)


def add_action_tokens(
    policy, low: torch.Tensor, high: torch.Tensor, bins: int = 256, chunk: int = 1, seed: int = 0
) -> ActionCodec:
    """Give `policy` an action codec: add K action tokens to its tokenizer and model (if absent) and attach it.

    The policy then generates exactly C*D tokens per call, restricted to the action tokens, and scores them under
    the same restriction (see `VLMPolicy.action_codec`).

    New embedding rows are drawn around the mean of the existing ones (transformers' `mean_resizing`) from a
    generator seeded from `seed` (`action_rows_seed`), not from torch's global one, which torch seeds at random in
    every process: the K rows differ from each other only by that draw, so unseeded, two runs of the same config
    started their action tokens differently (the reach preset's cold start then ranged 0.42-0.96 on one data size).

    Returns:
        The codec, also set as `policy.action_codec`.
    """
    tok = policy.processor.tokenizer
    names = [action_token(k) for k in range(bins)]
    vocab = tok.get_vocab()
    present = [n in vocab for n in names]
    if any(present) and not all(present):
        raise ValueError("the tokenizer holds some action tokens but not all: it was made with another bin count")
    if not all(present):
        tok.add_tokens(names, special_tokens=True)
        embeddings = policy.model.get_input_embeddings()
        if len(tok) > embeddings.num_embeddings:
            # New rows start at the mean of the existing embeddings (transformers' mean_resizing), not at noise.
            device = embeddings.weight.device
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(action_rows_seed(seed))
                policy.model.resize_token_embeddings(len(tok), mean_resizing=True)
    ids = tok.convert_tokens_to_ids(names)
    codec = ActionCodec(low, high, ids, chunk=chunk)
    policy.action_codec = codec
    return codec


def load_action_codec(policy, folder: str | Path) -> ActionCodec | None:
    """Attach the codec saved in `folder` (by a VLA's `save_pretrained`) to `policy`; None if there is none."""
    path = Path(folder) / CODEC_FILE
    if not path.exists():
        return None
    spec = json.loads(path.read_text())
    return add_action_tokens(
        policy, torch.tensor(spec["low"]), torch.tensor(spec["high"]), bins=spec["bins"], chunk=spec["chunk"]
    )
