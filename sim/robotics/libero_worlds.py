"""The worker side of the `libero` env (sim/robotics/libero.py): LIBERO worlds in LIBERO's own Python environment.

Loaded by `sim/serve.py` from this file alone inside `.venv-libero` (robosuite 1.4, mujoco < 3.9): it imports the
standard library, NumPy and LIBERO, never the project's packages, and speaks the worlds contract written in
`sim/serve.py` (NumPy in, NumPy out). The parent resolves seeds to episodes: each reset world gets an episode code
`task * 1000 + initial state`, one of the benchmark's fixed initial states of one task of the suite.

**A world** is one `OffScreenRenderEnv` (robosuite's OSC_POSE controller, delta actions, 20 Hz) holding one task;
resetting a world to another task rebuilds it (3-7 s), resetting it to the same task is a soft reset followed by the
fixed initial state (the hard reset rebuilds the whole simulator, 2-5 s, and gives the same state). After the initial
state, `settle_steps` no-op steps (gripper open) let the objects come to rest, as the papers' evaluation does.

**Cameras** are rendered here, only when an observation is returned (once per `step`, after `action_repeat` physics
steps), not by robosuite's observables at every physics step: a 128 px frame of LIBERO's 726k-vertex scenes costs
80-180 ms on a CPU, the physics step about 25 ms. Frames come upside down from MuJoCo's renderer (OpenGL's row order,
which robosuite keeps): `image_transform="upright"` flips the rows (the scene as the camera sees it); `"rot180"` turns
the raw frame by 180 degrees (rows and columns reversed: the upright frame mirrored left to right), the orientation of
the LIBERO datasets that OpenVLA and π0 checkpoints were trained on, which openpi's and RLinf's evaluations reproduce
with `img[::-1, ::-1]`.

**Proprioceptive state** (`proprio`, `[n, 8]`) is the vector π0's LIBERO checkpoints read (openpi's LIBERO example
and RLinf's LIBERO env build it alike): the end effector's position (robosuite's `robot0_eef_pos`, the grip site, m),
its orientation as an axis-angle vector (`robot0_eef_quat`, x y z w, through robosuite's `quat2axisangle`: axis times
angle, the angle `2 acos(w)` in [0, 2 pi]), and the two finger joints' positions (`robot0_gripper_qpos`), in that
order.

**Reward** `success`: 1 on the step that completes the task (the task's BDDL goal predicates, LIBERO's own check),
else 0. `shaped`: that plus `shaping_coef` times the step's change in a privileged progress potential (gripper near
the object, object lifted, object over its destination; each in [0, 1]); potential-based, so over an episode it adds
`shaping_coef * (final - initial potential)` and cannot make a failure outscore a success when `shaping_coef < 1`.
Both are logged as components (`success`, `progress`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

CAMERAS = {"agentview": "agentview", "wrist": "robot0_eye_in_hand"}
IMAGE_TRANSFORMS = ("upright", "rot180")
EPISODE_CODE = 1000  # episode code = task * EPISODE_CODE + initial state index
PROPRIO_DIM = 8  # end-effector position 3, axis-angle 3, finger joints 2


def quat2axisangle(quat: np.ndarray) -> np.ndarray:
    """robosuite's `transform_utils.quat2axisangle`, as openpi and RLinf call it: an (x, y, z, w) quaternion -> the
    axis-angle vector `[3]` (unit axis times the angle `2 acos(w)`; w is not made positive first, so the angle runs
    up to 2 pi and q and -q give different vectors for one rotation, exactly as the checkpoints were trained on)."""
    quat = np.array(quat, dtype=np.float64)
    quat[3] = min(max(quat[3], -1.0), 1.0)
    den = np.sqrt(1.0 - quat[3] * quat[3])
    if den == 0.0:  # robosuite's math.isclose(den, 0.0) (no absolute tolerance) holds for exactly 0 only
        return np.zeros(3)
    return quat[:3] * 2.0 * np.arccos(quat[3]) / den


def proprio_of(obs: dict) -> np.ndarray:
    """The 8-D proprioceptive state of a robosuite observation dict (see the module docstring), float32."""
    return np.concatenate(
        [obs["robot0_eef_pos"], quat2axisangle(obs["robot0_eef_quat"]), obs["robot0_gripper_qpos"]]
    ).astype(np.float32)


def _load_sibling(name: str):
    """A module of this folder, loaded by path (this file is loaded by path too, without its package)."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"mmrl_worlds_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class LiberoWorlds:
    """n LIBERO worlds of one suite in this process (see the module docstring)."""

    def __init__(
        self,
        num_envs: int,
        suite: str = "libero_spatial",
        image_size: int = 128,
        cameras: tuple[str, ...] | list[str] = ("agentview", "wrist"),
        action_repeat: int = 1,
        max_episode_steps: int = 220,
        settle_steps: int = 10,
        reward: str = "success",
        shaping_coef: float = 0.5,
        image_transform: str = "upright",
    ):
        from libero.libero import benchmark, get_libero_path  # heavy: only in the worker

        self._benchmark = benchmark
        self._bddl_root = get_libero_path("bddl_files")
        suites = benchmark.get_benchmark_dict()
        if suite not in suites:
            raise ValueError(f"unknown LIBERO suite {suite!r}; valid: {', '.join(sorted(suites))}")
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown or not cameras:
            raise ValueError(f"cameras must name some of {sorted(CAMERAS)}, got {list(cameras)}")
        if reward not in ("success", "shaped"):
            raise ValueError(f"reward must be 'success' or 'shaped', got {reward!r}")
        if image_transform not in IMAGE_TRANSFORMS:
            raise ValueError(f"image_transform must be one of {IMAGE_TRANSFORMS}, got {image_transform!r}")
        self.image_transform = image_transform
        self.num_envs = num_envs
        self.suite_name = suite
        self.suite = suites[suite]()
        self.image_size = int(image_size)
        self.cameras = [CAMERAS[c] for c in cameras]
        self.action_repeat = int(action_repeat)
        self.max_episode_steps = int(max_episode_steps)
        self.settle_steps = int(settle_steps)
        self.reward = reward
        self.shaping_coef = float(shaping_coef)
        self._expert_module = _load_sibling("libero_expert")
        self._envs: list = [None] * num_envs
        self._tasks = [-1] * num_envs
        self._experts = [self._expert_module.PickPlaceExpert(repeat=self.action_repeat) for _ in range(num_envs)]
        self._init_states: dict[int, np.ndarray] = {}
        self._obs: list[dict] = [{} for _ in range(num_envs)]
        self._images = np.zeros((num_envs, len(self.cameras), self.image_size, self.image_size, 3), np.uint8)
        self._elapsed = np.zeros(num_envs, np.int64)
        self._ended = np.ones(num_envs, bool)
        self._success = np.zeros(num_envs, bool)
        self._potential = np.zeros(num_envs)
        self._start_z = np.zeros(num_envs)

    def describe(self) -> dict:
        return {
            "action_kind": "continuous",
            "max_episode_steps": self.max_episode_steps,
            "action_dim": 7,
            "action_low": -np.ones(7, np.float32),
            "action_high": np.ones(7, np.float32),
            "image_size": self.image_size,
            "num_views": len(self.cameras),
            "suite": self.suite_name,
            "num_tasks": int(self.suite.n_tasks),
            "task_languages": tuple(self.suite.get_task(t).language for t in range(self.suite.n_tasks)),
            "num_init_states": tuple(len(self._task_init_states(t)) for t in range(self.suite.n_tasks)),
            "proprio_dim": PROPRIO_DIM,
        }

    # ------------------------------------------------------------------------------------------------ contract
    def reset(self, seeds: list[int], env_ids: list[int]) -> dict:
        for code, i in zip(seeds, env_ids):
            task, state = divmod(int(code), EPISODE_CODE)
            if not 0 <= task < self.suite.n_tasks:
                raise ValueError(f"task {task} out of range for {self.suite_name} ({self.suite.n_tasks} tasks)")
            inits = self._task_init_states(task)
            if not 0 <= state < len(inits):
                raise ValueError(f"initial state {state} out of range for task {task} ({len(inits)} states)")
            if self._tasks[i] != task:
                if self._envs[i] is not None:
                    self._envs[i].close()
                self._envs[i] = self._make(task)
                self._tasks[i] = task
            env = self._envs[i]
            # The soft reset re-samples the fixtures' placement (model body positions, which the initial state does
            # not hold) from NumPy's global generator: seeding it per episode makes a world depend on its episode only.
            env.seed(int(code))
            env.reset()
            for robot in env.env.robots:  # the gripper's command integrates over steps and survives a soft reset
                robot.gripper.current_action = np.zeros(robot.gripper.dof)
            env.set_init_state(inits[state])
            obs = None
            for _ in range(self.settle_steps):
                obs, _, _, _ = env.step(np.array([0, 0, 0, 0, 0, 0, -1.0]))
            self._obs[i] = obs if obs is not None else env.env._get_observations()
            self._render(i)
            self._elapsed[i] = 0
            self._ended[i] = False
            self._success[i] = False
            self._experts[i].reset()
            state_i = self._state(i)
            self._start_z[i] = state_i["obj_pos"][2]
            self._potential[i] = self._progress(i, state_i)
        return self._observation()

    def step(self, actions: np.ndarray) -> dict:
        actions = np.clip(np.nan_to_num(np.asarray(actions, np.float64).reshape(self.num_envs, 7)), -1.0, 1.0)
        reward = np.zeros(self.num_envs, np.float32)
        progress = np.zeros(self.num_envs, np.float32)
        hit = np.zeros(self.num_envs, np.float32)
        truncated = np.zeros(self.num_envs, bool)
        for i in range(self.num_envs):
            if self._envs[i] is None:
                raise RuntimeError(f"world {i} was never reset")
            if self._ended[i]:
                continue  # frozen until reset: same observation, reward 0
            env = self._envs[i]
            for _ in range(self.action_repeat):
                obs, _, done, _ = env.step(actions[i])
                self._obs[i] = obs
                self._experts[i].update(self._state(i))  # its phase timers count physics steps
                if done or env.env._check_success():
                    self._success[i] = True
                    break
            self._elapsed[i] += 1
            state_i = self._state(i)
            potential = self._progress(i, state_i)
            progress[i] = potential - self._potential[i]
            self._potential[i] = potential
            if self._success[i]:
                hit[i] = 1.0
                self._ended[i] = True
            elif self._elapsed[i] >= self.max_episode_steps:
                truncated[i] = True
                self._ended[i] = True
            self._render(i)
        reward += hit
        if self.reward == "shaped":
            reward += self.shaping_coef * progress
        terminated = hit > 0
        return {
            "obs": self._observation(),
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "info": {
                "success": self._success.copy(),
                "reward_components": {"success": hit, "progress": progress},
                "task": [f"{self.suite_name}/{t}" for t in self._tasks],
                "elapsed_steps": self._elapsed.copy(),
            },
        }

    def expert_action(self) -> np.ndarray:
        """The scripted expert's action `[n, 7]` for every world (zeros for ended worlds); changes no state."""
        out = np.zeros((self.num_envs, 7), np.float32)
        for i in range(self.num_envs):
            if not self._ended[i]:
                out[i] = self._experts[i].action(self._state(i))
        return out

    def raw_robot_state(self) -> dict:
        """What the proprioceptive state is made of, read straight from each world's MuJoCo data: the grip site's
        position `[n, 3]`, the end-effector body's quaternion in MuJoCo's w x y z order `[n, 4]` and rotation matrix
        `[n, 3, 3]`, and the finger joints' positions `[n, 2]`; and robosuite's observation of the quaternion
        (`obs_quat_xyzw` `[n, 4]`), which lags MuJoCo's data by a physics substep while the arm moves. For tests."""
        out = {"site_pos": [], "body_quat_wxyz": [], "body_xmat": [], "finger_qpos": [], "obs_quat_xyzw": []}
        for i, env in enumerate(self._envs):
            if env is None:
                raise RuntimeError(f"world {i} was never reset")
            robot, sim = env.env.robots[0], env.env.sim
            body = sim.model.body_name2id(robot.robot_model.eef_name)
            out["site_pos"].append(np.array(sim.data.site_xpos[robot.eef_site_id]))
            out["body_quat_wxyz"].append(np.array(sim.data.xquat[body]))
            out["body_xmat"].append(np.array(sim.data.xmat[body]).reshape(3, 3))
            out["finger_qpos"].append(np.array([sim.data.qpos[j] for j in robot._ref_gripper_joint_pos_indexes]))
            out["obs_quat_xyzw"].append(np.array(self._obs[i]["robot0_eef_quat"]))
        return {k: np.stack(v) for k, v in out.items()}

    def close(self) -> None:
        for env in self._envs:
            if env is not None:
                env.close()
        self._envs = [None] * self.num_envs

    # ------------------------------------------------------------------------------------------------ internals
    def _task_init_states(self, task: int) -> np.ndarray:
        if task not in self._init_states:
            self._init_states[task] = np.asarray(self.suite.get_task_init_states(task))
        return self._init_states[task]

    def _make(self, task: int):
        from libero.libero.envs import OffScreenRenderEnv

        spec = self.suite.get_task(task)
        env = OffScreenRenderEnv(
            bddl_file_name=os.path.join(self._bddl_root, spec.problem_folder, spec.bddl_file),
            camera_heights=self.image_size,
            camera_widths=self.image_size,
        )
        env.env.hard_reset = False  # same state after set_init_state, without rebuilding the simulator
        for name in ("agentview_image", "robot0_eye_in_hand_image"):
            env.env.modify_observable(name, "enabled", False)  # rendered in _render, once per step
        env.seed(0)
        return env

    def _render(self, i: int) -> None:
        sim = self._envs[i].env.sim
        for v, camera in enumerate(self.cameras):
            frame = sim.render(camera_name=camera, width=self.image_size, height=self.image_size)
            self._images[i, v] = frame[::-1] if self.image_transform == "upright" else frame[::-1, ::-1]

    def _state(self, i: int) -> dict:
        obs = self._obs[i]
        return self._expert_module.privileged_state(obs, self._envs[i].env.obj_of_interest)

    def _progress(self, i: int, state: dict) -> float:
        """Privileged progress potential in [0, 1]: reach the object, lift it, bring it over its destination."""
        reach = 1.0 - min(float(np.linalg.norm(state["eef_pos"] - state["obj_pos"])) / 0.3, 1.0)
        lift = min(max(float(state["obj_pos"][2] - self._start_z[i]), 0.0) / 0.05, 1.0)
        carry = 1.0 - min(float(np.linalg.norm(state["obj_pos"][:2] - state["target_pos"][:2])) / 0.3, 1.0)
        return 0.25 * reach + 0.25 * lift + 0.5 * carry * (lift > 0.5 or carry > 0.9)

    def _observation(self) -> dict:
        states = []
        for i in range(self.num_envs):
            s = self._state(i) if self._obs[i] else None
            states.append(
                np.zeros(11, np.float32)
                if s is None
                else np.concatenate([s["eef_pos"], s["gripper_qpos"], s["obj_pos"], s["target_pos"]]).astype(
                    np.float32
                )
            )
        proprio = [proprio_of(o) if o else np.zeros(PROPRIO_DIM, np.float32) for o in self._obs]
        languages = [self.suite.get_task(t).language if t >= 0 else "" for t in self._tasks]
        return {
            "image": self._images.copy(),
            "instruction": languages,
            "state": np.stack(states),
            "proprio": np.stack(proprio),
        }
