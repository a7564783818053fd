"""One advantage per row, by the configured estimator (`algo.advantage`, `algo.credit`).

* **Episode credit** (default): each row gets its episode's advantage from the episode returns of every process's
  groups (`mmrl.algos.ADVANTAGES`: GRPO, Dr. GRPO, RLOO, REINFORCE++ baselines). Branch credit is episode credit on
  rows of which only the branch turn's keep a completion mask (`mmrl.stages.rollout`).
* **Step credit** (`algo.credit: step`): each row gets its turn's advantage against the same turn of the group's other
  worlds (`mmrl.algos.STEP_ADVANTAGES`, GiGPO's anchor states).
* **A critic's estimator** (`mmrl.algos.CRITIC_ADVANTAGES`: GAE): each row gets its turn's advantage from the values of
  the rows' starting states, whitened over the batch of every process with `algo.scale_by_std` (mean 0, unbiased
  standard deviation 1, as the group estimators and verl's `masked_whiten` scale); the critic's targets come back too.
"""

from __future__ import annotations

import torch

from .. import algos
from ..algos.data import discounted_returns
from ..runtime import distributed
from ..runtime.config import AlgoConfig
from ..types import Episodes


def row_advantages(
    episodes: Episodes, ac: AlgoConfig, world: distributed.World, values: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`[M]` the advantage of every row (generation) of `episodes`, and with a critic the `[M]` value targets (else
    None). `values` are the critic's `[M]` values of the rows' starting states (needed by a critic's estimator)."""
    if ac.advantage in algos.CRITIC_ADVANTAGES:
        if values is None:
            raise ValueError(f"algo.advantage={ac.advantage} needs the critic's values of the rows")
        grid = torch.zeros_like(episodes.step_rewards)  # [R, T] the value of each turn's starting state
        grid[episodes.world, episodes.turn] = values.to(grid.dtype)
        gae = algos.CRITIC_ADVANTAGES.get(ac.advantage)
        turn_advantages, turn_returns = gae(
            episodes.step_rewards, grid, episodes.active, gamma=ac.gamma, lam=ac.critic.gae_lambda
        )
        advantages = turn_advantages[episodes.world, episodes.turn]
        if ac.scale_by_std:
            advantages = whitened(advantages, world)
        return advantages, turn_returns[episodes.world, episodes.turn]
    if ac.credit == "step":
        returns = discounted_returns(episodes.step_rewards, episodes.dones, ac.gamma)  # [R, T] returns-to-go
        step_fn: algos.StepAdvantageFn = algos.STEP_ADVANTAGES.get(ac.advantage)
        turn_advantages = step_fn(
            returns, episodes.active, group_size=ac.group_size, scale_by_std=ac.scale_by_std,
            state_keys=episodes.state_keys, step_weight=ac.gigpo_step_weight,
        )  # fmt: skip
        return turn_advantages[episodes.world, episodes.turn], None
    advantage_fn: algos.AdvantageFn = algos.ADVANTAGES.get(ac.advantage)
    returns, first = world.gather_rows(episodes.returns(ac.gamma))  # [R of every process], where ours start
    advantages = advantage_fn(returns, group_size=ac.group_size, scale_by_std=ac.scale_by_std)
    return advantages[first : first + episodes.num_worlds][episodes.world], None


def whitened(x: torch.Tensor, world: distributed.World, eps: float = 1e-6) -> torch.Tensor:
    """`x` (`[M]`, this process's rows) minus the mean of every process's rows, over their unbiased standard deviation
    (`torch.std`'s, which the group estimators use): one process gives `(x - x.mean()) / (x.std() + eps)`."""
    count = world.sum(torch.tensor(float(len(x))))
    mean = world.sum(x.sum()) / count
    var = world.sum((x - mean).square().sum()) / (count - 1).clamp(min=1)
    return (x - mean) / (var.sqrt() + eps)


def critic_metrics(values: torch.Tensor, returns: torch.Tensor, world: distributed.World, warming: bool) -> dict:
    """The critic's step-level figures over every process's rows: mean value, explained variance, warm-up."""
    values, _ = world.gather_rows(values.float())
    returns, _ = world.gather_rows(returns.float())
    return {
        "critic/value_mean": values.mean(), "critic/return_mean": returns.mean(),
        "critic/explained_variance": algos.explained_variance(values, returns), "critic/warmup": float(warming),
    }  # fmt: skip
