"""Rewards in YAML for any text env: its own reward and registered rewards, weighted into one.

    env:
      name: grounding
      rewards:
        - {name: env, weight: 1.0}                  # the env's own reward ("env" is this name, reserved)
        - {name: think_answer_format, weight: 0.2}  # DeepSeek-R1's <think>...</think><answer>...</answer> format
        - {name: box_giou, weight: 0.5}             # another view of the same target box

`sim.make(name, num_envs, rewards=[...], **options)` wraps the env in `MixedRewards`. Every entry but `env` names a
reward registered in `rewards.REWARDS` (`mmrl rewards` lists them), with its options under `kwargs`; each is called
on the N answers with the targets the env exposes (`reward_targets()`: `target_box` for grounding, GUI and dataset
worlds; `answer` and `target_boxes` for dataset records) and two that every env has: `image`, the `[N, H, W, 3]`
observation the answers were written for, and `instruction`. A reward that needs a target the env does not have is
an error when the env is built, naming the reward, the target and what the env gives.

The total is `rewards.combine` of the components, the env's own reward being the component `env`: the weighted sum,
where a reward that does not apply to a world (its target is missing there: NaN) is left out of that world's sum and
the others are scaled up to the full weight. Leaving `env` out of the list replaces the env's reward by the mix.
Every component is logged unweighted as `reward/<name>`, next to the env's own components. A registered reward the
env already scores itself (the dataset env's `box_iou`) is an error while `env` is in the mix (it would count twice);
without `env`, the mix's score replaces the env's. A world no listed reward applies to is an error naming
`env.rewards`, never a silent 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from rewards import REWARDS
from rewards.combine import RewardSpec, build_reward_fns, combine

from .base import Observation, StepResult, check_text_actions

ENV_REWARD = "env"  # the name of the env's own reward in a mix
ALWAYS_TARGETS = ("image", "instruction")  # what every env can hand a reward: the observation answered


class MixedRewards:
    """A text env whose reward is a weighted mix of its own and registered rewards (see the module docstring).

    Every other attribute (`expert_action`, `target_boxes`, `image_size`, ...) is the wrapped env's.

    Args:
        env: a text env (`action_kind == "text"`).
        rewards: `{name, weight?, kwargs?}` entries; `name: env` is the env's own reward.

    Raises:
        ValueError: a continuous-action env, an empty list, an unknown reward or key, a name listed twice, or a
            reward that needs a target the env does not expose. Messages start with `env.rewards`.
    """

    def __init__(self, env: Any, rewards: Sequence[Mapping[str, Any]]):
        name = type(env).__name__
        if env.action_kind != "text":
            raise ValueError(f"env.rewards: {name} takes continuous actions; rewards in YAML score text answers")
        if isinstance(rewards, Mapping) or not rewards:
            raise ValueError("env.rewards must be a non-empty list of {name, weight, kwargs} entries")
        try:
            specs = [RewardSpec.from_dict(entry) for entry in rewards]
            listed = [spec.name for spec in specs]
            twice = sorted({n for n in listed if listed.count(n) > 1})
            if twice:
                raise ValueError(f"{twice} listed twice")
            unknown = [n for n in listed if n != ENV_REWARD and n not in REWARDS]
            if unknown:
                raise ValueError(
                    f"unknown reward(s) {unknown}; registered: {', '.join(REWARDS.names())} (and {ENV_REWARD!r}, "
                    "the env's own)"
                )
            self.fns = build_reward_fns([spec for spec in specs if spec.name != ENV_REWARD])
        except ValueError as error:
            raise ValueError(f"env.rewards: {error}") from None
        self.weights = {spec.name: spec.weight for spec in specs}
        gives = tuple(getattr(env, "reward_target_names", ())) + ALWAYS_TARGETS
        for reward, fn in self.fns.items():
            missing = [target for target in fn.required if target not in gives]
            if missing:
                raise ValueError(
                    f"env.rewards: {reward!r} needs {missing}, which {name} does not give; it gives: {', '.join(gives)}"
                )
        self.env = env
        self.num_envs = env.num_envs
        self.action_kind = env.action_kind
        self.max_episode_steps = env.max_episode_steps
        self._obs: Observation | None = None

    def __getattr__(self, attr: str) -> Any:
        if attr == "env":  # not set yet (a failed __init__, unpickling): no recursion
            raise AttributeError(attr)
        return getattr(self.env, attr)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self.env)))

    @property
    def unwrapped(self) -> Any:
        return getattr(self.env, "unwrapped", self.env)

    def reset(self, seed: int | Sequence[int], env_ids: Sequence[int] | None = None) -> Observation:
        self._obs = self.env.reset(seed=seed, env_ids=env_ids)
        return self._obs

    def step(self, actions: list[str]) -> StepResult:
        """Step the env and replace its reward by the mix; components are added to `info["reward_components"]`."""
        texts = check_text_actions(actions, self.num_envs, type(self.env).__name__)
        if self._obs is None:
            raise RuntimeError("reset the env before stepping it")
        targets: dict[str, Any] = {"image": self._obs.image, "instruction": list(self._obs.instruction)}
        if hasattr(self.env, "reward_targets"):
            targets.update(self.env.reward_targets())  # the targets of the worlds answered, before they move on
        result = self.env.step(texts)
        own = dict(result.info.get("reward_components", {}))
        components = {reward: fn(texts, **targets).float().cpu() for reward, fn in self.fns.items()}  # each [N]
        clash = sorted(set(components) & set(own))
        if clash and ENV_REWARD in self.weights:  # (without `env` the mix's component replaces the env's)
            raise ValueError(
                f"env.rewards: {clash} already score(s) this env as its own reward; weight it through "
                f"{{name: {ENV_REWARD}}} instead"
            )
        mix = dict(components)
        if ENV_REWARD in self.weights:
            mix[ENV_REWARD] = result.reward.detach().float().cpu()
        total = combine(mix, self.weights)  # [N]
        undefined = torch.isnan(total).nonzero().squeeze(-1).tolist()
        if undefined:
            raise ValueError(
                f"env.rewards: no listed reward applies to world(s) {undefined} (their targets are missing); "
                f"add {{name: {ENV_REWARD}}} or a reward those worlds have a target for"
            )
        info = dict(result.info)
        info["reward_components"] = {**own, **{k: torch.nan_to_num(v, nan=0.0) for k, v in components.items()}}
        self._obs = result.obs
        return replace(result, reward=total.to(device=result.reward.device, dtype=result.reward.dtype), info=info)

    def close(self) -> None:
        self.env.close()

    def __repr__(self) -> str:
        return f"MixedRewards({self.env!r}, weights={self.weights})"
