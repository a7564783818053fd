"""Robotics simulators behind the `VecEnv` contract. Importing this package registers their envs in `sim.ENVS`.

* `planar` (the shared base), `reach`, `push`: our own planar MuJoCo tasks (scenes in `sim/robotics/mjcf/`).
* `maniskill`: ManiSkill 3 tasks that need no asset download (`make setup-maniskill` installs it and a Vulkan driver).
* `libero`: LIBERO's suites, served from LIBERO's own environment (`make setup-libero`) by worker processes.
* `gym_mujoco`: Gymnasium's MuJoCo envs (`Reacher-v5`, `Pusher-v5`, ...) as one batched env, `gym_mujoco`.

Nothing here imports `mujoco` or `gymnasium` at module level: they are imported when an env is built, so
`import sim` works without the `robotics` extra and only building one of these envs needs it.
"""

from sim.robotics.gym_mujoco import GymMujocoEnv
from sim.robotics.libero import LiberoEnv
from sim.robotics.maniskill import ManiSkillEnv
from sim.robotics.push import PushEnv
from sim.robotics.reach import ReachEnv

__all__ = ["GymMujocoEnv", "LiberoEnv", "ManiSkillEnv", "PushEnv", "ReachEnv"]
