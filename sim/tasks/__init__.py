"""Synthetic visual tasks. Importing this package registers every built-in task in `sim.ENVS`."""

from sim.tasks.grounding import GroundingEnv

__all__ = ["GroundingEnv"]
