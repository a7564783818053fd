"""Shared test setup: offline, deterministic, one thread, caches in a throwaway folder; tiny-model fixtures.

The environment variables are set at import, before any test module imports `transformers` or `matplotlib`
(both read them once, at import). Subprocesses started by tests inherit them.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

_SCRATCH = tempfile.mkdtemp(prefix="mmrl-tests-")
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
os.environ["HF_HUB_OFFLINE"] = "1"  # no test reaches a model hub
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["MPLBACKEND"] = "Agg"
os.environ["OMP_NUM_THREADS"] = "1"  # for subprocesses; see torch.set_num_threads below
os.environ.setdefault("MUJOCO_GL", "egl")  # MuJoCo picks its GL backend at first import; EGL needs no extra packages
for _var, _sub in (("HOME", "home"), ("XDG_CACHE_HOME", "cache"), ("MPLCONFIGDIR", "matplotlib")):
    os.environ[_var] = os.path.join(_SCRATCH, _sub)
    os.makedirs(os.environ[_var], exist_ok=True)

import contextlib  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import sim  # noqa: E402
from sim.base import Observation, StepResult  # noqa: E402
from sim.tasks.grounding import GroundingEnv  # noqa: E402

# CPU kernels are deterministic already; this makes any op that is not raise instead of silently varying.
# Generation, forward and backward of the tiny Qwen-VL models all run under it.
torch.use_deterministic_algorithms(True)
# One thread. The tiny models have nothing to split across threads, and on a busy machine OpenMP's thread barriers
# make two threads far slower than one (measured on the two shared cores: 3.2 s against 0.04 s for one generate).
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
PRESET = REPO / "configs" / "grounding_tiny.yaml"
# Qwen2-VL / Qwen2.5-VL images must be multiples of 28 px (14 px patches, 2x2 merge), Qwen3-VL of 32 px.
IMAGE_SIZE = {"qwen2_vl": 112, "qwen2_5_vl": 112, "qwen3_vl": 128}


class LetterBonusGroundingEnv(GroundingEnv):
    """Grounding plus a dense `letters` reward: the share of ASCII letters in the answer.

    An untrained tiny model babbles, and babble never holds a box, so the grounding reward is 0 for every row, every
    advantage is 0 and GRPO moves nothing. The letter share differs between samples of the same prompt, so tests
    that need a real gradient (parameters move, resume reproduces the trajectory) get one.
    """

    def step(self, actions):
        result = super().step(actions)
        letters = torch.tensor(
            [sum(c.isascii() and c.isalpha() for c in a) / max(len(a), 1) for a in actions], dtype=torch.float32
        )
        components = {**result.info["reward_components"], "letters": letters}
        return replace(result, reward=result.reward + letters, info={**result.info, "reward_components": components})


@contextlib.contextmanager
def registered_env(name: str, cls: type) -> Iterator[None]:
    """Register `cls` in `sim.ENVS` for the duration of the block (registries refuse re-registration)."""
    sim.ENVS.register(name)(cls)
    try:
        yield
    finally:
        del sim.ENVS._items[name]  # Registry has no public removal: only tests ever need one


@pytest.fixture(scope="module")
def letters_env() -> Iterator[str]:
    """The name under which `LetterBonusGroundingEnv` is registered while the requesting module runs."""
    with registered_env("grounding_letters", LetterBonusGroundingEnv):
        yield "grounding_letters"


@pytest.fixture(scope="session")
def kill_ray_actor() -> Callable:
    """`kill_ray_actor(actor)`: kill a Ray actor (one with a `ping` method) and return once calls to it fail.

    `ray.kill` only sends the order on its way; a call made at once can still reach the old actor. A fresh-clone CI
    run saw it once: the `step` after the kill ran on the killed worker, and the restart the test expected never came.
    """
    ray = pytest.importorskip("ray")

    def kill(actor) -> None:
        ray.kill(actor, no_restart=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                ray.get(actor.ping.remote(), timeout=10)
            except ray.exceptions.RayActorError:  # ActorDiedError is one
                return
            except ray.exceptions.GetTimeoutError:  # dying, not yet dead: ask again
                continue
            time.sleep(0.05)
        raise AssertionError(f"the actor {actor} still answers 60 s after ray.kill")

    return kill


@pytest.fixture(scope="session")
def tiny_policy() -> Callable:
    """Factory: `tiny_policy(arch="qwen2_vl", seed=0, **policy_kwargs)` builds a random tiny real VLM (no hub)."""
    from mmrl.policy import build_tiny

    def make(arch: str = "qwen2_vl", seed: int = 0, **kwargs):
        kwargs.setdefault("prompt_template", "{instruction} Answer as <answer>[x1,y1,x2,y2]</answer>.")
        return build_tiny(arch, seed=seed, **kwargs)

    return make


@pytest.fixture(scope="session")
def grounding_obs() -> Callable:
    """Factory: `grounding_obs(arch, seeds, instructions=None)`, grounding observations sized for `arch`.

    `instructions` replaces the env's (to get prompts of different lengths: the env's all tokenise alike).
    """

    def make(arch: str, seeds: list[int], instructions: list[str] | None = None) -> Observation:
        env = sim.make("grounding", num_envs=len(seeds), image_size=IMAGE_SIZE[arch])
        obs = env.reset(seed=seeds)
        if instructions is not None:
            obs = Observation(image=obs.image, instruction=list(instructions))
        return obs

    return make


TINY_RUN = (
    "model.path=tiny:qwen2_vl",
    "model.prompt_template='{instruction}'",  # quoted: the value is read as YAML, and {x} is a mapping
    "env.options.image_size=112",
    "sampling.max_new_tokens=6",
    "algo.group_size=2",
    "trainer.prompts_per_step=2",
    "trainer.eval_episodes=4",
    "trainer.eval_batch_size=4",
    "trainer.save_every=1",
    "trainer.lr=1e-3",
    "trainer.threads=1",  # `train` sets torch's thread count for the whole process
)


@pytest.fixture(scope="session")
def tiny_run_config() -> Callable:
    """Factory: `tiny_run_config(output_dir, *overrides)`, the demo preset shrunk to a few seconds a run.

    A random "tiny:qwen2_vl", 2 prompts x 2 completions x 6 tokens a step, 4 held-out episodes, a checkpoint
    every step; later overrides win.
    """
    from mmrl.runtime.config import load_config

    def make(output_dir: str | Path, *overrides: str):
        return load_config(PRESET, [*TINY_RUN, f"output_dir={output_dir}", *overrides])

    return make


class PointReachEnv:
    """A toy continuous-control env for VLA tests: move a black dot onto a red one in a 64 px image.

    Actions `[N, 2]` in [-1, 1] move the dot by `action * 8` px; success within 6 px ends the episode; 4 steps at
    most. Reward: 1 on success. Pure torch and PIL, so VLA tests do not depend on a simulator being installed.
    """

    action_kind = "continuous"
    action_dim = 2
    max_episode_steps = 4

    def __init__(self, num_envs: int, image_size: int = 64):
        self.num_envs, self.size = num_envs, image_size
        self.action_low, self.action_high = torch.full((2,), -1.0), torch.full((2,), 1.0)
        self.pos = torch.zeros(num_envs, 2)
        self.goal = torch.zeros(num_envs, 2)
        self.steps = torch.zeros(num_envs, dtype=torch.long)
        self.done = torch.zeros(num_envs, dtype=torch.bool)

    def _obs(self) -> Observation:
        from PIL import Image, ImageDraw

        images = []
        for p, g in zip(self.pos.tolist(), self.goal.tolist()):
            image = Image.new("RGB", (self.size, self.size), (230, 230, 230))
            draw = ImageDraw.Draw(image)
            draw.ellipse([g[0] - 5, g[1] - 5, g[0] + 5, g[1] + 5], fill=(220, 30, 30))
            draw.ellipse([p[0] - 3, p[1] - 3, p[0] + 3, p[1] + 3], fill=(0, 0, 0))
            images.append(torch.from_numpy(__import__("numpy").asarray(image).copy()))
        return Observation(image=torch.stack(images), instruction=["Move the dot to the red target."] * self.num_envs,
                           state=torch.cat([self.pos, self.goal], -1))  # fmt: skip

    def reset(self, seed, env_ids=None):
        from sim.base import resolve_seeds

        ids = list(range(self.num_envs)) if env_ids is None else list(env_ids)
        for i, s in zip(ids, resolve_seeds(seed, len(ids))):
            g = torch.Generator().manual_seed(s)
            self.pos[i] = torch.rand(2, generator=g) * (self.size - 16) + 8
            self.goal[i] = torch.rand(2, generator=g) * (self.size - 16) + 8
            self.steps[i], self.done[i] = 0, False
        return self._obs()

    def expert_action(self) -> torch.Tensor:
        return ((self.goal - self.pos) / 8).clamp(-1, 1)

    def step(self, actions):
        from sim.base import StepResult

        live = ~self.done
        move = actions.float().clamp(-1, 1) * 8
        self.pos = torch.where(live.unsqueeze(-1), (self.pos + move).clamp(0, self.size - 1), self.pos)
        self.steps += live.long()
        success = live & ((self.pos - self.goal).norm(dim=-1) < 6)
        truncated = live & ~success & (self.steps >= self.max_episode_steps)
        self.done |= success | truncated
        reward = success.float()
        return StepResult(self._obs(), reward, success, truncated,
                          {"success": success, "reward_components": {"success": reward}})  # fmt: skip

    def close(self) -> None:
        pass


class FirstAxisTarget:
    """4 turns; each pays 1 - |a_0 - 0.8| (at least 0) whatever the image shows: a reward any policy can learn."""

    action_kind, action_dim, max_episode_steps = "continuous", 2, 4

    def __init__(self, num_envs: int):
        self.num_envs = num_envs
        self.action_low, self.action_high = torch.full((2,), -1.0), torch.full((2,), 1.0)
        self.steps = torch.zeros(num_envs, dtype=torch.long)
        self.image = torch.full((num_envs, 32, 32, 3), 200, dtype=torch.uint8)

    def _obs(self):
        return Observation(image=self.image.clone(), instruction=["Move right."] * self.num_envs)

    def reset(self, seed, env_ids=None):
        self.steps[list(range(self.num_envs)) if env_ids is None else list(env_ids)] = 0
        return self._obs()

    def step(self, actions):
        live = self.steps < self.max_episode_steps
        miss = (actions[:, 0].float() - 0.8).abs()
        self.steps += live.long()
        truncated = live & (self.steps >= self.max_episode_steps)
        return StepResult(self._obs(), (1 - miss).clamp(min=0) * live, torch.zeros_like(live), truncated,
                          {"success": miss < 0.15})  # fmt: skip

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def first_axis_env() -> Iterator[str]:
    """The name under which `FirstAxisTarget` is registered while the requesting module runs."""
    with registered_env("first_axis_target", FirstAxisTarget):
        yield "first_axis_target"


@pytest.fixture(scope="module")
def point_env() -> Iterator[str]:
    """The name under which `PointReachEnv` is registered while the requesting module runs."""
    with registered_env("point_reach", PointReachEnv):
        yield "point_reach"
