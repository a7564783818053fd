"""The proprioceptive state: what the robot knows of itself, apart from the privileged `state`."""

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("MUJOCO_GL", "egl")
pytest.importorskip("mujoco")

from sim import Observation, check_vec_env  # noqa: E402
from sim.robotics.push import PushEnv  # noqa: E402
from sim.robotics.reach import ReachEnv  # noqa: E402
from tests.sim.test_check import ToyEnv  # noqa: E402


def test_select_keeps_each_worlds_proprio():
    obs = Observation(
        image=torch.zeros(3, 4, 4, 3, dtype=torch.uint8),
        instruction=["a", "b", "c"],
        proprio=torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]),
    )
    picked = obs.select([2, 0])
    torch.testing.assert_close(picked.proprio, torch.tensor([[4.0, 5.0], [0.0, 1.0]]))
    picked.proprio.add_(1)  # a copy: the original is untouched
    assert obs.proprio[2, 0] == 4.0
    assert Observation(image=obs.image, instruction=obs.instruction).select([0]).proprio is None


@pytest.mark.parametrize("cls", [ReachEnv, PushEnv])
def test_proprio_is_the_grippers_position_and_velocity_never_the_targets(cls):
    env = cls(num_envs=2)
    obs = env.reset(seed=5)
    assert obs.proprio.dtype == torch.float32 and obs.proprio.shape == (2, 4)
    np.testing.assert_allclose(obs.proprio[:, :2].numpy(), env.gripper_xy, atol=1e-6)
    torch.testing.assert_close(obs.proprio[:, 2:], torch.zeros(2, 2))  # at rest after a reset
    # The privileged state holds the target (reach) or the block and goal (push); proprio holds none of it.
    hidden = obs.state[:, 2:4]
    assert not any(torch.allclose(obs.proprio[:, k : k + 2], hidden, atol=1e-3) for k in (0, 2))
    before = env.gripper_xy
    result = env.step(torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
    np.testing.assert_allclose(result.obs.proprio[:, :2].numpy(), env.gripper_xy, atol=1e-6)
    moved = env.gripper_xy - before  # [N, 2]
    velocity = result.obs.proprio[:, 2:].numpy()
    # The servo is still moving the gripper the way it was told (its speed decays to ~0 by the step's end).
    assert np.all(np.sign(velocity[np.abs(moved) > 1e-3]) == np.sign(moved[np.abs(moved) > 1e-3]))
    env.close()


class WrongProprioEnv(ToyEnv):
    """Hands out a proprioceptive state without the world dimension."""

    def _observation(self):
        return Observation(self._images.clone(), [f"world {s}" for s in self._seeds], proprio=torch.zeros(3))


class IntegerProprioEnv(ToyEnv):
    def _observation(self):
        n = self.num_envs
        return Observation(self._images.clone(), [f"world {s}" for s in self._seeds], proprio=torch.zeros(n, 2).long())


class RandomProprioEnv(ToyEnv):
    """A proprioceptive state drawn from the global generator: not a function of the seed."""

    def _observation(self):
        n = self.num_envs
        return Observation(self._images.clone(), [f"world {s}" for s in self._seeds], proprio=torch.randn(n, 2))


@pytest.mark.parametrize(
    ("cls", "message"),
    [(WrongProprioEnv, "obs.proprio must be None or a"), (IntegerProprioEnv, "float"),
     (RandomProprioEnv, "twice gave different obs.proprio")],
)  # fmt: skip
def test_the_contract_check_catches_a_bad_proprio(cls, message):
    with pytest.raises(AssertionError, match=message):
        check_vec_env(cls(num_envs=4))
