"""Environments: N batched worlds with image observations and text or continuous actions.

>>> import sim
>>> env = sim.make("grounding", num_envs=4, image_size=64)
>>> obs = env.reset(seed=0)
>>> obs.image.shape
torch.Size([4, 64, 64, 3])

`import sim` needs only torch, pillow and numpy; heavier simulators are imported inside their adapters.
"""

from __future__ import annotations

from sim import driving, gui, render, robotics, tasks  # noqa: F401  (registers the built-in envs; simulators are imported lazily)
from sim.base import Observation, StepResult, VecEnv
from sim.check import check_vec_env
from sim.registry import ENVS, make

__all__ = ["ENVS", "Observation", "StepResult", "VecEnv", "check_vec_env", "make"]
