"""The critic: a value head on the policy's own hidden state, with its optimiser.

`algo.advantage: gae` builds one. It reads the final hidden state the policy's language-model head sees (a forward
hook on `get_output_embeddings()`, so any model class works, sharded or with LoRA) at the last prompt position: the
state a generation starts from, with its image. One value per row, so one per turn (a text answer, a GUI action, a
VLA action chunk); `mmrl.algos.critic` turns them into GAE advantages. A model that carries a `value_tap` (a flow
policy, `mmrl.policy.flow`: it has no language-model head) is read there instead: the tap receives `[r, 1, F]` state
features on each scoring pass, the same layout.

The head is float32 and small (`algo.critic.hidden` units, or a linear probe with 0), replicated in every process
(its gradients averaged over processes), with its own AdamW at `algo.critic.lr`. With `algo.critic.time` the head also
reads the share of the episode's turns still to come, `(T - t) / T`: under a time limit the return-to-go depends on
it, and the prompt state does not show it (Pardo et al. 2018, "Time Limits in Reinforcement Learning",
https://arxiv.org/abs/1712.00378, time-aware value functions). With `algo.critic.trunk_grad` the
value loss also trains the policy's trunk (a shared actor-critic); by default the trunk's features are detached, so
the critic never moves the policy, which is also what the warm-up (`algo.critic.warmup_steps`: the head trains, the
policy does not) needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from sim.seeds import critic_seed

from ..runtime.distributed import World


class ValueHead(nn.Module):
    """`[r, H]` hidden states (and `[r, E]` extra features) -> `[r]` values; the last layer starts at zero, so every
    value starts at 0."""

    def __init__(self, hidden_size: int, width: int, seed: int, extra: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        inputs = hidden_size + extra
        layers: list[nn.Module] = []
        if width > 0:
            first = nn.Linear(inputs, width)
            with torch.no_grad():  # the hidden state's columns share a unit of gain; each extra feature has one
                weight = torch.randn(width, inputs, generator=generator)
                first.weight.copy_(torch.cat([weight[:, :hidden_size] / hidden_size**0.5, weight[:, hidden_size:]], 1))
                first.bias.zero_()
            layers += [first, nn.Tanh()]
        last = nn.Linear(width or inputs, 1)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.net = nn.Sequential(*layers, last)

    def forward(self, hidden: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        hidden = hidden.float()
        if extra is not None:
            hidden = torch.cat([hidden, extra.to(hidden)], dim=-1)
        return self.net(hidden).squeeze(-1)


def turns_left(turn: torch.Tensor, turns: int) -> torch.Tensor:
    """`[r, 1]` the share of an episode's `turns` still to come at each row's `turn` (0-based): 1 at the first."""
    return ((turns - turn).float() / turns).unsqueeze(-1)


class Critic:
    """The value head, its optimiser, and the hook that reads the policy's hidden state. `seed` is the run's
    (`trainer.seed`): the head's initial weights draw from its own stream (`sim.seeds.critic_seed`).

    Args:
        tap: the module whose input (at position 0) is the row's state (`Policy.value_input`: a VLM's
            language-model head, a flow policy's `value_tap`).
    """

    def __init__(
        self, tap: nn.Module, *, width: int, lr: float, trunk_grad: bool, seed: int, device: str, time: bool = False
    ):
        self.lm_head = tap
        hidden_size = (
            self.lm_head.in_features if hasattr(self.lm_head, "in_features") else self.lm_head.weight.shape[1]
        )
        self.time = time  # the head also reads `turns_left`
        self.head = ValueHead(hidden_size, width, critic_seed(seed), extra=int(time)).to(device)
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

    def values(self, train_trunk: bool = False, turns_left: torch.Tensor | None = None) -> torch.Tensor:
        """`[r]` the values of the last forward pass read; gradients reach the trunk only with `train_trunk`. A
        time-aware head (`time`) needs each row's `turns_left` (`[r, 1]`, from the function of that name)."""
        if self._seen is None:
            raise RuntimeError("no hidden state read: score the policy inside `with critic.reading():` first")
        if self.time and turns_left is None:
            raise ValueError("a time-aware critic needs each row's turns_left")
        hidden, self._seen = self._seen, None
        hidden = hidden if train_trunk and self.trunk_grad else hidden.detach()
        return self.head(hidden, turns_left.to(hidden.device) if self.time else None)

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
