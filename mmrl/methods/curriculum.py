"""A simple curriculum over env difficulty: one env option stepped through a list of levels.

The option (e.g. `num_targets` or `max_shapes`) starts at the first level. With `promote_at` set, the run moves to
the next level once the training success rate (or mean reward where the env has no success), averaged over the
last `window` steps, reaches it; otherwise it moves every `steps_per_level` steps. Held-out evaluation always uses
the env options of the config, the final difficulty, so scores before and after training compare.
"""

from __future__ import annotations

from typing import Any

from ..runtime.config import CurriculumConfig


class Curriculum:
    """The current level of a `CurriculumConfig`, with a state dict for checkpoints."""

    def __init__(self, cfg: CurriculumConfig):
        self.cfg = cfg
        self.level = 0
        self.history: list[float] = []
        self.steps_at_level = 0

    @property
    def enabled(self) -> bool:
        return self.cfg.option is not None

    def options(self, base: dict[str, Any]) -> dict[str, Any]:
        """The env options for the current level."""
        return {**base, self.cfg.option: self.cfg.levels[self.level]} if self.enabled else dict(base)

    def update(self, score: float) -> bool:
        """Record one training step's score; True when the level changed (the env must be rebuilt)."""
        if not self.enabled or self.level == len(self.cfg.levels) - 1:
            return False
        self.history = (self.history + [score])[-self.cfg.window :]
        self.steps_at_level += 1
        if self.cfg.promote_at is not None:
            ready = (
                len(self.history) >= self.cfg.window and sum(self.history) / len(self.history) >= self.cfg.promote_at
            )
        else:
            ready = self.steps_at_level >= self.cfg.steps_per_level
        if ready:
            self.level += 1
            self.history, self.steps_at_level = [], 0
        return ready

    def state_dict(self) -> dict[str, Any]:
        return {"level": self.level, "history": list(self.history), "steps_at_level": self.steps_at_level}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.level, self.history, self.steps_at_level = state["level"], list(state["history"]), state["steps_at_level"]
