"""Does the tiny π0's cold start read the image? The flow-matching loss on held-out demonstrations, with and without
the images shuffled across rows, during a cold start on reach's scripted expert; then held-out success.

    .venv/bin/python bench/pi0_cold_start.py [--patch 8] [--every] [--steps 600] [--lr 1e-3]

The gap between the two validation losses is what the policy takes from the image: 0 for a policy that ignores it.
The model is `assets/tiny_models/pi0`'s config with the vision tower's patch size, width and depth as given (16 px
patches on 64 px frames: 16 image tokens, the preset's); the demonstrations are the preset's (512 episodes, executed
with noise 0.5, labelled clean, chunks of the config's length) from `trainer.seed`'s demonstration worlds, and a
validation set of 128 episodes from another seed's. `--every` labels a chunk at every step of an episode (the expert's
next C actions along the executed path; past the episode's end, the expert's action at the frozen world) instead of
only where a chunk starts.

`--vision-steps N` first trains the vision tower and PaliGemma's projector alone, N steps at lr 3e-3 (batches of
128), to say from the mean of its image tokens which colours are in view and where each colour's disc lies relative
to the gripper (a linear head; binary cross-entropy on presence, 10 x the squared error of the offsets in half-views),
on 4096 egocentric frames of training worlds from the warm-start range (`SFT_SEED_BASE`), reset and moved 0-2 random
steps; then the cold start runs from that tower. It prints the probe's validation losses on 256 other frames.
`--save DIR` writes the cold-started policy as a π0 folder (weights, statistics) that `model.path` loads, so RL
can run from it: `mmrl train configs/pi0_reach_tiny.yaml model.path=DIR sft.episodes=0`.
Results: RESULTS.md#pi0-on-reach.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sim  # noqa: E402
from mmrl.policy.flow import TINY_PI0, FlowPolicy, read_image_settings  # noqa: E402
from mmrl.policy.flow_data import FlowStats  # noqa: E402
from mmrl.run.flow_sft import collect_flow_demonstrations  # noqa: E402
from mmrl.run.sft import episode_noise_seed  # noqa: E402
from mmrl.stages.evaluate import evaluate  # noqa: E402
from sim.base import Observation  # noqa: E402
from sim.seeds import SFT_SEED_BASE, demo_seed_base  # noqa: E402


@torch.no_grad()
def collect_every_step(env, chunk: int, episodes: int, noise: float, seed: int) -> tuple:
    """As `collect_flow_demonstrations`, with a row at every step an episode runs (not only where a chunk starts)."""
    base, num = demo_seed_base(seed, episodes, env.num_envs), env.num_envs
    rows, successes = [], []
    for start in range(0, episodes, num):
        obs = env.reset(seed=base + start)
        generators = [torch.Generator().manual_seed(episode_noise_seed(seed, start + i)) for i in range(num)]
        running = torch.arange(num) < episodes - start
        success = torch.zeros(num, dtype=torch.bool)
        steps = []  # (observation, expert label [N, D], running before the step)
        for t in range(env.max_episode_steps + chunk - 1):  # past the end: labels at the frozen worlds
            label = env.expert_action()
            steps.append((obs, label, running.clone()))
            noisy = torch.stack([torch.randn(label.shape[1], generator=g) for g in generators])
            result = env.step((label + noise * noisy).clamp(env.action_low, env.action_high))
            if t < env.max_episode_steps:
                success |= result.info["success"].bool() & running
                running &= ~(result.terminated | result.truncated)
            obs = result.obs
        for t in range(env.max_episode_steps):
            shown, _, ran = steps[t]
            labels = torch.stack([steps[t + j][1] for j in range(chunk)], 1)  # [N, C, D]
            rows += [(shown.image[i], shown.instruction[i], shown.proprio[i], labels[i]) for i in ran.nonzero()[:, 0]]
        successes.append(success[: min(num, episodes - start)])
    images, instructions, proprio, chunks = zip(*rows)
    rate = float(torch.cat(successes).float().mean())
    return torch.stack(images), list(instructions), torch.stack(proprio).float(), torch.stack(chunks).float(), rate


def probe_frames(env, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """N egocentric frames `[N, H, W, 3]` of worlds reset from `seed` and moved 0-2 random steps, and per colour
    `[N, 4, 3]`: (in view, the disc's offset from the gripper in half-views (0.32 m))."""
    import numpy as np

    obs = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(int(rng.integers(0, 3))):
        obs = env.step(torch.from_numpy(rng.uniform(-1, 1, (env.num_envs, 2)).astype(np.float32))).obs
    state, k, rows = obs.state.numpy(), env.num_targets, np.arange(env.num_envs)
    discs, colours = state[:, 4 : 4 + 2 * k].reshape(-1, k, 2), state[:, 4 + 2 * k :].astype(int)
    labels = np.zeros((env.num_envs, 4, 3), np.float32)
    for slot in range(k):
        labels[rows, colours[:, slot], 0] = 1
        labels[rows, colours[:, slot], 1:] = (discs[:, slot] - state[:, 0:2]) / 0.32
    return obs.image, torch.from_numpy(labels)


def train_vision(policy: FlowPolicy, env, steps: int, seed: int) -> None:
    """Train the vision tower and projector alone on `probe_frames` (see the module docstring)."""
    vlm = policy.model.model.vlm
    parts = [probe_frames(env, SFT_SEED_BASE + 60_000_000 + i * env.num_envs) for i in range(4096 // env.num_envs)]
    val = [probe_frames(env, SFT_SEED_BASE + 70_000_000 + i * env.num_envs) for i in range(256 // env.num_envs)]
    frames, labels = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    val_frames, val_labels = torch.cat([p[0] for p in val]), torch.cat([p[1] for p in val])
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        head = torch.nn.Linear(vlm.config.text_config.hidden_size, 12)
    params = [*vlm.vision_tower.parameters(), *vlm.multi_modal_projector.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(params, lr=3e-3)

    def losses(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pixels = (x.permute(0, 3, 1, 2) / 255 - 0.5) / 0.5  # [B, 3, 64, 64], as FlowPolicy.encode scales them
        out = head(vlm.get_image_features(pixels).pooler_output.mean(1)).view(-1, 4, 3)
        present = F.binary_cross_entropy_with_logits(out[..., 0], y[..., 0])
        mask = y[..., :1]
        offset = ((out[..., 1:] - y[..., 1:]) ** 2 * mask).sum() / mask.sum() / 2
        return present, offset

    generator = torch.Generator().manual_seed(seed)
    for step in range(1, steps + 1):
        idx = torch.randint(len(frames), (128,), generator=generator)
        present, offset = losses(frames[idx].float(), labels[idx])
        optimizer.zero_grad(set_to_none=True)
        (present + 10 * offset).backward()
        optimizer.step()
        if step % 500 == 0 or step == steps:
            with torch.no_grad():
                present, offset = losses(val_frames.float(), val_labels)
            baseline = (val_labels[..., 1:] ** 2 * val_labels[..., :1]).sum() / val_labels[..., :1].sum() / 2
            print(json.dumps({"vision_step": step, "val_presence_bce": round(float(present), 4),
                              "val_offset_mse": round(float(offset), 4), "offset_variance": round(float(baseline), 4)}),
                  flush=True)  # fmt: skip


def build(args) -> FlowPolicy:
    from transformers import AutoConfig, AutoTokenizer, PI0Config, PI0ForConditionalGeneration

    config = AutoConfig.from_pretrained(TINY_PI0).to_dict()
    vision = config["vlm_config"]["vision_config"]
    vision.update(patch_size=args.patch, hidden_size=args.vision_hidden, intermediate_size=2 * args.vision_hidden,
                  num_hidden_layers=args.vision_layers)  # fmt: skip
    tokens = (vision["image_size"] // args.patch) ** 2
    config["vlm_config"]["text_config"]["num_image_tokens"] = tokens
    config = PI0Config(**{k: v for k, v in config.items() if k not in ("model_type", "transformers_version")})
    torch.manual_seed(args.seed)
    image = {**read_image_settings(TINY_PI0), "image_seq_length": tokens}
    return FlowPolicy(PI0ForConditionalGeneration(config), AutoTokenizer.from_pretrained(TINY_PI0), image)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patch", type=int, default=16)
    parser.add_argument("--vision-hidden", type=int, default=32)
    parser.add_argument("--vision-layers", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=512)
    parser.add_argument("--every", action="store_true", help="a chunk labelled at every step of an episode")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--noise", type=float, default=0.5)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--eval-episodes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vision-steps", type=int, default=0, help="train the vision tower first (see above)")
    parser.add_argument("--save", default="", help="save the cold-started policy here (a π0 folder model.path loads)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    policy = build(args)
    model = policy.model
    options = {"image_size": 64, "camera": "ego"}
    env = sim.make("reach", num_envs=64, **options)
    if args.vision_steps:
        train_vision(policy, env, args.vision_steps, args.seed)
    collect = collect_every_step if args.every else collect_flow_demonstrations
    images, instructions, proprio, chunks, rate = collect(env, policy.chunk, args.episodes, args.noise, args.seed)
    val = collect_flow_demonstrations(env, policy.chunk, 128, noise=args.noise, seed=args.seed + 1000)
    env.close()
    policy.set_stats(FlowStats.from_demonstrations(proprio, chunks))
    print(f"{len(instructions)} chunks from {args.episodes} episodes (demonstrator success {rate:.2f}); "
          f"{len(val[1])} validation chunks", flush=True)  # fmt: skip

    def val_loss(shuffle: bool) -> float:
        v_images, v_instructions, v_proprio, v_chunks, _ = val
        if shuffle:
            v_images = v_images[torch.randperm(len(v_images), generator=torch.Generator().manual_seed(7))]
        generator, total = torch.Generator().manual_seed(123), 0.0  # the same times and noise for both
        model.eval()
        with torch.no_grad():
            for s in range(0, len(v_instructions), 256):
                rows = torch.arange(s, min(s + 256, len(v_instructions)))
                obs = Observation(image=v_images[rows], instruction=[v_instructions[i] for i in rows.tolist()],
                                  proprio=v_proprio[rows])  # fmt: skip
                total += float(policy.flow_matching_loss(obs, v_chunks[rows], generator=generator)) * len(rows)
        model.train()
        return total / len(v_instructions)

    generator = torch.Generator().manual_seed(args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model.train()
    start, losses = time.time(), []
    for step in range(1, args.steps + 1):
        idx = torch.randint(len(instructions), (args.batch_size,), generator=generator)
        obs = Observation(image=images[idx], instruction=[instructions[i] for i in idx.tolist()], proprio=proprio[idx])
        loss = policy.flow_matching_loss(obs, chunks[idx], generator=generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if step % args.log_every == 0 or step == args.steps:
            recent = losses[-args.log_every :]
            row = {"step": step, "train": sum(recent) / len(recent), "val": val_loss(False),
                   "val_images_shuffled": val_loss(True), "s": round(time.time() - start, 1)}  # fmt: skip
            print(json.dumps(row), flush=True)
    model.eval()
    if args.eval_episodes:
        result = evaluate(policy, "reach", options, episodes=args.eval_episodes, batch_size=100)
        print(f"held-out success on {args.eval_episodes} episodes: {result.metrics['success']:.3f}", flush=True)
    if args.save:
        policy.save_pretrained(args.save)


if __name__ == "__main__":
    main()
