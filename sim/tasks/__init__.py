"""Synthetic visual tasks and datasets on disk. Importing this package registers them in `sim.ENVS`."""

from sim.tasks.dataset import DatasetEnv
from sim.tasks.grounding import GroundingEnv
from sim.tasks.jigsaw import JigsawEnv
from sim.tasks.maze import MazeEnv
from sim.tasks.questions import ShapeQuestionsEnv

__all__ = ["DatasetEnv", "GroundingEnv", "JigsawEnv", "MazeEnv", "ShapeQuestionsEnv"]
