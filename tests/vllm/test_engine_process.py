"""vLLM in a process of its own (`generation_backend="vllm_process"`, mmrl/policy/engines/vllm_process.py) on vLLM's CPU build.

One engine process for the module (starting one takes 30-60 s here: the child imports vLLM and builds the engine).
What it samples is what the training forward scores (the tolerance of test_vllm_backend.py, same reasons), before and
after an update pushed through the shared-memory weights; every call returns the version of the weights that made it;
an engine that dies is a clear error naming the backend and its log, within the call's time limit, and the next call
starts a new one.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmrl.policy import build_tiny
from mmrl.policy.engines.vllm_colocated import VLLMBackend
from mmrl.policy.engines.vllm_process import EngineProcessError, VLLMProcessBackend, weight_source
from mmrl.policy.lora import apply_lora, plain_model
from mmrl.runtime.distributed import unsharded_module

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
    backend = VLLMProcessBackend(log_file=log, timeout_s=120, start_timeout_s=400, threads=1)
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
    # The child kept the thread count it was given through vLLM's start (left at torch's default, every core, its
    # compiled kernels ran 7x slower than the colocated engine's here: BENCHMARKS.md).
    assert backend.engine_threads == backend.threads == 1
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


def test_a_lora_policy_samples_through_the_engine_as_its_training_forward_scores(engine):
    """The engine's model is the plain class built from the config; a LoRA policy's pushes are its merged weights."""
    pytest.importorskip("peft", reason="LoRA needs peft, which make setup-vllm installs into .venv-vllm")
    policy, backend = engine
    lora = apply_lora(copy.deepcopy(policy), r=4, seed=0)  # the copy talks to the same engine process
    assert lora.backend is backend
    obs = observations("qwen2_vl", 1)
    rollout = _sample(lora, obs, 3)
    optimizer = torch.optim.AdamW([p for p in lora.model.parameters() if p.requires_grad], lr=5e-2)
    (-lora.logprobs(rollout, temperature=SAMPLING.temperature)[rollout.completion_mask].sum()).backward()
    optimizer.step()  # lora_B leaves zero: the adapters now change the forward
    after = _sample(lora, obs, 4)
    assert backend._synced_policy == id(lora)
    assert_matches(lora, after)


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


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_a_bad_thread_count_is_refused_naming_the_field(threads):
    with pytest.raises(ValueError, match="vllm_process backend's threads"):
        VLLMProcessBackend(threads=threads)


@pytest.mark.parametrize("arch,lora", [("qwen2_vl", False), ("qwen2_vl", True), ("llava_onevision", False)])
def test_the_gpu_weight_transfer_sends_the_names_and_tensors_the_cpu_route_loads(arch, lora):
    """The GPU route's `WeightSource` yields, in order, the names and values the CPU route hands vLLM's
    `reload_weights` (the parent writes the shared-memory shadow, the child's backend syncs from it): the hub
    checkpoint names, which LLaVA-OneVision's vision tower needs (`vision_tower.vision_model.*`; transformers' own
    name `model.vision_tower.*` is what the GPU route sent before), with LoRA merged."""
    if lora:
        pytest.importorskip("peft", reason="LoRA needs peft, which make setup-vllm installs into .venv-vllm")
    policy = build_tiny(arch, seed=0)
    if lora:
        policy = apply_lora(policy, r=4, seed=0)
        with torch.no_grad():  # B = 0 at the start: move it, so that merging shows
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)
    # The CPU route, as the engine process runs it: the parent's push into a shadow built from the config...
    process = VLLMProcessBackend()
    shadow = copy.copy(policy)
    shadow.model = unsharded_module(plain_model(policy.model))
    process._shadow = dict(shadow.model.named_parameters())
    process._write_shadow(policy)
    # ...and the child's colocated backend syncing from it (the engine's calls recorded, none started).
    loaded = []
    engine = SimpleNamespace(reset_encoder_cache=lambda: None)
    colocated = VLLMBackend()
    colocated.llm = SimpleNamespace(
        collective_rpc=lambda method, kwargs: loaded.extend(kwargs["weights_iterator"]),
        apply_model=lambda fn: None,
        llm_engine=engine,
        reset_prefix_cache=lambda: None,
    )
    colocated.sync_weights(shadow)
    source = weight_source(policy)  # the GPU route's
    sent = list(source)
    assert [n for n, _ in sent] == [n for n, _ in loaded] and len(sent) > 10
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(sent, loaded))
    assert [(m.name, m.dtype, m.shape) for m in source.metadata()] == [(n, t.dtype, tuple(t.shape)) for n, t in sent]
    if arch == "llava_onevision":
        names = [n for n, _ in sent]
        assert any(n.startswith("vision_tower.vision_model.") for n in names)
        assert not any(n.startswith("model.vision_tower.") for n in names)
    if lora:  # merged: the same names as the policy before LoRA, and some weights moved by the adapters
        base = dict(weight_source(build_tiny(arch, seed=0)))
        assert [n for n, _ in sent] == list(base)
        assert any(not torch.equal(t, base[n]) for n, t in sent)


DRIVER = """
import copy
import importlib.util
import sys

# The main suite's conftest, by path: its tiny preset and the grounding env with a dense `letters` reward (weights
# move every step, so rows played by other weights than the schedule's would show in the history).
spec = importlib.util.spec_from_file_location("suite_conftest", {conftest!r})
conftest = importlib.util.module_from_spec(spec)
spec.loader.exec_module(conftest)
import sim
from mmrl.runtime.config import load_config
from mmrl.trainer import train

sim.ENVS.register("grounding_letters")(conftest.LetterBonusGroundingEnv)
if __name__ == "__main__":  # the engine process is spawned: it re-imports this script
    train(load_config(conftest.PRESET, [*conftest.TINY_RUN, *sys.argv[1:]]))
"""
OPTIONS = (
    "env.name=grounding_letters", "trainer.eval_episodes=1", "trainer.eval_batch_size=1", "algo.group_size=4",
    "trainer.lr=0.05", "trainer.total_steps=4", "model.generation_backend=vllm_process", "trainer.max_staleness=2",
)  # fmt: skip
COMPARED = ("reward/total", "loss/policy", "grad_norm", "mismatch/kl", "pipeline/stale")


def _launch(tmp_path, out, *more):
    import subprocess
    import sys

    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(conftest=str(Path(__file__).resolve().parents[1] / "conftest.py")))
    log = open(tmp_path / f"{Path(out).name}.log", "w")  # noqa: SIM115  (the child holds it; closed with it)
    return subprocess.Popen(
        [sys.executable, str(driver), *OPTIONS, f"output_dir={out}", *more],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=Path(__file__).resolve().parents[2],
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
    )


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_an_asynchronous_run_through_the_engine_killed_and_resumed_equals_the_uninterrupted_one(tmp_path):
    """k = 2 through the engine process; the trainer killed with SIGKILL at a random moment after its first
    checkpoint (its engine process ends with it: the pipe closes), then resumed with a new engine: the history is the
    uninterrupted run's, step for step. 3-6 min on a 2-core machine (three engines start)."""
    import random

    from mmrl.runtime.checkpoint import list_checkpoints
    from mmrl.runtime.metrics import read_metrics

    whole = _launch(tmp_path, tmp_path / "whole")
    assert whole.wait(timeout=900) == 0, (tmp_path / "whole.log").read_text()[-3000:]
    parts = tmp_path / "parts"
    child = _launch(tmp_path, parts)
    try:
        deadline = time.monotonic() + 600
        while not list_checkpoints(parts) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list_checkpoints(parts), (tmp_path / "parts.log").read_text()[-3000:]
        time.sleep(random.uniform(0.0, 20.0))
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=60)
    resumed = _launch(tmp_path, parts, "resume=true")
    assert resumed.wait(timeout=900) == 0, (tmp_path / "parts.log").read_text()[-3000:]
    want = [m for m in read_metrics(tmp_path / "whole" / "metrics.jsonl") if "loss/policy" in m]
    got = [m for m in read_metrics(parts / "metrics.jsonl") if "loss/policy" in m]
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3, 4]
    assert [r["pipeline/stale"] for r in got] == [0, 1, 2, 2]
    for a, b in zip(got, want):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], abs=1e-5), (a["step"], key)


@pytest.mark.gpu
def test_on_a_gpu_pushes_go_through_vllms_weight_transfer_and_the_samples_score_as_the_training_forward(tmp_path):
    """GPU only (`-m gpu`): after the first sample, pushes use vLLM's IPC weight transfer
    (`init_weight_transfer_engine`, `start_weight_update`, `update_weights`, `finish_weight_update`)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    policy = build_tiny("qwen2_vl", seed=0)
    policy.model.to("cuda")
    backend = VLLMProcessBackend(log_file=tmp_path / "engine.log", timeout_s=300, start_timeout_s=600)
    policy._backend = backend
    try:
        obs = observations("qwen2_vl", 1)
        before = _sample(policy, obs, 0)
        optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
        (-policy.logprobs(before, temperature=SAMPLING.temperature)[before.completion_mask].sum()).backward()
        optimizer.step()
        after = _sample(policy, obs, 1)
        assert backend._transfer is not None and backend.last_version == 2
        assert_matches(policy, after)
    finally:
        backend.close()
