"""The contract checker passes a correct toy env and catches each deliberately broken variant of it."""

import pytest
import torch

from sim import Observation, StepResult, check_vec_env
from sim.base import resolve_seeds


class ToyEnv:
    """A minimal correct text env: world k's image is noise drawn from its own seed."""

    action_kind = "text"
    max_episode_steps = 1

    def __init__(self, num_envs: int = 4, image_size: int = 8):
        self.num_envs = num_envs
        self.image_size = image_size
        self._images = torch.zeros(num_envs, image_size, image_size, 3, dtype=torch.uint8)  # [N, H, W, 3]
        self._seeds = [0] * num_envs
        self._reward = torch.zeros(num_envs)  # [N]

    def _draw(self, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(0, 256, (self.image_size, self.image_size, 3), generator=gen, dtype=torch.uint8)

    def _reset_world(self, i: int, seed: int) -> None:
        self._images[i] = self._draw(seed)
        self._seeds[i] = seed

    def reset(self, seed, env_ids=None):
        ids = list(range(self.num_envs)) if env_ids is None else list(env_ids)
        for i, world_seed in zip(ids, resolve_seeds(seed, len(ids))):
            self._reset_world(i, world_seed)
        return self._observation()

    def _observation(self) -> Observation:
        return Observation(image=self._images.clone(), instruction=[f"world {s}" for s in self._seeds])

    def _rewards(self, actions) -> torch.Tensor:
        self._reward[:] = torch.tensor([float(len(a)) for a in actions])
        return self._reward.clone()  # [N]

    def step(self, actions):
        reward = self._rewards(actions)
        n = self.num_envs
        info = {"reward_components": {"length": reward.clone()}, "reasons": [""] * n}
        return StepResult(
            self._observation(), reward, torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool), info
        )

    def close(self) -> None:
        pass


class ImageViewEnv(ToyEnv):
    """Returns its image buffer itself (ManiSkill PR #828)."""

    def _observation(self):
        return Observation(image=self._images, instruction=[f"world {s}" for s in self._seeds])


class RewardViewEnv(ToyEnv):
    """Returns its reward buffer itself."""

    def _rewards(self, actions):
        self._reward[:] = torch.tensor([float(len(a)) for a in actions])
        return self._reward


class FixedSeedEnv(ToyEnv):
    """Ignores the seed it is given: every reset draws the same worlds."""

    def _reset_world(self, i, seed):
        super()._reset_world(i, i)


class GlobalRngEnv(ToyEnv):
    """Ignores the seed and draws from one generator that keeps running: the same seed gives new worlds."""

    def __init__(self, num_envs=4, image_size=8):
        super().__init__(num_envs, image_size)
        self._gen = torch.Generator().manual_seed(0)

    def _draw(self, seed):
        return torch.randint(0, 256, (self.image_size, self.image_size, 3), generator=self._gen, dtype=torch.uint8)


class LeakyPartialResetEnv(ToyEnv):
    """A partial reset redraws every world, not only those in env_ids."""

    def reset(self, seed, env_ids=None):
        ids = list(range(self.num_envs)) if env_ids is None else list(env_ids)
        seeds = resolve_seeds(seed, len(ids))
        for i in range(self.num_envs):
            self._reset_world(i, seeds[0] + i)
        return self._observation()


class FloatImageEnv(ToyEnv):
    def _observation(self):
        obs = super()._observation()
        return Observation(image=obs.image.float(), instruction=obs.instruction)


class TransposedImageEnv(ToyEnv):
    """Channels-first images in disguise: a [N, H, W, 3] tensor that is a permuted, non-contiguous view."""

    def _observation(self):
        obs = super()._observation()
        chw = obs.image.permute(0, 3, 1, 2).contiguous()  # [N, 3, H, W]
        return Observation(image=chw.permute(0, 2, 3, 1), instruction=obs.instruction)


class ShortInstructionEnv(ToyEnv):
    def _observation(self):
        obs = super()._observation()
        return Observation(image=obs.image, instruction=obs.instruction[:-1])


class DoubleRewardEnv(ToyEnv):
    """Reward of shape [N, 1] in float64."""

    def _rewards(self, actions):
        return super()._rewards(actions).double().unsqueeze(-1)


class BadInfoEnv(ToyEnv):
    def step(self, actions):
        result = super().step(actions)
        info = dict(result.info, reward_components={"length": result.reward[:1].clone()})
        return StepResult(result.obs, result.reward, result.terminated, result.truncated, info)


class ContinuousToyEnv(ToyEnv):
    action_kind = "continuous"
    max_episode_steps = 5
    action_dim = 2

    def _rewards(self, actions):
        assert actions.shape == (self.num_envs, self.action_dim)
        return -actions.pow(2).sum(-1).float()


class ContinuousNoDimEnv(ContinuousToyEnv):
    action_dim = None


@pytest.mark.parametrize("cls", [ToyEnv, ContinuousToyEnv])
@pytest.mark.parametrize("num_envs", [1, 4])
def test_correct_toy_envs_pass(cls, num_envs):
    check_vec_env(cls(num_envs=num_envs), seed=3)


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (ImageViewEnv, "sharing memory|view"),
        (RewardViewEnv, "sharing memory|view"),
        (FixedSeedEnv, "is the seed ignored"),
        (GlobalRngEnv, "twice gave different images"),
        (LeakyPartialResetEnv, r"reset\(env_ids=\[1\]\) changed the image of world 0"),
        (FloatImageEnv, "must be uint8"),
        (TransposedImageEnv, "contiguous"),
        (ShortInstructionEnv, "list of 4 strings"),
        (DoubleRewardEnv, "reward must be torch.float32"),
        (BadInfoEnv, r"info\['reward_components'\]\['length'\] must have leading dim N=4"),
        (ContinuousNoDimEnv, "action_dim"),
    ],
)
def test_broken_envs_are_caught(cls, message):
    with pytest.raises(AssertionError, match=message):
        check_vec_env(cls(num_envs=4), seed=0)


def test_image_view_is_caught_by_mutation_alone():
    """Even with the storage check fooled, writing into a returned image must not show up in later observations."""

    class SneakyViewEnv(ImageViewEnv):
        # Fresh storage each reset keeps data_ptr checks quiet, but the returned tensor is still the live buffer.
        def reset(self, seed, env_ids=None):
            self._images = self._images.clone()
            return super().reset(seed, env_ids)

    with pytest.raises(AssertionError, match="writing into the image returned by reset"):
        check_vec_env(SneakyViewEnv(num_envs=4), seed=0)
