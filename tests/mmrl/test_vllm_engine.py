"""The vllm backend's engine tests (tests/vllm), run inside vLLM's own environment in a pytest process of their own.

They need `.venv-vllm` (`make setup-vllm`; `make test` tries to build it) and run apart from this suite for three
reasons: vLLM pins transformers below the main environment's; an in-process engine turns `torch.set_num_threads`
into a no-op for the rest of its process and sets RANK, MASTER_PORT and the like; and a wedged engine spins rather
than fails, so the subprocess gets a per-test timeout (tests/vllm/pytest.ini) and an overall one here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("MMRL_VLLM_VENV") or ROOT / ".venv-vllm")
STAMP = VENV / ".mmrl-vllm"
# The suite takes a few minutes on a 2-core machine (the colocated backend's engines: one per tiny Qwen architecture,
# a VLA's, a few started to fail; the engine process's); tests marked slow are left out (`-m slow` runs them).
OVERALL_TIMEOUT_S = 1200


@pytest.mark.skipif(
    not STAMP.is_file(),
    reason=f"vLLM's environment is not built ({STAMP} is missing): run `make setup-vllm` (scripts/setup_vllm.sh)",
)
def test_the_vllm_backend_suite_passes_in_its_own_environment():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTHONPATH")}
    command = [
        str(VENV / "bin" / "python"), "-m", "pytest", "-c", "tests/vllm/pytest.ini", "tests/vllm", "-q", "-rfEs",
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=OVERALL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as e:
        output = (e.stdout or b"")[-20000:]
        pytest.fail(f"the vLLM tests ran past {OVERALL_TIMEOUT_S} s (a wedged engine?):\n{output!s}")
    output = done.stdout + done.stderr
    if done.returncode != 0:
        sys.stdout.write(output[-20000:])
    assert done.returncode == 0, f"the vLLM tests failed (exit {done.returncode}):\n{output[-20000:]}"
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1], done.stdout[-2000:]
