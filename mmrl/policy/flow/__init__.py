"""The flow policy kind: transformers' π0 behind the policy interface (Flow-SDE / Flow-Noise sampling, ODE greedy)."""

from .policy import *  # noqa: F403
