"""Naming rewards in a config, binding their options, and weighting their scores into one reward per row.

A config lists rewards by registered name:

    rewards: [{name: box_iou, weight: 1.0}, {name: format, weight: 0.1, kwargs: {require_answer_tag: true}}]

and a task turns that into scores:

>>> import torch
>>> specs = [RewardSpec("box_iou", 1.0), RewardSpec("format", 0.1)]
>>> fns = build_reward_fns(specs)
>>> completions = ["<answer>[0, 0, 10, 10]</answer>", "no idea"]
>>> targets = {"target_box": torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 5.0, 5.0]])}
>>> components = {name: fn(completions, **targets) for name, fn in fns.items()}  # each [R]
>>> combine(components, {s.name: s.weight for s in specs})
tensor([1.1000, 0.0000])
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from rewards.catalog import REWARDS

_COMPLETION_PARAMS = ("completions", "texts")  # the first parameter names of text-level rewards


class RewardFn(Protocol):
    """A reward as a task calls it: completions and every target the task has, in; `[R]` scores out.

    `build_reward_fns` returns these. Each one hands the registered function only the targets its signature names
    (so a task can pass all it has to every reward), with the spec's options bound. Scores are float `[R]`; NaN
    marks a row the reward does not apply to (its target is missing), and `combine` skips it.
    """

    def __call__(self, completions: list[str], /, **targets: Any) -> torch.Tensor: ...


@dataclass(frozen=True)
class RewardSpec:
    """One entry of a config's reward list.

    Attributes:
        name: a name registered in `REWARDS`; also the component's key (logged as `reward/<name>`).
        weight: its weight in `combine`.
        kwargs: options bound at build time (`iou_threshold`, `normalized_1000`, ...), by the function's names.
    """

    name: str
    weight: float = 1.0
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> RewardSpec:
        """A spec from a config mapping `{name, weight?, kwargs?}`; other keys are errors that name the key."""
        unknown = sorted(set(entry) - {"name", "weight", "kwargs"})
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in reward entry {dict(entry)}; allowed: name, weight, kwargs")
        if "name" not in entry:
            raise ValueError(f"reward entry {dict(entry)} has no name")
        return cls(str(entry["name"]), float(entry.get("weight", 1.0)), dict(entry.get("kwargs") or {}))


class BoundReward:
    """A registered reward function with its spec's options bound; implements `RewardFn`.

    A function whose first parameter is `completions` (or `texts`) gets the completions there; every other parameter
    is filled by name from the spec's kwargs, else from the call's targets. A function whose first parameter has
    another name (a tensor kernel such as an image similarity, `fn(images_a, images_b)`) reads no text: all its
    arguments come by name, so a task passes e.g. `images_a=renders, images_b=references` as targets.
    """

    def __init__(self, name: str, fn: Callable[..., torch.Tensor], kwargs: Mapping[str, Any]):
        self.name = name
        self.fn = fn
        self.kwargs = dict(kwargs)
        params = list(inspect.signature(fn).parameters.values())
        self.reads_completions = bool(params) and params[0].name in _COMPLETION_PARAMS
        if self.reads_completions:
            params = params[1:]
        self._takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        self.options = tuple(p.name for p in named)
        self.required = tuple(p.name for p in named if p.default is p.empty and p.name not in self.kwargs)
        unknown = sorted(k for k in self.kwargs if k not in self.options)
        if unknown and not self._takes_any:
            raise ValueError(
                f"reward {name!r} has no option(s) {unknown}; it takes: {', '.join(self.options) or 'nothing'}"
            )

    def __call__(self, completions: list[str], /, **targets: Any) -> torch.Tensor:
        picked = {k: v for k, v in targets.items() if k not in self.kwargs and (self._takes_any or k in self.options)}
        missing = [k for k in self.required if k not in picked]
        if missing:
            raise ValueError(
                f"reward {self.name!r} needs {missing}, as a target or in its spec's kwargs; "
                f"targets given: {sorted(targets) or 'none'}"
            )
        if self.reads_completions:
            scores = self.fn(completions, **self.kwargs, **picked)
        else:
            scores = self.fn(**self.kwargs, **picked)
        if not isinstance(scores, torch.Tensor) or scores.shape != (len(completions),):
            got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
            raise ValueError(f"reward {self.name!r} returned {got} for {len(completions)} completions, not [R]")
        return scores

    def __repr__(self) -> str:
        return f"BoundReward({self.name!r}, kwargs={self.kwargs})"


def build_reward_fns(specs: Iterable[RewardSpec | Mapping[str, Any]]) -> dict[str, RewardFn]:
    """Resolves reward specs (or their config mappings) to callables, in order.

    Args:
        specs: `RewardSpec`s, or mappings `{name, weight?, kwargs?}` as read from a config.

    Returns:
        name -> `RewardFn`.

    Raises:
        ValueError: An unknown name (the message lists the registered ones), an option the function does not take,
            or a name listed twice.
    """
    fns: dict[str, RewardFn] = {}
    for spec in specs:
        spec = spec if isinstance(spec, RewardSpec) else RewardSpec.from_dict(spec)
        if spec.name in fns:
            raise ValueError(f"reward {spec.name!r} is listed twice")
        if spec.name not in REWARDS:
            raise ValueError(f"unknown reward {spec.name!r}; registered: {', '.join(REWARDS.names())}")
        fns[spec.name] = BoundReward(spec.name, REWARDS.get(spec.name), spec.kwargs)
    return fns


def combine(components: Mapping[str, torch.Tensor], weights: Mapping[str, float]) -> torch.Tensor:
    """The weighted total of reward components, where NaN means "not applicable to this row".

    Per row, with A the components that apply (not NaN):

        total = sum_{k in A} w_k * c_k  *  sum_k |w_k| / sum_{k in A} |w_k|

    When every component applies this is the plain weighted sum, so a task that never uses NaN gets exactly
    `sum_k w_k * c_k`. When some do not, the applicable ones are scaled up to the full weight mass, so rows of a
    mixed batch (some with a box target, some with a text answer) are on the same scale instead of rows with fewer
    rewards being pushed down; the absolute values keep the scale well defined when a weight is negative.

    A row where no component with a non-zero weight applies is NaN: "no reward is defined here" is not the same as
    "scored 0", and a silent 0 would teach the policy that whatever it wrote was wrong. Callers drop or mask such
    rows (or fix the config that produced them).

    Args:
        components: name -> `[R]` scores, all the same shape.
        weights: name -> weight, for exactly the names in `components`.

    Returns:
        `[R]` float32 or wider.

    Raises:
        ValueError: No components, mismatched shapes, or names without weight / weights without component.
    """
    if not components:
        raise ValueError("combine needs at least one reward component")
    missing = sorted(set(components) - set(weights))
    extra = sorted(set(weights) - set(components))
    if missing or extra:
        raise ValueError(f"components without weight: {missing}; weights without component: {extra}")
    names = list(components)
    shapes = {name: tuple(components[name].shape) for name in names}
    if len(set(shapes.values())) != 1 or len(shapes[names[0]]) != 1:
        raise ValueError(f"reward components must all be [R], got {shapes}")
    first = components[names[0]]
    dtype = torch.promote_types(first.dtype, torch.float32)
    scores = torch.stack([components[name].to(dtype) for name in names], dim=-1)  # [R, K]
    w = torch.tensor([float(weights[name]) for name in names], dtype=dtype, device=scores.device)  # [K]
    applicable = ~torch.isnan(scores)  # [R, K]
    weighted = torch.where(applicable, scores * w, torch.zeros_like(scores)).sum(-1)  # [R]
    applicable_mass = (applicable * w.abs()).sum(-1)  # [R]
    defined = applicable_mass > 0
    scale = w.abs().sum() / torch.where(defined, applicable_mass, torch.ones_like(applicable_mass))  # [R]
    return torch.where(defined, weighted * scale, torch.full_like(weighted, float("nan")))  # [R]
