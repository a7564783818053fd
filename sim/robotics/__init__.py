"""Robotics simulators behind the `VecEnv` contract. Importing this package registers their envs in `sim.ENVS`.

* `mujoco_tasks`: our own planar MuJoCo tasks, `reach` and `push` (scenes in `assets/mjcf/`).
* `gym_mujoco`: Gymnasium's MuJoCo envs (`Reacher-v5`, `Pusher-v5`, ...) as one batched env, `gym_mujoco`.

Nothing here imports `mujoco` or `gymnasium` at module level: they are imported when an env is built, so
`import sim` works without the `robotics` extra and only building one of these envs needs it.
"""

from sim.robotics.gym_mujoco import GymMujocoEnv
from sim.robotics.mujoco_tasks import PushEnv, ReachEnv

# ManiSkill 3 adapter: `from sim.robotics.maniskill import ...` goes here once sim/robotics/maniskill.py exists.

__all__ = ["GymMujocoEnv", "PushEnv", "ReachEnv"]
