"""The ManiSkill 3 adapter on CPU: worker processes, camera images through software Vulkan, the VecEnv contract.

Camera images need a software Vulkan driver (scripts/setup_vulkan.sh). Where it is missing these tests fail and
say so: a skip would hide that the robotics envs cannot render on this machine.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from collections.abc import Iterator

import pytest
import torch

# Not importorskip: `import mani_skill` imports mujoco, which would then pick GLFW for the whole test session and break
# the MuJoCo envs' offscreen rendering. The adapter imports mani_skill in its worker processes only.
if importlib.util.find_spec("mani_skill") is None:
    pytest.skip(
        "mani-skill is not installed (`make test` installs it where apt and pip can get it)", allow_module_level=True
    )

from sim import check_vec_env  # noqa: E402
from sim.robotics.maniskill import SETUP_HINT, TASKS, ManiSkillEnv  # noqa: E402


@pytest.fixture(scope="module")
def scratch_env_vars(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """ManiSkill's asset folder in a temporary folder (HOME and XDG_CACHE_HOME already are, see conftest.py)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MS_ASSET_DIR", str(tmp_path_factory.mktemp("maniskill")))
        yield


@pytest.fixture(scope="module")
def pick_cube(scratch_env_vars: None) -> Iterator[ManiSkillEnv]:
    env = ManiSkillEnv(num_envs=2, task="PickCube-v1", image_size=32, backend="cpu", timeout_s=180)
    try:
        yield env
    finally:
        env.close()


def test_a_vulkan_driver_is_installed():
    # The env itself fails with the same hint when SAPIEN cannot render; this says it before any worker starts.
    chosen = [path for path in os.environ.get("VK_ICD_FILENAMES", "").split(os.pathsep) if path]
    drivers = chosen or glob.glob("/usr/share/vulkan/icd.d/lvp_icd*.json")
    assert drivers and all(os.path.exists(path) for path in drivers), (
        f"no Vulkan driver found (VK_ICD_FILENAMES={os.environ.get('VK_ICD_FILENAMES')!r}, no Mesa lavapipe ICD "
        f"in /usr/share/vulkan/icd.d): ManiSkill cannot render camera images; {SETUP_HINT}"
    )


def test_pick_cube_keeps_the_vec_env_contract(pick_cube: ManiSkillEnv):
    assert pick_cube.action_kind == "continuous"
    assert pick_cube.action_low.shape == pick_cube.action_high.shape == (pick_cube.action_dim,)
    assert pick_cube.action_low.dtype == torch.float32
    check_vec_env(pick_cube, seed=0)


def test_random_actions_give_finite_rewards_and_bool_success(pick_cube: ManiSkillEnv):
    obs = pick_cube.reset(seed=3)
    assert obs.image.shape == (2, 32, 32, 3) and obs.image.dtype == torch.uint8
    assert obs.image.float().std() > 1.0, "the camera image is blank: is rendering working?"
    assert obs.state is not None and obs.state.dtype == torch.float32 and obs.state.shape[0] == 2
    assert obs.instruction == [TASKS["PickCube-v1"]] * 2
    gen = torch.Generator().manual_seed(0)
    low, high = pick_cube.action_low, pick_cube.action_high
    for _ in range(4):
        actions = low + (high - low) * torch.rand(2, pick_cube.action_dim, generator=gen)  # [N, D]
        result = pick_cube.step(actions)
        assert torch.isfinite(result.reward).all()
        assert result.info["success"].dtype == torch.bool and result.info["success"].shape == (2,)
        components = result.info["reward_components"]
        assert set(components) == {"dense", "normalized_dense", "success"}
        assert all(torch.isfinite(value).all() for value in components.values())
        # The default reward mode is ManiSkill's normalized dense reward.
        torch.testing.assert_close(result.reward, components["normalized_dense"])
    assert result.info["elapsed_steps"].tolist() == [4, 4]


def test_unknown_task_is_refused_with_the_supported_ones():
    with pytest.raises(ValueError, match="supported .*PickCube-v1"):
        ManiSkillEnv(num_envs=1, task="OpenCabinetDrawer-v1")


def test_ended_worlds_stay_frozen_until_reset(pick_cube: ManiSkillEnv):
    pick_cube.reset(seed=0)
    still = torch.zeros(2, pick_cube.action_dim)  # [N, D]: the arm holds still, so nothing succeeds
    for _ in range(pick_cube.max_episode_steps - 1):
        pick_cube.step(still)
    pick_cube.reset(seed=5, env_ids=[1])  # world 1 starts over, world 0 is one step from its time limit
    last = pick_cube.step(still)
    assert last.truncated.tolist() == [True, False]
    again = pick_cube.step(torch.ones(2, pick_cube.action_dim))
    assert torch.equal(again.obs.image[0], last.obs.image[0]) and torch.equal(again.obs.state[0], last.obs.state[0])
    assert again.reward[0] == 0 and again.truncated.tolist() == [True, False]
    assert again.info["elapsed_steps"].tolist() == [pick_cube.max_episode_steps, 2]
    assert not torch.equal(again.obs.state[1], last.obs.state[1]), "world 1 did not move"


def test_a_dead_worker_is_named_instead_of_hanging(pick_cube: ManiSkillEnv):
    # Last in the file: it breaks the module's shared env (a failed pool stops all its workers).
    pick_cube.reset(seed=0)
    pick_cube._worlds._procs[1].kill()
    with pytest.raises(RuntimeError, match=r"ManiSkill worker 1 \(PickCube-v1, pid \d+\) during step died"):
        pick_cube.step(torch.zeros(2, pick_cube.action_dim))
    with pytest.raises(RuntimeError, match="closed"):
        pick_cube.reset(seed=0)
