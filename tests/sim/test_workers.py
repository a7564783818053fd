"""RayVecEnv: the same worlds as in-process, split over Ray actors, surviving killed and hung workers.

One local Ray cluster (2 CPUs) serves the whole module; the envs are module fixtures, and each test resets them
first, so tests do not depend on each other's order.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import sim
from sim import check_vec_env
from sim.base import Observation, StepResult, resolve_env_ids, resolve_seeds
from sim.ray_workers import merge_dict, merge_parts
from sim.workers import RayVecEnv

ray = pytest.importorskip("ray", reason="RayVecEnv needs Ray (the `ray` extra); the in-process path does not")

GROUNDING = {"image_size": 32, "min_size": 6, "max_size": 12}
REACH = {"image_size": 32}
# Quarter-CPU actors: the module's 2-CPU cluster holds the two 2-worker fixtures and the short-lived envs at once.
CPUS = 0.25


class SleepyEnv:
    """A test-only text env whose `step` sleeps for 10 minutes when a world's action is "hang" (a hung simulator)."""

    action_kind = "text"
    max_episode_steps = 100

    def __init__(self, num_envs: int):
        self.num_envs = num_envs
        self._images = torch.zeros(num_envs, 8, 8, 3, dtype=torch.uint8)

    def reset(self, seed, env_ids=None) -> Observation:
        ids = resolve_env_ids(env_ids, self.num_envs)
        for i, s in zip(ids, resolve_seeds(seed, len(ids))):
            self._images[i] = torch.randint(0, 256, (8, 8, 3), generator=torch.Generator().manual_seed(s))
        return Observation(image=self._images.clone(), instruction=["Say anything."] * self.num_envs)

    def step(self, actions: list[str]) -> StepResult:
        if "hang" in actions:
            time.sleep(600)
        n = self.num_envs
        reward = torch.tensor([float(len(a)) for a in actions])
        obs = Observation(image=self._images.clone(), instruction=["Say anything."] * n)
        return StepResult(obs, reward, torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool), {})

    def draw(self, generator: torch.Generator) -> torch.Tensor:
        return torch.rand(self.num_envs, generator=generator)  # [N]

    def size(self) -> int:
        return self.num_envs  # not per-world, and differs between workers of unequal size

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[float]:
    """A local 2-CPU Ray cluster for the module; yields its start-up time in seconds."""
    started_here = not ray.is_initialized()
    start = time.perf_counter()
    if started_here:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield time.perf_counter() - start
    if started_here:
        ray.shutdown()


@pytest.fixture(scope="module")
def grounding_pair(ray_cluster) -> Iterator[tuple[RayVecEnv, object]]:
    # With a reward mix (sim.mix): each worker wraps its block of worlds; the wrapped env's attributes still reach here.
    mix = [{"name": "env"}, {"name": "think_answer_format", "weight": 0.5}]
    remote = RayVecEnv("grounding", 4, workers=2, cpus_per_worker=CPUS, rewards=mix, **GROUNDING)
    local = sim.make("grounding", num_envs=4, rewards=mix, **GROUNDING)
    yield remote, local
    remote.close()


@pytest.fixture(scope="module")
def reach_pair(ray_cluster) -> Iterator[tuple[RayVecEnv, object]]:
    remote = RayVecEnv("reach", 4, workers=2, cpus_per_worker=CPUS, **REACH)
    local = sim.make("reach", num_envs=4, **REACH)
    yield remote, local
    remote.close()
    local.close()


@pytest.fixture(scope="module")
def sleepy_env() -> Iterator[str]:
    sim.ENVS.register("sleepy")(SleepyEnv)
    yield "sleepy"
    del sim.ENVS._items["sleepy"]  # Registry has no public removal: only tests need one


@pytest.fixture(scope="module")
def sleepy(ray_cluster, sleepy_env) -> Iterator[RayVecEnv]:
    env = RayVecEnv(sleepy_env, 3, workers=2, timeout_s=2.0, max_restarts=1, cpus_per_worker=CPUS)
    yield env
    env.close()


def assert_same(got, want, where: str = "result") -> None:
    """Exact equality of (nested) results: tensors bit for bit (NaN equals NaN), same dtype; lists, dicts, fields."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype, f"{where}: {got!r} vs {want!r}"
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=f"{where} differs")
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), f"{where}: keys {list(got)} vs {list(want)}"
        for key in want:
            assert_same(got[key], want[key], f"{where}[{key!r}]")
    elif dataclasses.is_dataclass(want):
        for f in dataclasses.fields(want):
            assert_same(getattr(got, f.name), getattr(want, f.name), f"{where}.{f.name}")
    else:
        assert got == want, f"{where}: {got!r} vs {want!r}"


def answers(boxes: torch.Tensor) -> list[str]:
    """Exact answers for worlds 0 and 2, garbage for the others (so rewards, reasons and NaN boxes all vary)."""
    texts = [f"<answer>[{', '.join(str(int(v)) for v in b)}]</answer>" for b in boxes.tolist()]
    return [texts[0], "no idea", texts[2], "[1,2"]


# --------------------------------------------------------------------------------------------------- grounding
def test_grounding_keeps_the_contract_and_equals_the_in_process_env(grounding_pair):
    remote, local = grounding_pair
    assert remote.worker_worlds == (range(0, 2), range(2, 4))
    check_vec_env(remote, seed=0)

    assert_same(remote.reset(seed=5), local.reset(seed=5), "reset")
    assert_same(remote.target_boxes, local.target_boxes, "target_boxes")  # a property: read live from both workers
    actions = answers(local.target_boxes)
    got, want = remote.step(actions), local.step(actions)
    assert_same(got, want, "step")
    assert got.reward[0] > 1.0 and got.reward[1] == 0.0  # the values compared are not trivially equal
    assert got.info["reasons"][1] != "" and torch.isnan(got.info["pred_box"][1]).all()
    assert "think_answer_format" in got.info["reward_components"]  # the mix ran in the workers

    # Constants are served here; per-world lists stay in the workers, and so does the absent expert.
    assert (remote.action_kind, remote.max_episode_steps, remote.image_size) == ("text", 1, 32)
    with pytest.raises(AttributeError, match="one entry per world"):
        remote.scenes  # noqa: B018
    assert not hasattr(remote, "expert_action")


def test_partial_reset_calls_only_the_owning_worker(grounding_pair, kill_ray_actor):
    remote, local = grounding_pair
    remote.reset(seed=0)
    local.reset(seed=0)
    restarts = remote.restarts
    kill_ray_actor(remote.actors[0])  # worker 0 (worlds 0, 1) is dead; a reset of worlds 3 and 2 must not notice
    got = remote.reset(seed=[11, 12], env_ids=[3, 2])
    assert remote.restarts == restarts
    assert_same(got, local.reset(seed=[11, 12], env_ids=[3, 2]), "partial reset")
    # Reading every world's state reaches worker 0: it is restarted and its worlds replayed from seeds 0 and 1.
    with pytest.warns(RuntimeWarning, match=r"restarting worker 0 \(worlds \[0, 1\]\)"):
        boxes = remote.target_boxes
    assert remote.restarts == restarts + 1
    assert_same(boxes, local.target_boxes, "target_boxes after restart")
    actions = answers(local.target_boxes)
    assert_same(remote.step(actions), local.step(actions), "step after restart")


# --------------------------------------------------------------------------------------------------- reach
def test_reach_equals_the_in_process_env_step_by_step(reach_pair):
    remote, local = reach_pair
    assert remote.action_dim == 2 and remote.action_kind == "continuous"
    assert_same(remote.action_low, local.action_low)
    assert_same(remote.action_high, local.action_high)
    assert_same(remote.reset(seed=3), local.reset(seed=3), "reset")
    for t in range(3):
        expert = local.expert_action()  # [4, 2]
        assert_same(remote.expert_action(), expert, f"expert_action at step {t}")
        got, want = remote.step(expert), local.step(expert)
        assert_same(got, want, f"step {t}")
    assert float(got.info["reward_components"]["progress"].abs().sum()) > 0  # the worlds really moved
    # Noise drawn on the caller's side from the caller's generator: the same numbers as in-process.
    noisy = remote.expert_action(noise=0.5, generator=torch.Generator().manual_seed(1))
    assert_same(noisy, local.expert_action(noise=0.5, generator=torch.Generator().manual_seed(1)), "noisy expert")
    assert not torch.equal(noisy, local.expert_action())


def test_killed_reach_worker_replays_its_episodes(reach_pair, kill_ray_actor):
    remote, local = reach_pair
    for env in (remote, local):
        env.reset(seed=7)
        env.step(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.5], [0.3, -1.0]]))
        env.reset(seed=[50], env_ids=[1])  # world 1's episode starts later than world 0's in the same worker
        env.step(torch.tensor([[0.5, 0.5], [-0.7, 0.2], [0.0, -1.0], [1.0, 1.0]]))
    restarts = remote.restarts
    kill_ray_actor(remote.actors[0])
    actions = local.expert_action()
    with pytest.warns(
        RuntimeWarning,
        match=r"restarting worker 0 \(worlds \[0, 1\]\) of env 'reach' after (RayActorError|ActorDiedError)",
    ):
        got = remote.step(actions)
    assert remote.restarts == restarts + 1
    assert_same(got, local.step(actions), "step after the kill")
    actions = local.expert_action()
    assert_same(remote.step(actions), local.step(actions), "the next step")


# --------------------------------------------------------------------------------------------------- failures
def test_call_merges_per_world_results_and_seeds_one_generator_per_worker(sleepy):
    first = sleepy.draw(generator=torch.Generator().manual_seed(0))  # [3]: worlds 0, 1 from worker 0, 2 from 1
    assert first.shape == (3,)
    assert torch.equal(first, sleepy.call("draw", torch.Generator().manual_seed(0)))  # reproducible
    assert not torch.equal(first, sleepy.draw(generator=torch.Generator().manual_seed(1)))
    assert first[0] != first[2]  # each worker drew from its own generator, not from copies of one state
    with pytest.raises(ValueError, match=r"sleepy\.size: .*neither per-world .* nor equal"):
        sleepy.size()  # 2 from worker 0, 1 from worker 1


def test_hung_worker_is_restarted_then_named_in_the_error(sleepy):
    sleepy.reset(seed=0)
    assert sleepy.step(["a", "bb", ""]).reward.tolist() == [1.0, 2.0, 0.0]
    restarts = sleepy.restarts
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="restarting worker 1"):
        with pytest.raises(RuntimeError, match=r"worker 1 \(worlds \[2\]\) of env 'sleepy' failed 2 times.*Timeout"):
            sleepy.step(["a", "b", "hang"])
    assert sleepy.restarts == restarts + 1
    # Two 2 s time-outs and one actor start, never the 600 s sleep. The bound is half the sleep, not a speed
    # target: an actor start on a loaded 2-core machine took 76 s once (the test suite beside three training runs).
    assert time.perf_counter() - start < 300
    # The given-up actor was killed; the next call starts worker 1 afresh and replays world 2's episode.
    with pytest.warns(RuntimeWarning, match="restarting worker 1"):
        assert sleepy.step(["a", "bb", "ccc"]).reward.tolist() == [1.0, 2.0, 3.0]
    assert sleepy.restarts == restarts + 2


def test_bad_env_option_fails_at_once_without_restarts(ray_cluster):
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        RayVecEnv("grounding", 2, workers=1, cpus_per_worker=CPUS, bogus=1)
    with pytest.raises(ValueError, match="workers must be"):
        RayVecEnv("grounding", 2, workers=3)


def test_merge_concatenates_per_world_values_and_drops_the_rest():
    sizes = [2, 1]
    parts = [
        {"r": torch.tensor([1.0, 2.0]), "why": ["a", "b"], "c": {"x": torch.tensor([0.5, 0.5])}, "k": 3, "t": 1},
        {"r": torch.tensor([3.0]), "why": ["c"], "c": {"x": torch.tensor([0.25])}, "k": 3, "t": 2, "only": 0},
    ]
    dropped: list[str] = []
    merged = merge_dict(parts, sizes, "info", dropped)
    want = {"r": torch.tensor([1.0, 2.0, 3.0]), "why": ["a", "b", "c"], "c": {"x": torch.tensor([0.5, 0.5, 0.25])}}
    assert_same(merged, {**want, "k": 3})  # "k" agrees between workers; "t" differs and "only" is not in both
    assert dropped == ["info['t']", "info['only']"]
    with pytest.raises(ValueError, match=r"info\['t'\]"):  # call() results are strict
        merge_parts(parts, sizes, "info")
    assert merge_parts([np.zeros((2, 3)), np.ones((1, 3))], sizes, "a").shape == (3, 3)


def test_import_sim_does_not_import_ray():
    code = "import sys, sim, sim.workers; print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout
