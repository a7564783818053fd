"""Asynchronous collection with a staleness bound k (`trainer.max_staleness`), in the real trainer.

The runs train a random tiny Qwen2-VL on `grounding_letters` (conftest), whose dense reward moves the weights every
step, so rows played by other weights than the schedule's would show in the losses and the final weights.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mmrl.runtime.checkpoint import list_checkpoints
from mmrl.runtime.metrics import read_metrics
from mmrl.trainer import train

TESTS = Path(__file__).resolve().parents[1]
COMPARED = ("reward/total", "loss/policy", "grad_norm", "mismatch/kl", "pipeline/stale", "completion_len")


def _train(cfg, **kw) -> list[dict]:
    with contextlib.redirect_stdout(io.StringIO()):
        train(cfg, **kw)
    return [m for m in read_metrics(cfg.output_dir + "/metrics.jsonl") if "loss/policy" in m]


def _options(letters_env, *more) -> tuple[str, ...]:
    return (
        f"env.name={letters_env}", "trainer.eval_episodes=1", "trainer.eval_batch_size=1", "algo.group_size=4",
        "trainer.prompts_per_step=2", "trainer.lr=0.05", "trainer.total_steps=5", *more,
    )  # fmt: skip


def _weights(run: Path) -> dict[str, torch.Tensor]:
    (last,) = list_checkpoints(run)[-1:]
    return {k: v for f in sorted(last.glob("*.safetensors")) for k, v in load_file(f).items()}


def _same_history(got: list[dict], want: list[dict]) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(got, want):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key)


def test_each_step_trains_on_rows_of_the_weights_k_steps_back(tmp_path, tiny_run_config, letters_env):
    rows = _train(tiny_run_config(tmp_path, *_options(letters_env, "trainer.max_staleness=2")))
    assert [r["pipeline/stale"] for r in rows] == [0, 1, 2, 2, 2]  # min(step, k): steps 0..2 share the first weights
    assert all(r["pipeline/dropped_groups"] == 0 for r in rows)
    assert rows[0]["mismatch/kl"] < 1e-4  # sampled and scored by the same weights
    assert rows[4]["mismatch/kl"] > rows[0]["mismatch/kl"]  # two updates behind (lr 0.05 moves the tiny model)


def test_a_resume_with_unplayed_steps_requeues_them_with_their_weights(tmp_path, tiny_run_config, letters_env):
    """Stopped after step 2's checkpoint with k = 3, the queue holds steps 2..4; those not yet played are saved as
    their weights and played again on resume. Either way the resumed run is the uninterrupted one."""
    options = _options(letters_env, "trainer.max_staleness=3")
    whole = _train(tiny_run_config(tmp_path / "whole", *options))
    parts = tmp_path / "parts"
    _train(tiny_run_config(parts, *options), stop_after=2)
    queued = torch.load(list_checkpoints(parts)[-1] / "training_state.pt", weights_only=False)["prefetched"]
    assert [e["step"] for e in queued] == [2, 3, 4] and [e["version"] for e in queued] == [0, 0, 1]
    assert all(("collected" in e) != ("weights" in e) for e in queued)  # played, or its weights to play it again
    _train(tiny_run_config(parts, *options, "resume=true"))
    _same_history([m for m in read_metrics(parts / "metrics.jsonl") if "loss/policy" in m], whole)
    mine, theirs = _weights(parts), _weights(tmp_path / "whole")
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_queued_steps_older_than_a_smaller_k_are_dropped_and_played_again(tmp_path, tiny_run_config, letters_env):
    out = tmp_path / "run"
    _train(tiny_run_config(out, *_options(letters_env, "trainer.max_staleness=3")), stop_after=2)
    _train(tiny_run_config(out, *_options(letters_env, "trainer.max_staleness=1", "resume=true")))
    rows = [m for m in read_metrics(out / "metrics.jsonl") if "loss/policy" in m]
    # Steps 2, 3, 4 were queued with the weights of steps 0, 0, 1 (2-3 updates stale > 1): each dropped when due,
    # and played again with the current weights.
    assert [r["pipeline/stale"] for r in rows] == [0, 1, 0, 0, 0]
    assert [r["pipeline/dropped_groups"] for r in rows][2:] == [2, 4, 6]  # a running count: 2 groups a step


DRIVER = textwrap.dedent(
    """
    import importlib.util
    import sys

    # The suite's conftest, by path: its environment (offline, one thread, deterministic) and the tiny preset.
    spec = importlib.util.spec_from_file_location("suite_conftest", {conftest!r})
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    import sim
    from mmrl.runtime.config import load_config
    from mmrl.trainer import train

    sim.ENVS.register("grounding_letters")(conftest.LetterBonusGroundingEnv)
    train(load_config(conftest.PRESET, [*conftest.TINY_RUN, *sys.argv[1:]]))
    """
)


def test_a_run_killed_at_a_random_moment_resumes_to_the_uninterrupted_one(tmp_path, tiny_run_config, letters_env):
    """kill -9 (a real process) at a random moment after its first checkpoint, then resume: every group the killed
    run had queued is in its last checkpoint (played) or played again (its weights are there), none twice: the
    history and the final weights are the uninterrupted run's."""
    options = _options("grounding_letters", "trainer.max_staleness=2")
    whole = _train(tiny_run_config(tmp_path / "whole", *options))
    parts = tmp_path / "parts"
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(conftest=str(TESTS / "conftest.py")))
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    log = open(tmp_path / "killed.log", "w")  # noqa: SIM115  (closed below)
    child = subprocess.Popen(
        [sys.executable, str(driver), *options, f"output_dir={parts}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=TESTS.parent,
    )
    try:
        deadline = time.monotonic() + 120
        while not list_checkpoints(parts) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list_checkpoints(parts), (tmp_path / "killed.log").read_text()[-3000:]
        time.sleep(random.uniform(0.0, 1.5))  # somewhere in steps 2..4: mid-update, mid-collection, mid-save
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
        log.close()
    killed_at = len([m for m in read_metrics(parts / "metrics.jsonl") if "loss/policy" in m])
    _train(tiny_run_config(parts, *options, "resume=true"))
    rows = [m for m in read_metrics(parts / "metrics.jsonl") if "loss/policy" in m]
    _same_history(rows, whole)  # no step lost or repeated, each on the rows the uninterrupted run trained on
    mine, theirs = _weights(parts), _weights(tmp_path / "whole")
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs), f"killed after {killed_at} logged steps"


@pytest.mark.slow  # 20-40 s (the child imports torch and transformers); tests/vllm covers a failed start in CI
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here: the engine would start"
)
def test_an_engine_process_that_cannot_start_is_an_error_naming_the_backend_its_log_and_the_fix(tmp_path, tiny_policy):
    """Without vLLM (this environment) the engine process fails at once: the error names the backend, the fix and
    the log file, well within the start limit, and no process is left behind."""
    import sim
    from mmrl.policy.engines.vllm_process import EngineProcessError, VLLMProcessBackend
    from mmrl.types import Sampling

    policy = tiny_policy("qwen2_vl")
    backend = VLLMProcessBackend(log_file=tmp_path / "engine.log", start_timeout_s=120)
    policy._backend = backend
    obs = sim.make("grounding", num_envs=1, image_size=112).reset(seed=[0])
    t0 = time.monotonic()
    with pytest.raises(EngineProcessError, match=r"vllm_process.*starting.*make setup-vllm.*its log: .*engine\.log"):
        policy.generate(obs, group_size=1, sampling=Sampling(max_new_tokens=2))
    assert time.monotonic() - t0 < 100
    assert not backend.alive


def test_the_collector_copys_weights_version_moves_when_a_queued_steps_weights_are_written(tiny_policy):
    """The colocated vLLM engine re-syncs when `weights_version` moves. The collector thread's copy trains nothing
    (no parameter requires a gradient) and gets each queued step's weights written into it: its version must move
    then, or the engine samples every step with the first weights it was given."""
    from mmrl.policy.engines.vllm_prompts import weights_version
    from mmrl.stages.collect import policy_copy

    policy = tiny_policy("qwen2_vl", seed=0)
    copy = policy_copy(policy)
    assert not any(p.requires_grad for p in copy.model.parameters())
    before = weights_version(copy.model)
    with torch.no_grad():  # what `Collector._serve` does with a queued step's snapshot
        for name, p in copy.model.named_parameters():
            p.copy_(dict(policy.model.named_parameters())[name] + 0.01)
    assert weights_version(copy.model) != before
    assert weights_version(copy.model) == weights_version(copy.model)  # unchanged weights: the same version
