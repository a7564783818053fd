"""The colocated `vllm` backend under torchrun: one in-process engine per rank.

Each rank's `VLLMBackend` builds its engine with `distributed_executor_backend="external_launcher"` and
tensor_parallel_size 1 inside the trainer's process, whose default process group (gloo, WORLD_SIZE 2) torchrun's
environment already started: vLLM reuses that group and lays its ranks out as an outer "external" data-parallel
dimension of engines that each generate alone (as verl runs its colocated rollout engines), so every rank's engine
samples its own prompts and no collective runs while it samples. What made it fail before, and is checked here:
the engine folder's `architectures` must be the model's own class (the rank's model is FSDP2's subclass
`FSDPQwen3VLForConditionalGeneration`, which vLLM refused), and the re-sync check must read the shards' version
counters (`distributed.parameter_versions`): the whole parameters `full_weights` gathers keep theirs across an update,
so the engine went on sampling with its first weights (seen: step 2's `mismatch/kl` 0.26 against 2e-9).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch.distributed.fsdp import FSDPModule

from mmrl.runtime.distributed import unsharded_class

_SPEC = importlib.util.spec_from_file_location("_engine_torchrun", Path(__file__).with_name("test_engine_torchrun.py"))
runs = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(runs)  # its launchers (each with a timeout that kills the process group) and its demo run

RUN = {**runs.RUN, "trainer": {**runs.RUN["trainer"], "total_steps": 2, "max_staleness": 0, "save_every": 0}}
COMPARED = tuple(key for key in runs.COMPARED if key != "pipeline/stale")  # synchronous: no pipeline


def test_the_engine_is_named_by_the_models_own_class_not_fsdps_subclass():
    """`fully_shard` swaps a module's class for `FSDP<cls>(FSDPModule, cls)`; vLLM knows `cls`'s name only."""
    module = torch.nn.Linear(2, 2)
    assert unsharded_class(module) is torch.nn.Linear
    module.__class__ = type("FSDPLinear", (FSDPModule, torch.nn.Linear), {})  # what `fully_shard` does to it
    assert unsharded_class(module) is torch.nn.Linear


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_each_rank_samples_with_its_colocated_engine_what_one_process_samples(tmp_path):
    """`vllm` under a 2-process torchrun (gloo), synchronous: the two ranks' engines log what one process with one
    engine and the same two shards logs, and the engines' log-probs equal the training forward's at both steps, so
    the weights re-synced after the first update."""
    config = tmp_path / "vllm.yaml"
    config.write_text(runs.yaml.safe_dump({**RUN, "model": {**RUN["model"], "generation_backend": "vllm"}}))
    runs.torchrun(tmp_path / "two.log", config, tmp_path / "two", timeout=900)
    runs.one_process(tmp_path, config, tmp_path / "one", timeout=600)
    got, want = runs.training_rows(tmp_path / "two"), runs.training_rows(tmp_path / "one")
    assert [m["step"] for m in got] == [m["step"] for m in want] == [1, 2]
    for g, w in zip(got, want):
        for key in COMPARED:
            assert g[key] == pytest.approx(w[key], rel=1e-4, abs=1e-6), f"step {w['step']}: {key}"
    assert got[0]["grad_norm"] > 0.1  # a real update: an engine left with the first weights would show at step 2
    # As in test_vllm_backend.py: float32 on both sides, 1e-4 per token (seen: 1.4e-5 and 2.0e-5, KL 2e-9; an engine
    # that missed the update: 0.42 and KL 0.26 at step 2).
    for m in got:
        assert m["mismatch/abs_logprob_diff"] < 1e-4 and m["mismatch/kl"] < 1e-6, f"step {m['step']}"
