"""The critic: a value head on the policy's own hidden state, with its optimiser.

`algo.advantage: gae` builds one. It reads the final hidden state the policy's language-model head sees (a forward
hook on `get_output_embeddings()`, so any model class works, sharded or with LoRA) at the last prompt position: the
state a generation starts from, with its image. One value per row, so one per turn (a text answer, a GUI action, a
VLA action chunk); `mmrl.algos.critic` turns them into GAE advantages.

The head is float32 and small (`algo.critic_hidden` units, or a linear probe with 0), replicated in every process
(its gradients averaged over processes), with its own AdamW at `algo.critic_lr`. With `algo.critic_trunk_grad` the
value loss also trains the policy's trunk (a shared actor-critic); by default the trunk's features are detached, so
the critic never moves the policy, which is also what the warm-up (`algo.critic_warmup_steps`: the head trains, the
policy does not) needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from .distributed import World


class ValueHead(nn.Module):
    """`[r, H]` hidden states -> `[r]` values; the last layer starts at zero, so every value starts at 0."""

    def __init__(self, hidden_size: int, width: int, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        layers: list[nn.Module] = []
        if width > 0:
            first = nn.Linear(hidden_size, width)
            with torch.no_grad():
                first.weight.copy_(torch.randn(width, hidden_size, generator=generator) / hidden_size**0.5)
                first.bias.zero_()
            layers += [first, nn.Tanh()]
        last = nn.Linear(width or hidden_size, 1)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.net = nn.Sequential(*layers, last)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden.float()).squeeze(-1)


class Critic:
    """The value head, its optimiser, and the hook that reads the policy's hidden state."""

    def __init__(self, model: nn.Module, *, width: int, lr: float, trunk_grad: bool, seed: int, device: str):
        self.lm_head = model.get_output_embeddings()
        hidden_size = (
            self.lm_head.in_features if hasattr(self.lm_head, "in_features") else self.lm_head.weight.shape[1]
        )
        self.head = ValueHead(hidden_size, width, seed).to(device)
        self.optimizer = torch.optim.AdamW(self.head.parameters(), lr=lr)
        self.trunk_grad = trunk_grad
        self._seen: torch.Tensor | None = None

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Within it, each forward pass of the policy keeps its last prompt position's hidden state (`hidden()`)."""

        def keep(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            self._seen = args[0][:, 0]  # logits_to_keep = L + 1: position 0 is the last prompt token

        handle = self.lm_head.register_forward_hook(keep)
        try:
            yield
        finally:
            handle.remove()

    def values(self, train_trunk: bool = False) -> torch.Tensor:
        """`[r]` the values of the last forward pass read; gradients reach the trunk only with `train_trunk`."""
        if self._seen is None:
            raise RuntimeError("no hidden state read: score the policy inside `with critic.reading():` first")
        hidden, self._seen = self._seen, None
        return self.head(hidden if train_trunk and self.trunk_grad else hidden.detach())

    def step(self, world: World, max_norm: float) -> float:
        """Average the head's gradients over processes, clip them, step; returns the gradient norm before clipping."""
        params = [p for p in self.head.parameters() if p.grad is not None]
        if world.size > 1:
            for p in params:
                p.grad = world.sum(p.grad) / world.size
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def state_dict(self) -> dict[str, Any]:
        return {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
