"""The vLLM engine process (`generation_backend="vllm_process"`) on CPU: a weight push, and a sample call beside the
colocated engine's (`generation_backend="vllm"`) on the same batch.

Starts the engine process with a tiny policy, samples once (the engine is built), then `--repeats` times: changes
every weight in place, pushes (the copy into the shared-memory shadow in this process, then the child's
`reload_weights`: tied head repacked, caches reset) and times one sample call (of which the time inside the child).
With `--compare` the same is then done with a colocated engine in this process (its push is `sync_weights`), on the
same prompts with the same seeds. EOS is banned, so every row decodes its full budget. Prints the medians.

    .venv-vllm/bin/python bench/engine_push.py --model qwen2_5_vl --repeats 5 --compare
    .venv-vllm/bin/python bench/engine_push.py --compare --engine-threads 2   # the child at every core (before)

`--engine-threads` is the child's torch / OpenMP thread count (default: this process's, `--threads`); both engines
run as the trainer builds them (vLLM's compiled CPU kernels, not eager) unless `--eager`.
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
from mmrl.policy.engines.vllm_colocated import VLLMBackend  # noqa: E402
from mmrl.policy.engines.vllm_process import VLLMProcessBackend  # noqa: E402
from mmrl.types import Sampling  # noqa: E402


def measure(policy, backend, obs, sampling: Sampling, repeats: int) -> dict:
    """Start `backend` (the first call), then `repeats` x (change every weight, push, sample): medians in seconds."""
    policy._backend = backend
    torch.manual_seed(0)
    t0 = time.perf_counter()
    policy.generate(obs, group_size=1, sampling=sampling)
    first = time.perf_counter() - t0
    copies, pushes, samples = [], [], []
    for r in range(repeats):
        with torch.no_grad():
            for p in policy.model.parameters():
                p.mul_(1.0001)
        t0 = time.perf_counter()
        if isinstance(backend, VLLMProcessBackend):
            with torch.no_grad():  # the copy alone, as `push` does it first
                for name, p in policy.model.named_parameters():
                    backend._shadow[name].copy_(p)
            copies.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            backend.push(policy)
        else:
            backend.sync_weights(policy)
        pushes.append(time.perf_counter() - t0)
        torch.manual_seed(1 + r)
        t0 = time.perf_counter()
        policy.generate(obs, group_size=1, sampling=sampling)
        samples.append(time.perf_counter() - t0)
    inside = getattr(backend, "engine_seconds", [])[1:]
    return {
        "first": first,
        "push": statistics.median(pushes),
        "copy": statistics.median(copies) if copies else None,
        "sample": statistics.median(samples),
        "inside": statistics.median(inside) if inside else None,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2_5_vl")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="this process's torch threads")
    parser.add_argument("--engine-threads", type=int, default=None, help="the child's (default: --threads)")
    parser.add_argument("--compare", action="store_true", help="also the colocated engine, same batch")
    parser.add_argument("--eager", action="store_true", help="vLLM's enforce_eager (no compiled kernels)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    policy = build_tiny(args.model, seed=0)
    policy.suppress_token_ids = sorted(set(policy.suppress_token_ids) | set(policy.eos_token_ids))
    obs = sim.make("grounding", num_envs=args.prompts, image_size=112).reset(seed=list(range(args.prompts)))
    sampling = Sampling(max_new_tokens=args.new_tokens, temperature=1.0)
    options = {"enforce_eager": True} if args.eager else {}
    folder = Path(tempfile.mkdtemp(prefix="engine-push-"))
    backend = VLLMProcessBackend(log_file=folder / "engine.log", threads=args.engine_threads, **options)
    try:
        results = {"vllm_process": measure(policy, backend, obs, sampling, args.repeats)}
    finally:
        backend.close()
    if args.compare:  # last: an engine in this process binds its threads (torch.set_num_threads is a no-op after)
        colocated = VLLMBackend(log_file=folder / "colocated.log", **options)
        try:
            results["vllm"] = measure(policy, colocated, obs, sampling, args.repeats)
        finally:
            colocated.close()
    size = sum(p.numel() * p.element_size() for p in policy.model.parameters()) / 2**20
    print(
        f"\nmodel tiny:{args.model}, {size:.1f} MiB of weights; {args.prompts} prompts x {args.new_tokens} tokens; "
        f"threads: this process {args.threads}, the engine process {args.engine_threads or args.threads}; "
        f"{'eager' if args.eager else 'compiled'}; median of {args.repeats}"
    )
    print("| backend | first call (start) s | push ms | of which the copy ms | sample ms | of which in the child ms |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        copy = f"{r['copy'] * 1e3:.1f}" if r["copy"] is not None else "-"
        inside = f"{r['inside'] * 1e3:.0f}" if r["inside"] is not None else "-"
        print(f"| {name} | {r['first']:.1f} | {r['push'] * 1e3:.0f} | {copy} | {r['sample'] * 1e3:.0f} | {inside} |")
    if "vllm" in results:
        print(f"sample: vllm_process / vllm = {results['vllm_process']['sample'] / results['vllm']['sample']:.2f}x")
    for name, r in results.items():
        print(f"{name} sample calls, s: {' '.join(f'{t:.3f}' for t in r['samples'])}")


if __name__ == "__main__":
    main()
