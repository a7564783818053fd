"""Set-up of the vLLM tests (run inside .venv-vllm, see pytest.ini): offline, caches in a throwaway folder, and an
in-process engine with a small CPU KV cache. Set at import, before vLLM or transformers is imported."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

_SCRATCH = tempfile.mkdtemp(prefix="mmrl-vllm-tests-")
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
os.environ["HF_HUB_OFFLINE"] = "1"  # no test reaches a model hub
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB: the tiny models need a few MB
os.environ["VLLM_NO_USAGE_STATS"] = "1"
os.environ["DO_NOT_TRACK"] = "1"
for _var, _sub in (("HOME", "home"), ("XDG_CACHE_HOME", "cache"), ("VLLM_CACHE_ROOT", "vllm")):
    os.environ[_var] = os.path.join(_SCRATCH, _sub)
    os.makedirs(os.environ[_var], exist_ok=True)

# vLLM inspects each model class in a fresh Python process (to keep CUDA uninitialised in the engine's parent), which
# re-imports vLLM: 20-30 s per architecture on a 2-core machine, most of this suite's time. There is no CUDA to protect
# on the CPU build, so the tests inspect in this process. Engine behaviour is unchanged (the same model info results).
from vllm.model_executor.models import registry as _registry  # noqa: E402

if hasattr(_registry, "_run_in_subprocess"):
    _registry._run_in_subprocess = lambda fn: fn()
