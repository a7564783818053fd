"""How long a weight push to the vLLM engine process takes (`generation_backend="vllm_process"`), on CPU.

Starts the engine with a tiny policy, samples once (the engine is built), then times `--repeats` pushes, each after
an in-place change of every weight: the copy into the shared-memory shadow (this process) and the child's
`reload_weights` (tied head repacked, caches reset). Prints the median of each and one sample call's time.

    .venv-vllm/bin/python bench/engine_push.py --model qwen2_5_vl --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import sim  # noqa: E402
from mmrl.policy import build_tiny  # noqa: E402
from mmrl.policy.vllm_engine import VLLMProcessBackend  # noqa: E402
from mmrl.types import Sampling  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2_5_vl")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    policy = build_tiny(args.model, seed=0)
    log = Path(tempfile.mkdtemp(prefix="engine-push-")) / "engine.log"
    backend = VLLMProcessBackend(log_file=log)
    policy._backend = backend
    obs = sim.make("grounding", num_envs=8, image_size=112).reset(seed=list(range(8)))
    sampling = Sampling(max_new_tokens=16, temperature=1.0)
    try:
        t0 = time.perf_counter()
        policy.generate(obs, group_size=1, sampling=sampling)
        start = time.perf_counter() - t0
        copies, pushes, samples = [], [], []
        for _ in range(args.repeats):
            with torch.no_grad():
                for p in policy.model.parameters():
                    p.mul_(1.0001)
            t0 = time.perf_counter()
            with torch.no_grad():
                for name, p in policy.model.named_parameters():
                    backend._shadow[name].copy_(p)
            copies.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            backend.push(policy)
            pushes.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            policy.generate(obs, group_size=1, sampling=sampling)
            samples.append(time.perf_counter() - t0)
    finally:
        backend.close()
    size = sum(p.numel() * p.element_size() for p in policy.model.parameters()) / 2**20
    print(f"model tiny:{args.model}, {size:.1f} MiB of weights; first sample (engine start) {start:.1f} s")
    print(f"push (copy + reload), median of {args.repeats}: {statistics.median(pushes) * 1e3:.0f} ms")
    print(f"  of which the copy into shared memory: {statistics.median(copies) * 1e3:.1f} ms")
    print(f"sample 8 prompts x 16 tokens after a push: {statistics.median(samples) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
