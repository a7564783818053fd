"""Generation speed of each backend behind `VLMPolicy.generate`: tokens per second, and the ratio to `hf`.

    .venv/bin/python bench/generation.py --model tiny:qwen2_5_vl --device cpu --batch 16 --new-tokens 32
    .venv/bin/python bench/generation.py --model random:qwen2_5_vl_3b --device cuda --dtype bfloat16 --batch 64
    .venv/bin/python bench/generation.py --model /path/to/Qwen2.5-VL-3B-Instruct --device cuda --dtype bfloat16

`--model` is a checkpoint folder, `tiny:<arch>` (the random tiny models of the tests), or `random:qwen2_5_vl_3b`: the
real Qwen2.5-VL-3B-Instruct architecture (its public config.json, written out below) with random weights and the
tiny local tokenizer, so nothing is downloaded; its vocabulary keeps the real 151,936 rows, so the output head costs
what it costs in the real model.

What is timed: `policy.generate` on `--batch` rows (`--batch / --group-size` grounding prompts, `--group-size`
samples each, temperature 1), prompt encoding and decoding included, as the trainer calls it. EOS is banned (added
to the policy's suppressed tokens), so every row generates exactly `--new-tokens` tokens and backends are compared
on equal work. Each backend runs `--warmup` untimed calls (the static backend compiles on CUDA during the first;
its time is reported as `first call`), then `--repeats` timed calls; the table shows the median. The `same` column
says whether the backend sampled exactly the `hf` tokens from the same seed (expected of `static` on CPU; compiled
kernels may round differently on a GPU). `lean` draws with its own exact sampler (`mmrl.policy.sampling`), so its
tokens differ from `hf`'s by design; that it samples the same distribution is what tests/mmrl/test_backends.py and
tests/mmrl/test_sampling.py check.

Backends: hf, lean and static always; vllm when vLLM is importable (last: an in-process engine takes over torch's
CPU threads). On CPU vLLM lives in its own environment (`make setup-vllm`), so the sitting that compares all four runs
there, every backend on that environment's transformers:

    .venv-vllm/bin/python bench/generation.py --model tiny:qwen2_5_vl --device cpu --batch 16 --new-tokens 32
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

import torch  # noqa: E402

import sim  # noqa: E402
from mmrl.policy import Sampling, VLMPolicy, build_tiny  # noqa: E402
from mmrl.policy.vlm.tiny import tiny_processor  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Qwen/Qwen2.5-VL-3B-Instruct config.json (public), in transformers 5.x field names (rope_scaling -> rope_parameters).
QWEN2_5_VL_3B_TEXT = {
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 128000,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "sliding_window": 32768,
    "use_sliding_window": False,
    "max_window_layers": 70,
    "attention_dropout": 0.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
}
QWEN2_5_VL_3B_VISION = {
    "depth": 32,
    "hidden_act": "silu",
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_channels": 3,
    "out_hidden_size": 2048,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "tokens_per_second": 2,
}


def random_qwen2_5_vl_3b(device: str, dtype: torch.dtype, **policy_kwargs) -> VLMPolicy:
    """The real 3B architecture with random weights, built on `device` directly (no CPU copy of 15 GB)."""
    from transformers import AutoModelForImageTextToText, Qwen2_5_VLConfig

    processor = tiny_processor("qwen2_5_vl")  # the real chat template and image processor settings, tiny vocab
    tok = processor.tokenizer
    # Special tokens take the tiny tokenizer's ids (the model's own would be ids the tokenizer does not have).
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in [("image_token_id", "<|image_pad|>"),
           ("video_token_id", "<|video_pad|>"), ("vision_start_token_id", "<|vision_start|>"),
           ("vision_end_token_id", "<|vision_end|>")]}  # fmt: skip
    text = {**QWEN2_5_VL_3B_TEXT, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    config = Qwen2_5_VLConfig(text_config=text, vision_config=QWEN2_5_VL_3B_VISION, tie_word_embeddings=True, **ids)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return VLMPolicy(model, processor, **policy_kwargs)


def load(spec: str, device: str, dtype: torch.dtype) -> VLMPolicy:
    if spec == "random:qwen2_5_vl_3b":
        return random_qwen2_5_vl_3b(device, dtype)
    if spec.startswith("tiny:"):
        policy = build_tiny(spec.removeprefix("tiny:"), seed=0)
        policy.model.to(device=device, dtype=dtype)
        return policy
    if spec.startswith("random:"):
        raise SystemExit(f"unknown random model {spec!r}; the one known is random:qwen2_5_vl_3b")
    return VLMPolicy.from_pretrained(spec, dtype=dtype, device=device)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_backend(policy: VLMPolicy, backend: str, obs, args) -> dict:
    if backend == "vllm":
        # On CPU: eager (vLLM's torch.compile of the model needs a C++ toolchain and minutes on 2 cores).
        policy.set_generation_backend(
            "vllm",
            gpu_memory_utilization=args.vllm_memory,
            max_model_len=args.vllm_max_model_len,
            enforce_eager=not args.device.startswith("cuda"),
        )
    else:
        policy.generation_backend = backend
    sampling = Sampling(max_new_tokens=args.new_tokens, temperature=1.0)
    times, tokens, first, ids = [], 0, None, None
    for call in range(args.warmup + args.repeats):
        torch.manual_seed(call)
        sync(args.device)
        start = time.perf_counter()
        rollout = policy.generate(obs, group_size=args.group_size, sampling=sampling)
        sync(args.device)
        elapsed = time.perf_counter() - start
        if call == 0:
            first = elapsed
        if call == args.warmup:
            ids = rollout.completion_ids.cpu()  # the first timed call's tokens (seed = warmup)
        if call >= args.warmup:
            times.append(elapsed)
            tokens = int(rollout.completion_mask.sum())
    median = statistics.median(times)
    return {"backend": backend, "first_call_s": first, "median_s": median, "tokens": tokens,
            "tokens_per_s": tokens / median, "ids": ids}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny:qwen2_5_vl")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), default=None, help="default: bfloat16 on CUDA, else float32"
    )
    parser.add_argument("--batch", type=int, default=16, help="rows R generated per call")
    parser.add_argument("--group-size", type=int, default=1, help="samples per prompt (R / G distinct prompts)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=112, help="grounding image side, px (multiple of 28)")
    parser.add_argument("--backends", default=None, help="comma-separated; default hf,lean,static (+vllm if usable)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--vllm-memory", type=float, default=0.5, help="vLLM's gpu_memory_utilization")
    parser.add_argument("--vllm-max-model-len", type=int, default=2048, help="vLLM's max_model_len (KV planning)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.batch % args.group_size:
        raise SystemExit(f"--batch {args.batch} does not split into groups of --group-size {args.group_size}")
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")]
    backends = args.backends.split(",") if args.backends else ["hf", "lean", "static"]
    if args.backends is None and importlib.util.find_spec("vllm"):
        backends.append("vllm")
    if "vllm" in backends:  # last: an in-process engine makes torch.set_num_threads a no-op from then on
        backends = [b for b in backends if b != "vllm"] + ["vllm"]

    policy = load(args.model, args.device, dtype)
    policy.prompt_template = "{image}{instruction} Answer as <answer>[x1,y1,x2,y2]</answer>."
    # Equal work for every backend: no row may stop early, so EOS is never sampled.
    policy.suppress_token_ids = sorted(set(policy.suppress_token_ids) | set(policy.eos_token_ids))
    prompts = args.batch // args.group_size
    env = sim.make("grounding", num_envs=args.batch, image_size=args.image_size)
    obs = env.reset(seed=[s for s in range(prompts) for _ in range(args.group_size)])

    results = [run_backend(policy, b, obs, args) for b in backends]
    base = next((r for r in results if r["backend"] == "hf"), results[0])
    params = sum(p.numel() for p in policy.model.parameters())
    print(f"\n{args.model} ({params / 1e6:.1f} M parameters, {dtype}) on {args.device}, {torch.get_num_threads()} "
          f"thread(s): {args.batch} rows ({prompts} prompts x {args.group_size}), {args.new_tokens} new tokens, "
          f"{args.image_size} px, median of {args.repeats} after {args.warmup} warm-up")  # fmt: skip
    print(f"| backend | first call s | median s | tokens | tokens/s | vs {base['backend']} | same tokens |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        same = "-" if r is base else ("yes" if torch.equal(r["ids"], base["ids"]) else "no")
        same = "own sampler" if r["backend"] in ("lean", "vllm") and r is not base else same
        print(f"| {r['backend']} | {r['first_call_s']:.3f} | {r['median_s']:.3f} | {r['tokens']} | "
              f"{r['tokens_per_s']:.1f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f}x | {same} |")  # fmt: skip
    if args.json:
        machine = {"platform": platform.platform(), "torch": torch.__version__, "device": args.device}
        if args.device.startswith("cuda"):
            machine["gpu"] = torch.cuda.get_device_name()
        rows = [{k: v for k, v in r.items() if k != "ids"} for r in results]
        Path(args.json).write_text(json.dumps({"args": vars(args), "machine": machine, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
