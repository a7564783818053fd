"""A worlds class for tests/sim/test_subproc.py, loaded by file path in the worker (standard library and NumPy only).

Each world is a counter: reset sets it to the seed, a step adds the action's first entry; `sleep` stands for a
simulator that hangs, `crash` for one that dies.
"""

import os
import time

import numpy as np


class SlowWorlds:
    def __init__(self, num_envs: int, size: int = 8, fail_on_start: bool = False):
        if fail_on_start:
            raise ValueError("asked to fail on start")
        self.num_envs = num_envs
        self.size = size
        self.count = np.zeros(num_envs)
        self.was_reset = np.zeros(num_envs, bool)

    def describe(self) -> dict:
        return {"action_kind": "continuous", "max_episode_steps": 5, "action_dim": 1, "image_size": self.size}

    def _obs(self) -> dict:
        image = np.zeros((self.num_envs, self.size, self.size, 3), np.uint8)
        image[:] = (self.count % 256).astype(np.uint8)[:, None, None, None]
        return {
            "image": image,
            "instruction": [f"count {c:g}" for c in self.count],
            "state": self.count[:, None].copy(),
        }

    def reset(self, seeds: list, env_ids: list) -> dict:
        for seed, i in zip(seeds, env_ids):
            self.count[i] = seed
            self.was_reset[i] = True
        return self._obs()

    def step(self, actions) -> dict:
        if not self.was_reset.all():
            raise RuntimeError("step before reset")
        self.count += np.asarray(actions)[:, 0]
        return {
            "obs": self._obs(),
            "reward": self.count.astype(np.float32),
            "terminated": self.count > 100,
            "truncated": np.zeros(self.num_envs, bool),
            "info": {"success": self.count > 100, "task": ["count"] * self.num_envs},
        }

    def sleep(self, seconds: float) -> list:
        time.sleep(seconds)
        return [0] * self.num_envs

    def crash(self) -> None:
        os._exit(3)

    def pid(self) -> list:
        return [os.getpid()] * self.num_envs
