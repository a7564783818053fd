"""Driving simulators behind the `VecEnv` contract. Importing this package registers their envs in `sim.ENVS`.

* `highway`: highway-env's scenarios (`highway-fast-v0`, `merge-v0`, `roundabout-v0`, `intersection-v0`) as one
  batched env, `highway`, with text meta-actions (or continuous control) and CaRL / VLM-RL / highway-env rewards.
  Its text answers (the meta-actions, named or by letter) are parsed in `actions`.

Nothing here imports `highway_env`, `gymnasium` or `pygame` at module level: they are imported when an env is built,
so `import sim` works without the `driving` extra and only building one of these envs needs it.
"""

from sim.driving.actions import parse_meta_action
from sim.driving.highway import HighwayEnv

__all__ = ["HighwayEnv", "parse_meta_action"]
