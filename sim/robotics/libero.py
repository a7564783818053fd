"""LIBERO (the VLA benchmark of VLA-RL, SRPO, SimpleVLA-RL and RLinf-VLA) behind the `VecEnv` contract.

>>> env = sim.make("libero", num_envs=4, suite="libero_spatial", tasks=[0, 1])  # doctest: +SKIP
>>> obs = env.reset(seed=EVAL_SEED_BASE)  # the benchmark's fixed initial states 0 of tasks 0 and 1, then states 1
>>> obs.image.shape  # [4, 2, 128, 128, 3]: agent view and wrist camera of each world, in that order

**Task.** One suite (`libero_spatial`, `libero_object`, `libero_goal`, `libero_10`, `libero_90`), all its tasks or
the ones `tasks` lists. Each world shows the task's language instruction and its cameras (`cameras`: the agent view
and the wrist camera by default, `[N, V, H, W, 3]`; one camera gives `[N, H, W, 3]`) and takes a 7-D action in
[-1, 1]: end-effector translation (x 0.05 m) and axis-angle rotation (x 0.5 rad) deltas of robosuite's OSC_POSE
controller, and the gripper (-1 open, +1 close). A VLA emits it through the policy's action codec like any other
continuous env (`model.action_bins`). `action_repeat` k applies each action for k physics steps (20 Hz each) and
renders once: k times fewer decisions and renders per episode.

**Episodes are the benchmark's.** A seed picks a task and one of LIBERO's fixed initial states (50 per task, the
states every paper evaluates on): held-out seeds (`sim.seeds.EVAL_SEED_BASE + i`) go through the tasks in turn and
then through the states in order, so the first `T * 50` held-out episodes are the benchmark's evaluation of T tasks;
validation seeds (`sim.seeds.VALIDATION_SEED_BASE + i`, `trainer.eval_every`'s evaluations) go through the tasks in
turn and then through the training states in order; other seeds (training, demonstrations) pick both by the seed.
The papers train RL on the same initial states they evaluate on; `holdout=h` keeps the last h states of every task
for the test split only (training, demonstrations and validation use the others), for a test figure that no
training episode has seen and no choice made on validation scores was fitted to. The episode limit is the papers' (220 steps for
spatial, 280 object, 300 goal, 520 LIBERO-10, 400 LIBERO-90, after 10 settling steps), divided by `action_repeat`.

**The papers' evaluation protocol** (openpi's LIBERO example, RLinf's πRL, OpenVLA-OFT): the fixed initial states
above; 10 settling steps with a no-op action (zero motion, gripper open) before the policy acts (`settle_steps`); the
suite's step budget; and action chunks executed open-loop for a fixed horizon before the policy replans:
`replan_steps` r makes the collector execute the first r actions of every chunk a policy emits (a π0 chunk, a VLA's
`model.action_chunk`), then ask again (None: the whole chunk; openpi runs π0 with r = 5 of a 50-action chunk). Any
policy acting in this env plays by it; `protocol` says it in words, and `mmrl eval` writes that next to its result.
`obs.proprio` `[N, 8]` is the proprioceptive state π0's LIBERO checkpoints read (end-effector position, axis-angle,
finger joints; sim/robotics/libero_worlds.py), and `image_transform="rot180"` shows the cameras as those checkpoints
were trained to see them (openpi's `img[::-1, ::-1]`; the default `upright` is the scene as the camera sees it).

**Reward** is LIBERO's: 1 on the step that completes the task's goal predicates (success), which terminates the
episode; `reward="shaped"` adds a privileged progress potential's change (sim/robotics/libero_worlds.py). Every step's
info has `success`, `reward_components` (`success`, `progress`) and `task` (`<suite>/<id>`: evaluation reports
per task). Ended worlds are frozen until reset (action ignored, reward 0). `state` `[N, 11]` is privileged: gripper
position, finger joints, the object's and the destination's positions. `expert_action()` is a scripted
pick-and-place expert that reads it (sim/robotics/libero_expert.py), for cold starts.

**Where it runs.** LIBERO needs robosuite 1.4, which breaks on mujoco 4; the project's own MuJoCo code needs mujoco 4.
So LIBERO lives in its own environment, `.venv-libero` (`make setup-libero`, or `scripts/setup_libero.sh`), and the
worlds live in worker processes started from it (`sim.subproc.SubprocVecEnv`), one process per world by default
(`processes`; not `env.workers`, which spreads worlds over Ray actors): about 2 GB of memory each. On a CPU a 128 px
frame of LIBERO's scenes costs 80-180 ms with Mesa's llvmpipe and a physics step about 25 ms, so a process steps
about 3 times a second with two cameras at `action_repeat=1` and 25-40 physics steps a second without rendering. `MUJOCO_GL` is `egl` unless set.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from sim.base import Observation, StepResult, resolve_env_ids, resolve_seeds
from sim.registry import ENVS
from sim.robotics.planar import add_noise
from sim.seeds import EVAL_SEED_BASE, VALIDATION_SEED_BASE, seed_split
from sim.subproc import SubprocVecEnv

__all__ = ["LiberoEnv", "SUITE_MAX_STEPS", "libero_python", "libero_unavailable"]

ROOT = Path(__file__).resolve().parents[2]
WORLDS = Path(__file__).resolve().with_name("libero_worlds.py")
# Episode limits of the papers' LIBERO evaluation (OpenVLA's, kept by OpenVLA-OFT, SimpleVLA-RL and RLinf), in steps.
SUITE_MAX_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
SUITE_TASKS = {"libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90}
EPISODE_CODE = 1000  # must match libero_worlds.EPISODE_CODE: a world's episode is task * 1000 + initial state
SETUP_HINT = "run `make setup-libero` (scripts/setup_libero.sh) to build LIBERO's own environment, .venv-libero"


def libero_venv() -> Path:
    """LIBERO's environment: `$MMRL_LIBERO_VENV`, else `.venv-libero` at the repository's root."""
    return Path(os.environ.get("MMRL_LIBERO_VENV") or ROOT / ".venv-libero")


def libero_python() -> Path:
    return libero_venv() / "bin" / "python"


def libero_unavailable() -> str | None:
    """Why the `libero` env cannot be built here (None when it can)."""
    venv = libero_venv()
    if not libero_python().is_file():
        return f"LIBERO's environment {venv} does not exist: {SETUP_HINT}"
    if not (venv / ".mmrl-libero").is_file() or not (venv / "libero-config" / "config.yaml").is_file():
        return f"LIBERO's environment {venv} is incomplete (its set-up did not finish): {SETUP_HINT}"
    return None


@ENVS.register("libero")
class LiberoEnv:
    """N LIBERO worlds of one suite, served from LIBERO's own environment (see the module docstring).

    Args:
        num_envs: N, the number of worlds.
        suite: The LIBERO suite.
        tasks: Task ids of the suite to use (None: all of them).
        image_size: Height and width of every camera image.
        cameras: `agentview` and/or `wrist`, in the order they are shown.
        action_repeat: Physics steps per action (one render per action).
        max_episode_steps: Actions per episode; None: the papers' limit for the suite / `action_repeat`.
        settle_steps: No-op steps after the initial state is set (not counted in the episode).
        reward: `success` (LIBERO's) or `shaped` (plus a privileged progress potential's change).
        shaping_coef: Weight of the progress term of `shaped`.
        holdout: The last `holdout` initial states of every task are used by test seeds only.
        replan_steps: Actions of each emitted chunk executed before the policy acts again (None: the whole chunk).
        image_transform: `upright` (the scene as the camera sees it) or `rot180` (the raw frame turned by 180 degrees,
            as the LIBERO datasets of OpenVLA and π0 checkpoints store it).
        processes: Worker processes the worlds are spread over (None: one per world).
        timeout_s: Seconds one call may take before its worker is taken for hung.
        device: Where returned tensors live.

    Raises:
        RuntimeError: LIBERO's environment is not set up (with what to run).
        ValueError: A bad suite, task, camera or count (the worker's message).
    """

    action_kind = "continuous"
    default_max_episode_steps = "suite"  # what max_episode_steps=None takes: the suite's limit / action_repeat
    unavailable = staticmethod(libero_unavailable)

    def __init__(
        self,
        num_envs: int,
        suite: str = "libero_spatial",
        tasks: Sequence[int] | None = None,
        image_size: int = 128,
        cameras: Sequence[str] = ("agentview", "wrist"),
        action_repeat: int = 1,
        max_episode_steps: int | None = None,
        settle_steps: int = 10,
        reward: str = "success",
        shaping_coef: float = 0.5,
        holdout: int = 0,
        replan_steps: int | None = None,
        image_transform: str = "upright",
        processes: int | None = None,
        timeout_s: float = 300.0,
        device: str | torch.device = "cpu",
    ):
        reason = self.unavailable()
        if reason is not None:
            raise RuntimeError(f"the libero env cannot be built: {reason}")
        if suite not in SUITE_MAX_STEPS:
            raise ValueError(f"unknown LIBERO suite {suite!r}; valid: {', '.join(SUITE_MAX_STEPS)}")
        if not isinstance(action_repeat, int) or action_repeat < 1:
            raise ValueError(f"action_repeat must be an int >= 1, got {action_repeat!r}")
        if replan_steps is not None and (isinstance(replan_steps, bool) or not isinstance(replan_steps, int)
                                         or replan_steps < 1):  # fmt: skip
            raise ValueError(f"replan_steps must be an int >= 1 or None (the whole chunk), got {replan_steps!r}")
        if image_transform not in ("upright", "rot180"):  # libero_worlds.IMAGE_TRANSFORMS, checked before any worker
            raise ValueError(f"image_transform must be 'upright' or 'rot180', got {image_transform!r}")
        if max_episode_steps is None:
            max_episode_steps = math.ceil(SUITE_MAX_STEPS[suite] / action_repeat)
        num_tasks = SUITE_TASKS[suite]
        self.tasks = list(range(num_tasks)) if tasks is None else [int(t) for t in tasks]
        if not self.tasks or any(not 0 <= t < num_tasks for t in self.tasks):
            raise ValueError(f"tasks must be ids in [0, {num_tasks}) of {suite}, got {tasks!r}")
        self.num_envs = num_envs
        self.suite = suite
        self.replan_steps = replan_steps
        self.settle_steps = int(settle_steps)
        self.action_repeat = action_repeat
        self.image_transform = image_transform
        self.cameras = tuple(cameras)
        self.device = torch.device(device)
        env_vars = {"LIBERO_CONFIG_PATH": str(libero_venv() / "libero-config"), "OMP_NUM_THREADS": "1"}
        env_vars["MUJOCO_GL"] = os.environ.get("MUJOCO_GL", "egl")
        self._worlds = SubprocVecEnv(
            f"{WORLDS}:LiberoWorlds",
            num_envs,
            processes,
            python=libero_python(),
            env_vars=env_vars,
            timeout_s=timeout_s,
            name="libero",
            suite=suite,
            image_size=image_size,
            cameras=list(cameras),
            action_repeat=action_repeat,
            max_episode_steps=max_episode_steps,
            settle_steps=settle_steps,
            reward=reward,
            shaping_coef=shaping_coef,
            image_transform=image_transform,
        )
        spec = self._worlds.spec
        self.max_episode_steps = int(spec["max_episode_steps"])
        self.action_dim = int(spec["action_dim"])
        self.action_low = spec["action_low"].float()
        self.action_high = spec["action_high"].float()
        self.image_size = int(spec["image_size"])
        self.num_views = int(spec["num_views"])
        self.task_languages: tuple[str, ...] = tuple(spec["task_languages"])
        states = min(int(spec["num_init_states"][t]) for t in self.tasks)
        if not isinstance(holdout, int) or not 0 <= holdout < states:
            self.close()
            raise ValueError(f"holdout must be an int in [0, {states}) (initial states per task), got {holdout!r}")
        self.holdout = holdout
        self._train_states = list(range(states - holdout))
        self._eval_states = list(range(states - holdout, states)) if holdout else list(range(states))
        self._states_per_task = states

    @property
    def protocol(self) -> str:
        """The evaluation protocol held-out episodes of this env are played by, in words (the papers' when
        `settle_steps` is 10, `action_repeat` 1 and the limit the suite's; see the module docstring)."""
        first, last = self._eval_states[0], self._eval_states[-1]
        budget = self.max_episode_steps * self.action_repeat
        papers = budget == SUITE_MAX_STEPS[self.suite] and self.settle_steps == 10 and self.action_repeat == 1
        chunk = ("each action chunk executed whole before the policy acts again" if self.replan_steps is None
                 else f"action chunks executed open-loop {self.replan_steps} action(s) at a time before replanning")  # fmt: skip
        repeat = "" if self.action_repeat == 1 else f", each action held for {self.action_repeat} physics steps"
        return (
            f"LIBERO {self.suite}, tasks {self.tasks}: held-out episodes start from the benchmark's fixed initial "
            f"states {first}-{last} of each task (tasks in turn, then states); {self.settle_steps} settling steps "
            f"with a no-op action (gripper open) before the policy acts; a budget of {budget} physics steps at 20 Hz "
            f"({self.max_episode_steps} actions{repeat}); {chunk}; cameras {list(self.cameras)} at "
            f"{self.image_size} px ({self.image_transform}); success = the task's BDDL goal. "
            + ("The papers' protocol." if papers else "Not the papers' protocol (their budget is "
               f"{SUITE_MAX_STEPS[self.suite]} steps after 10 settling steps, one physics step per action).")
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"LiberoEnv({self.suite!r}, tasks={self.tasks}, num_envs={self.num_envs})"

    @property
    def worker_worlds(self) -> tuple[range, ...]:
        return self._worlds.worker_worlds

    def episode(self, seed: int) -> tuple[int, int]:
        """The (task id, initial state index) a world reset with `seed` starts from (see the module docstring)."""
        tasks = self.tasks
        split = seed_split(seed)
        if split != "train":  # the evaluation splits: every task in turn, then the split's states in order
            i = seed - (EVAL_SEED_BASE if split == "test" else VALIDATION_SEED_BASE)
            states = self._eval_states if split == "test" else self._train_states
            return tasks[i % len(tasks)], states[(i // len(tasks)) % len(states)]
        seed = abs(int(seed))
        return tasks[seed % len(tasks)], self._train_states[(seed // len(tasks)) % len(self._train_states)]

    # ------------------------------------------------------------------------------------------------ contract
    def reset(self, seed: int | Sequence[int], env_ids: Sequence[int] | None = None) -> Observation:
        ids = resolve_env_ids(env_ids, self.num_envs)
        codes = [task * EPISODE_CODE + state for task, state in map(self.episode, resolve_seeds(seed, len(ids)))]
        return self._out(self._worlds.reset(codes, ids))

    def step(self, actions: torch.Tensor) -> StepResult:
        actions = torch.as_tensor(actions, dtype=torch.float32)
        if tuple(actions.shape) != (self.num_envs, self.action_dim):
            raise ValueError(f"actions must be [N={self.num_envs}, D={self.action_dim}], got {list(actions.shape)}")
        result = self._worlds.step(actions.cpu())
        return StepResult(
            obs=self._out(result.obs),
            reward=result.reward.to(self.device),
            terminated=result.terminated.to(self.device),
            truncated=result.truncated.to(self.device),
            info=result.info,
        )

    def expert_action(self, noise: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
        """The scripted pick-and-place expert's action `[N, 7]` (sim/robotics/libero_expert.py), plus noise.

        Args:
            noise: Standard deviation of Gaussian noise added before clipping to [-1, 1].
            generator: Source of the noise; required when `noise > 0`.
        """
        action = self._worlds.call("expert_action").float()  # [N, 7]
        return add_noise(action, noise, generator).to(self.device)

    def close(self) -> None:
        worlds = self.__dict__.get("_worlds")
        if worlds is not None:
            worlds.close()

    # ------------------------------------------------------------------------------------------------ internals
    def _out(self, obs: Observation) -> Observation:
        image = obs.image[:, 0] if self.num_views == 1 else obs.image
        return Observation(
            image=image.to(self.device),
            instruction=obs.instruction,
            state=obs.state.to(self.device),
            proprio=obs.proprio.to(self.device),
        )
