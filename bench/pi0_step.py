"""One RL update step of π0 and its sampling latency per action chunk, at the real size or the tiny one.

    python3 bench/pi0_step.py --device cuda --dtype bfloat16 --size real --repeats 3      # a GPU (BENCHMARKS.md)
    .venv/bin/python bench/pi0_step.py --size tiny --repeats 3                           # the CPU smoke run

`--size real` builds transformers' `PI0ForConditionalGeneration` at π0's published sizes (openpi's `gemma_2b` and
`gemma_300m` variants, which `PI0Config()`'s defaults are; checked below): PaliGemma-3B (SigLIP so400m/14 at 224 px,
256 tokens an image, and Gemma 2B: 18 layers of width 2048) and a Gemma 300M action expert (18 layers of width
1024), chunks of C = 50 actions, K = 10 denoising steps, state and actions padded to 32. The weights are random
(speed does not depend on what they know) and the tokenizer is the tiny asset's (PaliGemma's special tokens; the
image token's id is set to its `<image>`): the prompt is 256 image tokens per view, `<bos>`, a LIBERO-length
instruction and a newline, as π0's. `--size tiny` is `tiny:pi0` (assets/tiny_models/pi0).

What it times, each the median of `--repeats` after one warm-up:
(a) one mmrl update step on R rows (`--rows`, sampled in groups of `--group`): `FlowPolicy.logprobs` (the backbone
    reads each row's prompt, the expert scores its K Flow-SDE transitions in one pass) -> mmrl's PPO-clip loss on
    GRPO advantages -> backward -> gradient clipping -> AdamW, with the forward, backward and optimiser phases apart;
(b) the latency of sampling one chunk (`FlowPolicy.generate`: the prompt's cache, then K expert passes) at batch 1
    and 8.
On CUDA it also prints the peak memory allocated by each. `--checkpointing` turns on `model.gradient_checkpointing`
(the vision tower's and the action expert's layers, `mmrl.policy.flow.options.enable_flow_checkpointing`).
Only APIs of torch 2.11 and transformers 5.17 are used (the GPU machines' versions).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository before bench/ (bench/rewards.py)

import torch  # noqa: E402

from mmrl.algos import grpo_advantages, ppo_clip_loss  # noqa: E402
from mmrl.policy.flow import TINY_PI0, FlowPolicy, FlowStats, read_image_settings  # noqa: E402
from mmrl.policy.flow.folders import GEMMA_VARIANTS, SIGLIP_SO400M  # noqa: E402
from mmrl.policy.flow.options import enable_flow_checkpointing  # noqa: E402
from mmrl.types import Sampling  # noqa: E402
from sim.base import Observation  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
INSTRUCTION = "put both the alphabet soup and the tomato sauce in the basket"  # a LIBERO-Object instruction
STATE_DIM, ACTION_DIM = 8, 7  # LIBERO's proprioceptive state and actions


def real_config(image_token_id: int):
    """`PI0Config()` (π0's published sizes), checked against openpi's variants; the image token id set to the
    tokenizer's (the embedding table keeps PaliGemma's 257,152 rows)."""
    from transformers import PI0Config

    config = PI0Config()
    text, vision, expert = config.vlm_config.text_config, config.vlm_config.vision_config, config.dit_config
    expected = {
        "backbone": (GEMMA_VARIANTS["gemma_2b"], text), "expert": (GEMMA_VARIANTS["gemma_300m"], expert),
        "vision": (SIGLIP_SO400M, vision),
    }  # fmt: skip
    for part, (sizes, sub) in expected.items():
        wrong = {k: (getattr(sub, k), v) for k, v in sizes.items() if getattr(sub, k) != v}
        if wrong:
            raise RuntimeError(f"PI0Config()'s {part} is not π0's published size: (have, want) {wrong}")
    if (config.chunk_size, config.num_inference_steps, config.max_action_dim) != (50, 10, 32):
        raise RuntimeError("PI0Config()'s chunk_size / num_inference_steps / max_action_dim are not 50 / 10 / 32")
    config.vlm_config.image_token_id = image_token_id
    return config


def build_policy(size: str, device: str, dtype: torch.dtype, seed: int = 0) -> FlowPolicy:
    """A flow policy of random weights at `size` ("real" or "tiny") with zero-mean unit statistics."""
    from transformers import AutoConfig, AutoTokenizer, PI0ForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(TINY_PI0)
    if size == "real":
        tokenizer.model_max_length = 1 << 20  # the tiny tokenizer says 512; π0's prompt is 256 tokens an image + text
        config = real_config(tokenizer.convert_tokens_to_ids("<image>"))
        side = config.vlm_config.vision_config.image_size
        patches = (side // config.vlm_config.vision_config.patch_size) ** 2
        image = {"size": {"height": side, "width": side}, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
                 "image_seq_length": patches}  # fmt: skip
    else:
        config, image = AutoConfig.from_pretrained(TINY_PI0), read_image_settings(TINY_PI0)
    torch.manual_seed(seed)
    with torch.device(device):
        model = PI0ForConditionalGeneration(config)
    model.to(dtype)
    state, action = min(STATE_DIM, config.max_state_dim), min(ACTION_DIM, config.max_action_dim)
    stats = FlowStats((0.0,) * state, (1.0,) * state, (0.0,) * action, (1.0,) * action)
    return FlowPolicy(model, tokenizer, image, stats, noise_method="flow_sde", noise_level=0.5)


def observations(policy: FlowPolicy, n: int, views: int, seed: int = 0) -> Observation:
    """N worlds of random camera images at the model's image size, LIBERO's instruction and a random state."""
    g = torch.Generator().manual_seed(seed)
    side = policy.image_size
    return Observation(
        image=torch.randint(0, 256, (n, views, side, side, 3), generator=g, dtype=torch.uint8),
        instruction=[INSTRUCTION] * n,
        proprio=torch.randn(n, policy.stats.state_dim, generator=g),
    )


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def peak_gb(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 1e9 if torch.device(device).type == "cuda" else None


def reset_peak(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def update_step(policy: FlowPolicy, rollout, advantages: torch.Tensor, optimizer, device: str) -> dict[str, float]:
    """One update on `rollout`: logprobs (forward), PPO-clip loss, backward, clipping, AdamW; seconds per phase."""
    sync(device)
    start = time.perf_counter()
    logprobs = policy.logprobs(rollout)
    loss = ppo_clip_loss(logprobs, rollout.logprobs, advantages, rollout.completion_mask).loss
    sync(device)
    forward = time.perf_counter()
    loss.backward()
    sync(device)
    backward = time.perf_counter()
    torch.nn.utils.clip_grad_norm_([p for p in policy.model.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync(device)
    end = time.perf_counter()
    return {"forward_s": forward - start, "backward_s": backward - forward, "optimizer_s": end - backward,
            "step_s": end - start}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=("real", "tiny"), default="real")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=8, help="R rows (action chunks) in the update step")
    parser.add_argument("--group", type=int, default=4, help="GRPO group size of the rows")
    parser.add_argument("--views", type=int, default=2, help="camera views per world (LIBERO: 2)")
    parser.add_argument("--batches", default="1,8", help="sampling batch sizes, comma-separated")
    parser.add_argument("--checkpointing", action="store_true", help="model.gradient_checkpointing")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.rows % args.group:
        parser.error(f"--rows {args.rows} is not a multiple of --group {args.group}")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype, device = DTYPES[args.dtype], args.device
    policy = build_policy(args.size, device, dtype)
    cfg = policy.config
    dit = policy.net.model.dit
    params = {
        "total": sum(p.numel() for p in policy.model.parameters()),
        "vision": sum(p.numel() for p in policy.net.model.vlm.vision_tower.parameters()),
        "backbone": sum(p.numel() for p in policy.net.model.vlm.language_model.parameters()),
        # The expert's layers; transformers also gives it a token embedding table that π0 never reads.
        "expert": sum(p.numel() for p in dit.parameters()) - dit.embed_tokens.weight.numel(),
    }
    millions = {k: f"{v / 1e6:,.1f} M" for k, v in params.items()}
    print(f"pi0 {args.size}: {millions['total']} parameters (vision {millions['vision']}, backbone "
          f"{millions['backbone']}, expert layers {millions['expert']}), {args.dtype} on {device}; C={policy.chunk}, "
          f"K={policy.num_steps}, {args.views} view(s) at {policy.image_size} px, {policy.image_tokens} tokens an "
          f"image; torch {torch.__version__}")  # fmt: skip
    if args.checkpointing:
        enable_flow_checkpointing(policy)
    results: dict = {"size": args.size, "device": device, "dtype": args.dtype, "parameters": params,
                     "chunk": policy.chunk, "steps": policy.num_steps, "views": args.views}  # fmt: skip

    # (a) the update step
    torch.manual_seed(1)
    obs = observations(policy, args.rows, args.views)
    policy.model.eval()
    rollout = policy.generate(obs, args.group, Sampling(temperature=1.0))
    rewards = torch.rand(args.rows, generator=torch.Generator().manual_seed(2))
    advantages = grpo_advantages(rewards, group_size=args.group).to(policy.device)
    policy.model.train()
    fused = {"fused": True} if torch.device(device).type == "cuda" else {}
    optimizer = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=1e-6, **fused)
    update_step(policy, rollout, advantages, optimizer, device)  # warm-up (and AdamW's state allocated)
    reset_peak(device)
    runs = [update_step(policy, rollout, advantages, optimizer, device) for _ in range(args.repeats)]
    update = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    update["peak_gb"] = peak_gb(device)
    results["update"] = update
    memory = f", peak {update['peak_gb']:.1f} GB allocated" if update["peak_gb"] is not None else ""
    print(f"update step ({args.rows} rows x K={policy.num_steps}, PPO-clip + AdamW): {update['step_s']:.3f} s "
          f"[logprobs forward {update['forward_s']:.3f} s, backward {update['backward_s']:.3f} s, clip + AdamW "
          f"{update['optimizer_s']:.3f} s]{memory}")  # fmt: skip
    del optimizer
    policy.model.zero_grad(set_to_none=True)

    # (b) sampling latency per chunk
    policy.model.eval()
    results["sample"] = {}
    for batch in (int(b) for b in args.batches.split(",")):
        obs = observations(policy, batch, args.views, seed=batch)

        def sample(obs=obs):
            sync(device)
            start = time.perf_counter()
            policy.generate(obs, 1, Sampling(temperature=1.0))
            sync(device)
            return time.perf_counter() - start

        sample()  # warm-up
        reset_peak(device)
        seconds = statistics.median(sample() for _ in range(args.repeats))
        results["sample"][batch] = {"chunk_s": seconds, "peak_gb": peak_gb(device)}
        memory = f", peak {peak_gb(device):.1f} GB" if peak_gb(device) is not None else ""
        print(
            f"sample one chunk, batch {batch}: {seconds * 1000:.1f} ms ({seconds / policy.num_steps * 1000:.2f} ms "
            f"a denoising step incl. the prompt pass; {batch * cfg.chunk_size / seconds:.0f} actions/s){memory}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
