"""Does the tiny π0's cold start read the image? The flow-matching loss on held-out demonstrations, with and without
the images shuffled across rows, during a cold start on reach's scripted expert; then held-out success.

    .venv/bin/python bench/pi0_cold_start.py [--model assets/tiny_models/pi0_warm_start] [--every]
        [--episodes 2048] [--steps 1000] [--lr 1e-3] [--patch 8] [--vision-steps 3000]

The gap between the two validation losses is what the policy takes from the image: 0 for a policy that ignores it.
The cold start is `mmrl.policy.flow.demonstrations`'s (the preset's), on reach's expert demonstrations (executed with noise 0.5,
labelled clean, chunks of the config's length) from `--seed`'s demonstration worlds, with a validation set of 128
episodes from another seed's. Labels are taken where a chunk starts (flow_sft's default); `--every` takes them at
every step of an episode (`sft.every_step`, the preset's).

The model is `--model`, a π0 folder (the preset's perception warm start, `assets/tiny_models/pi0_warm_start`,
written by `scripts/make_tiny_pi0.py --warm-start`), or by default `assets/tiny_models/pi0`'s config drawn at random
from `--seed` with the vision tower's patch size, width and depth as given (16 px patches on 64 px frames: 16 image
tokens, the preset's). `--vision-steps N` first trains that model's vision tower and projector by the warm start's
perception probe (`scripts/make_tiny_pi0.py`'s `train_perception`: disc presence and offsets from the privileged
state, N steps at lr 3e-3), printing the probe's validation losses. `--save DIR` writes the cold-started policy as
a π0 folder (weights, statistics) that `model.path` loads, so RL can run from it:
`mmrl train configs/pi0_reach_tiny.yaml model.path=DIR sft.episodes=0`. Results: RESULTS.md#pi0-on-reach.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from make_tiny_pi0 import REACH, train_perception  # noqa: E402  (scripts/)

import sim  # noqa: E402
from mmrl.policy.flow import TINY_PI0, FlowPolicy, read_image_settings  # noqa: E402
from mmrl.policy.flow.data import FlowStats  # noqa: E402
from mmrl.policy.flow.demonstrations import collect_flow_demonstrations  # noqa: E402
from mmrl.stages.cold_start import imitate  # noqa: E402
from mmrl.stages.evaluate import evaluate  # noqa: E402
from mmrl.types import Demonstrations  # noqa: E402
from sim.base import Observation  # noqa: E402


def build(args) -> FlowPolicy:
    if args.model:
        return FlowPolicy.from_pretrained(args.model)
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
    parser.add_argument("--model", default="", help="start from this π0 folder (e.g. the preset's warm start)")
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
    options = dict(REACH)
    env = sim.make("reach", num_envs=64, **options)
    if args.vision_steps:
        train_perception(policy, env, steps=args.vision_steps, seed=args.seed)
    images, instructions, proprio, chunks, rate = collect_flow_demonstrations(
        env, policy.chunk, args.episodes, args.noise, args.seed, every_step=args.every
    )
    val = collect_flow_demonstrations(
        env, policy.chunk, 128, noise=args.noise, seed=args.seed + 1000, every_step=args.every
    )
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

    start = time.time()

    def log(step: int, losses: list[float]) -> None:
        if step % args.log_every == 0 or step == args.steps:
            recent = losses[-args.log_every :]
            row = {"step": step, "train": sum(recent) / len(recent), "val": val_loss(False),
                   "val_images_shuffled": val_loss(True), "s": round(time.time() - start, 1)}  # fmt: skip
            print(json.dumps(row), flush=True)

    demos = Demonstrations(images, instructions, chunks, rate, args.episodes, {"proprio": proprio})
    imitate(policy, demos, steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed, on_step=log)
    model.eval()
    if args.eval_episodes:
        result = evaluate(policy, "reach", options, episodes=args.eval_episodes, batch_size=100)
        print(f"held-out success on {args.eval_episodes} episodes: {result.metrics['success']:.3f}", flush=True)
    if args.save:
        policy.save_pretrained(args.save)


if __name__ == "__main__":
    main()
