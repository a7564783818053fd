"""vLLM in a process of its own (`generation_backend="vllm_process"`, mmrl/policy/vllm_engine.py) on vLLM's CPU build.

One engine process for the module (starting one takes 30-60 s here: the child imports vLLM and builds the engine).
What it samples is what the training forward scores (the tolerance of test_vllm_backend.py, same reasons), before and
after an update pushed through the shared-memory weights; every call returns the version of the weights that made it;
an engine that dies is a clear error naming the backend and its log, within the call's time limit, and the next call
starts a new one.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from mmrl.policy import build_tiny
from mmrl.policy.vllm_engine import EngineProcessError, VLLMProcessBackend

_spec = importlib.util.spec_from_file_location("vllm_backend_tests", Path(__file__).with_name("test_vllm_backend.py"))
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
GROUP, SAMPLING, assert_matches, observations = (
    _helpers.GROUP,
    _helpers.SAMPLING,
    _helpers.assert_matches,
    _helpers.observations,
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    policy = build_tiny("qwen2_vl", seed=0)
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    backend = VLLMProcessBackend(log_file=log, timeout_s=120, start_timeout_s=400)
    policy._backend = backend
    yield policy, backend
    backend.close()


def _sample(policy, obs, seed):
    torch.manual_seed(seed)
    return policy.generate(obs, group_size=GROUP, sampling=SAMPLING)


def test_samples_score_as_the_training_forward_before_and_after_a_pushed_update(engine):
    policy, backend = engine
    obs = observations("qwen2_vl", 1)
    before = _sample(policy, obs, 0)
    assert backend.alive and backend.last_version == 1 and os.getpid() != backend._process.pid
    assert_matches(policy, before)
    again = _sample(policy, obs, 0)  # same torch seed in this process: the child samples the same completions
    assert torch.equal(again.completion_ids, before.completion_ids) and backend.last_version == 1
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
    (-policy.logprobs(before, temperature=SAMPLING.temperature)[before.completion_mask].sum()).backward()
    optimizer.step()
    after = _sample(policy, obs, 1)
    assert backend.last_version == 2  # the update was pushed before sampling
    assert_matches(policy, after)  # the engine scores with the new weights, through the same images (caches reset)
    backend.next_version = 7  # the collector names a push by the trainer step of its weights
    _sample(policy, obs, 2)
    assert backend.last_version == 7 and len(backend.push_seconds) == 3
    backend.next_version = None


def test_an_engine_that_dies_is_an_error_naming_the_backend_and_its_log_and_the_next_call_restarts(engine):
    policy, backend = engine
    obs = observations("qwen2_vl", 1)
    if not backend.alive:
        _sample(policy, obs, 0)
    os.kill(backend._process.pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(EngineProcessError, match=r"vllm_process.*died.*its log: .*engine\.log"):
        _sample(policy, obs, 0)
    assert time.monotonic() - t0 < 30  # no wait on a dead process
    assert not backend.alive


def test_an_engine_that_cannot_start_is_an_error_naming_the_backend_and_its_log(tmp_path):
    policy = build_tiny("qwen2_vl", seed=0)
    backend = VLLMProcessBackend(log_file=tmp_path / "bad.log", start_timeout_s=120, gpu_memory_utilization=2.0)
    policy._backend = backend
    with pytest.raises(EngineProcessError, match=r"vllm_process.*its log: .*bad\.log"):
        _sample(policy, observations("qwen2_vl", 1), 0)
    backend.close()
    assert not backend.alive
