"""Rollout workers (Ray actors with policy copies) collect the same episodes as the in-process collector."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

import sim
from mmrl.stages.rollout import collect_episodes
from mmrl.types import Sampling

ray = pytest.importorskip("ray", reason="rollout workers need Ray (the `ray` extra)")

from mmrl.stages.rollout_workers import RolloutWorkers  # noqa: E402

ENV = {"image_size": 112}  # grounding at the tiny qwen2_vl's image size
SAMPLING = Sampling(max_new_tokens=8, temperature=1.0)
GROUP = 2


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started_here:
        ray.shutdown()


def _jobs():
    seeds_a, seeds_b = [5, 5, 6, 6], [7, 7, 8, 8]
    return [(seeds_a, GROUP, SAMPLING, 101), (seeds_b, GROUP, SAMPLING, 202), (seeds_a, GROUP, SAMPLING, 303)]


def _local(policy, jobs):
    env = sim.make("grounding", num_envs=4, **ENV)
    out = []
    for seeds, group, sampling, torch_seed in jobs:
        torch.manual_seed(torch_seed)
        out.append(collect_episodes(policy, env, seeds, group, sampling))
    return out


def _assert_same(remote, local):
    assert len(remote) == len(local)
    for r, m in zip(remote, local):
        assert torch.equal(r.rollout.completion_ids, m.rollout.completion_ids)
        assert torch.allclose(r.rollout.logprobs, m.rollout.logprobs, atol=1e-5)
        assert torch.equal(r.step_rewards, m.step_rewards)


def test_workers_collect_what_the_process_collects_and_follow_synced_weights(ray_cluster, tiny_policy):
    policy = tiny_policy("qwen2_vl", seed=0)
    workers = RolloutWorkers(policy, "grounding", 4, ENV, workers=2, timeout_s=120)
    try:
        jobs = _jobs()
        first = workers.collect(jobs)
        _assert_same(first, _local(policy, jobs))
        # Different torch seeds sample differently (the jobs are not all the same by accident).
        assert not torch.equal(first[0].rollout.completion_ids, first[2].rollout.completion_ids)
        # New weights: the workers sample from them only after a sync.
        with torch.no_grad():
            for param in policy.model.parameters():
                param.add_(0.05 * torch.randn_like(param))
        stale = workers.collect(jobs[:1])
        _assert_same(stale, first[:1])
        workers.sync(policy)
        _assert_same(workers.collect(jobs), _local(policy, jobs))
    finally:
        workers.close()


def test_a_killed_worker_is_replaced_with_the_synced_weights_and_its_job_rerun(
    ray_cluster, tiny_policy, kill_ray_actor
):
    policy = tiny_policy("qwen2_vl", seed=1)
    workers = RolloutWorkers(policy, "grounding", 4, ENV, workers=2, timeout_s=120)
    try:
        with torch.no_grad():
            next(policy.model.parameters()).mul_(1.5)
        workers.sync(policy)
        kill_ray_actor(workers._actors[1])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            remote = workers.collect(_jobs())
        assert workers.restarts == 1
        assert any("rollout worker 1 failed" in str(w.message) for w in caught)
        _assert_same(remote, _local(policy, _jobs()))
    finally:
        workers.close()


def test_bad_worker_counts_are_named(tiny_policy):
    with pytest.raises(ValueError, match="trainer.rollout_workers must be >= 1"):
        RolloutWorkers(tiny_policy("qwen2_vl", seed=0), "grounding", 4, ENV, workers=0)


def test_a_bad_env_option_is_the_envs_error_not_a_dead_worker(ray_cluster, tiny_policy):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no restart may be attempted
        with pytest.raises(ValueError, match="bogus"):
            RolloutWorkers(tiny_policy("qwen2_vl", seed=0), "grounding", 4, {"bogus": 1}, workers=1, timeout_s=60)
