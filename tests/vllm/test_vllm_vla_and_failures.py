"""The vllm backend for an action-token VLA, and an engine that fails: one engine shared by the module.

A VLA (the reach preset's: the tiny Qwen3-VL plus 17 action tokens per dimension, 2 dimensions) samples exactly C*D
action tokens through vLLM (`allowed_token_ids`), and vLLM's processed log-probs are those of the training forward
under the same restriction (`VLMPolicy.logprobs` takes the log-softmax over the action tokens only), before and after
an optimiser step that moves the new action rows. Tolerance 1e-4, as in test_vllm_backend.py (both float32; seen
within about 1e-6). Without the restriction in either the sampler or the log-probs the values would be off by
`log p(action tokens)`, several nats for a random model: the test checks that gap too.

Then the same engine fails, as an in-process engine can (the colocated backend runs vLLM's worker in the trainer's
process: there is no worker process of its own to kill): its worker raises in the middle of a call, or its steps stop
making progress; and a fresh engine gets no memory for its KV cache. Each gives a `VLLMEngineError` naming the backend
and the log file vLLM wrote, within the call's time limit, and leaves the engine shut down.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import sim
from mmrl.policy import Sampling, add_action_tokens, build_tiny
from mmrl.policy.engines.vllm_colocated import VLLMEngineError

SAMPLING = Sampling(temperature=1.0)
GROUP = 4
ATOL = 1e-4


def vla(seed: int = 0):
    policy = build_tiny("qwen3_vl", seed=seed, prompt_template="{instruction} {image}")
    add_action_tokens(policy, torch.full((2,), -1.0), torch.ones(2), bins=17)
    return policy


def reach_obs(worlds: int = 2):
    env = sim.make("reach", num_envs=worlds, image_size=128, camera="ego")
    return env.reset(seed=list(range(worlds))).select([i for i in range(worlds) for _ in range(GROUP)])


@pytest.fixture(scope="module")
def engine_vla(tmp_path_factory):
    policy = vla()
    log = tmp_path_factory.mktemp("log") / "vllm.log"
    policy.set_generation_backend("vllm", max_model_len=1024, enforce_eager=True, log_file=log)
    yield policy, log
    policy.close()


def sample(policy, obs, seed: int = 0):
    torch.manual_seed(seed)
    return policy.generate(obs, group_size=GROUP, sampling=SAMPLING)


def unrestricted(policy, rollout) -> torch.Tensor:
    """The training forward's log-probs over the whole vocabulary (no action-token restriction)."""
    policy._restrict, policy.token_index = (lambda logits: logits), (lambda ids: ids)
    try:
        with torch.no_grad():
            return policy.logprobs(rollout, temperature=SAMPLING.temperature)
    finally:
        del policy._restrict, policy.token_index


def assert_vla_matches(policy, rollout) -> float:
    codec = policy.action_codec
    assert rollout.completion_mask.all() and rollout.completion_ids.shape[1] == codec.tokens_per_generation
    assert torch.isin(rollout.completion_ids, codec.token_ids.to(rollout.completion_ids.device)).all()
    with torch.no_grad():
        want = policy.logprobs(rollout, temperature=SAMPLING.temperature)
    torch.testing.assert_close(rollout.logprobs, want, rtol=0, atol=ATOL)
    gap = (rollout.logprobs - unrestricted(policy, rollout)).min().item()
    assert gap > 1.0, f"the restriction moves the log-probs by only {gap:.2f}: the test would not see it missing"
    return (rollout.logprobs - want).abs().max().item()


def test_a_vla_samples_its_action_tokens_with_the_training_forwards_logprobs(engine_vla):
    policy, _ = engine_vla
    obs = reach_obs()
    rollout = sample(policy, obs)
    print(f"VLA: max |vLLM - forward| = {assert_vla_matches(policy, rollout):.2e}")
    actions = policy.action_codec.decode(rollout.completion_ids.cpu())  # [R, C, D] within the env's bounds
    assert actions.shape == (2 * GROUP, 1, 2) and actions.abs().max() <= 1

    before = copy.deepcopy(policy)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
    (-policy.logprobs(rollout, temperature=SAMPLING.temperature).mean()).backward()
    optimizer.step()
    optimizer.zero_grad()
    after = sample(policy, obs, seed=1)
    diff = assert_vla_matches(policy, after)
    with torch.no_grad():
        stale = before.logprobs(after, temperature=SAMPLING.temperature)
    assert (stale - after.logprobs).abs().max() > 100 * ATOL  # the step reached the engine, action rows included
    print(f"VLA after one AdamW step: max |vLLM - forward| = {diff:.2e}")


def assert_names_the_backend_and_its_log(error: pytest.ExceptionInfo, log) -> None:
    message = str(error.value)
    assert "generation_backend='vllm'" in message and f"its log: {log}" in message, message
    text = open(log).read()  # vLLM's own lines and the failure's traceback, kept in the named file
    assert "vllm.mmrl: the vllm backend's engine" in text and "Traceback" in text, text[-2000:]


def test_a_worker_failing_mid_call_is_named_and_the_engine_shut_down(engine_vla):
    policy, log = engine_vla
    obs = reach_obs()
    sample(policy, obs)  # the engine runs

    def failing_after_one_step(worker):
        run, calls = worker.model_runner.execute_model, []

        def execute_model(*args, **kwargs):
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("the worker died")
            return run(*args, **kwargs)

        worker.model_runner.execute_model = execute_model

    policy.backend.llm.collective_rpc(failing_after_one_step)
    with pytest.raises(VLLMEngineError, match="failed while sampling .*the worker died") as error:
        sample(policy, obs)
    assert_names_the_backend_and_its_log(error, log)
    assert policy.backend.llm is None  # shut down: the next call starts a fresh engine
    assert_vla_matches(policy, sample(policy, obs))


def test_a_wedged_engine_times_out_instead_of_hanging(engine_vla, monkeypatch):
    """Steps that make no progress (how the engine spun on a stale encoder cache) end at the call's time limit."""
    policy, log = engine_vla
    obs = reach_obs()
    sample(policy, obs)  # the engine runs
    monkeypatch.setattr(policy.backend, "timeout_s", 2.0)
    monkeypatch.setattr(policy.backend.llm.llm_engine, "step", lambda: [])
    start = time.monotonic()
    with pytest.raises(VLLMEngineError, match=r"unfinished after 2 s") as error:
        sample(policy, obs)
    assert time.monotonic() - start < 30
    assert_names_the_backend_and_its_log(error, log)
    assert policy.backend.llm is None


def test_a_prefix_cache_vllm_could_not_reset_after_a_push_is_an_error(engine_vla, monkeypatch):
    """After a weight push the cached prompt keys are the old weights'; vLLM's reset answers False where it could not
    drop them, and sampling on would read them: the push fails, named, instead."""
    policy, log = engine_vla
    obs = reach_obs()
    sample(policy, obs)  # the engine runs, synced
    monkeypatch.setattr(policy.backend.llm, "reset_prefix_cache", lambda *args, **kwargs: False)
    with torch.no_grad():
        next(p for p in policy.model.parameters() if p.requires_grad).add_(1e-3)  # new weights: the next call pushes
    with pytest.raises(VLLMEngineError, match="did not reset its prefix cache") as error:
        sample(policy, obs)
    assert_names_the_backend_and_its_log(error, log)
    assert policy.backend.llm is None  # shut down: the next call starts a fresh engine
    monkeypatch.undo()
    assert_vla_matches(policy, sample(policy, obs))


def test_an_engine_without_memory_for_its_kv_cache_says_so(monkeypatch, tmp_path):
    policy = vla()
    log = tmp_path / "vllm.log"
    policy.set_generation_backend("vllm", max_model_len=1024, enforce_eager=True, log_file=log)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0")  # GiB: nothing for the KV cache
    with pytest.raises(VLLMEngineError, match="did not start .*needs more memory than it was given") as error:
        sample(policy, reach_obs(1))
    assert_names_the_backend_and_its_log(error, log)
    assert "VLLM_CPU_KVCACHE_SPACE" in str(error.value) and policy.backend.llm is None


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about 8 minutes on a shared 2-core machine
def test_the_vla_reach_preset_trains_through_vllm(tmp_path):
    """`mmrl train configs/vla_reach_tiny.yaml model.generation_backend=vllm` for 2 steps (its cold start shortened):
    the run ends cleanly, every step logs `mismatch/*` with vLLM's log-probs equal to the trainer's recomputation
    (KL < 1e-3), and every call was seeded (no "samples unseeded" warning). Minutes on a 2-core machine: opt in with
    `-m slow`."""
    root = Path(__file__).resolve().parents[2]
    command = [
        sys.executable, "-m", "mmrl", "train", str(root / "configs" / "vla_reach_tiny.yaml"),
        "model.generation_backend=vllm", "trainer.total_steps=2", "trainer.threads=1", "sft.episodes=32",
        "sft.steps=10", "trainer.eval_episodes=32", "trainer.eval_every=0", f"output_dir={tmp_path / 'run'}",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=1700, check=False)
    assert done.returncode == 0, done.stderr[-5000:]
    assert "samples unseeded" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-5000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in steps if "loss/policy" in m]
    assert [m["step"] for m in trained] == [1, 2]
    for m in trained:
        assert m["mismatch/kl"] < 1e-3 and m["mismatch/abs_logprob_diff"] < 1e-4, m
