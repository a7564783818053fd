"""bench/gpu_check.py: its dry run plays every part at tiny size on the CPU and reads each part's figures back; a part
past its limit is stopped (a child's process group killed) and one that cannot fit the budget is skipped, each saying
so, and the next part still runs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.py"


def _gpu_check():
    if "gpu_check_bench" not in sys.modules:  # registered first: its dataclasses look their module up
        spec = importlib.util.spec_from_file_location("gpu_check_bench", SCRIPT)
        sys.modules["gpu_check_bench"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["gpu_check_bench"]


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def test_the_dry_run_plays_every_part_and_reads_its_figures(tmp_path):
    done = _run("--dry-run", "--out", str(tmp_path), timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    parts = {r["part"]: r for r in report["parts"]}
    assert list(parts) == [p.name for p in _gpu_check().PARTS]
    assert report["dry_run"] is True
    has = lambda module: importlib.util.find_spec(module) is not None  # noqa: E731
    ran = {"generation", "pi0_step", "gpu_tests", "fsdp_nccl", "train_3b"} | ({"grpo_step"} if has("trl") else set())
    for name in ran:
        assert parts[name]["status"] == "ok", parts[name]
    figures = {name: parts[name]["figures"] for name in ran}
    assert figures["generation"]["hf tokens/s"] > 0 and figures["generation"]["static / hf"] > 0
    assert figures["pi0_step"]["update step s"] > 0 and figures["pi0_step"]["chunk ms, batch 1"] > 0
    assert figures["gpu_tests"]["collected"] >= 8  # the -m gpu tests of test_cuda.py and test_backends.py
    assert figures["fsdp_nccl"]["steps"] == figures["train_3b"]["steps"] == 1  # each run trained its one step
    if has("trl"):
        assert figures["grpo_step"]["TRL / mmrl step"] > 0
    if not has("vllm"):  # this environment (the main one) has no vLLM: its parts say so
        for name in ("vllm_generation", "vllm_gpu_tests"):
            assert parts[name]["status"] == "skipped" and "no vLLM" in parts[name]["reason"]
    table = (tmp_path / "gpu_check.md").read_text()
    assert all(f"| `{name}` |" in table for name in parts)


def test_parts_that_cannot_fit_the_budget_are_skipped_saying_so(tmp_path):
    done = _run("--dry-run", "--budget", "1", "--out", str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    parts = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]
    assert {r["status"] for r in parts} == {"skipped"}
    assert "would overrun: expected 8 s" in parts[0]["reason"]  # the generation part's dry-run estimate
    unknown = _run("--dry-run", "--parts", "generation,nope", "--out", str(tmp_path), timeout=300)
    assert unknown.returncode == 2 and "unknown part 'nope'" in unknown.stderr


def test_a_part_past_its_limit_is_stopped_and_its_child_killed(tmp_path):
    gpu_check = _gpu_check()
    ctx = gpu_check.Context(tmp_path, dry_run=True, vllm_python=None, gpus=0)
    pid_file = tmp_path / "pid"
    sleeper = [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
               "time.sleep(60)"]  # fmt: skip
    slow = gpu_check.Part("slow", "a child that sleeps", 1, 1, lambda ctx: gpu_check.child(ctx, "slow", sleeper))
    start = time.monotonic()
    result = gpu_check.run_part(slow, ctx, limit_s=5)
    assert result["status"] == "timed out" and "limit of 5 s" in result["reason"]
    assert time.monotonic() - start < 20
    with pytest.raises(ProcessLookupError):  # the child is gone, not left sleeping
        os.kill(int(pid_file.read_text()), 0)
    failing = gpu_check.Part("bad", "a child that fails", 1, 1, lambda ctx: gpu_check.child(
        ctx, "bad", [sys.executable, "-c", "raise SystemExit('the reason it gives')"]))  # fmt: skip
    result = gpu_check.run_part(failing, ctx, limit_s=30)
    assert (
        result["status"] == "failed"
        and "exit code 1" in result["reason"]
        and "the reason it gives" in result["reason"]
    )
