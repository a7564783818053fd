"""Write `assets/tiny_models/clip_reach/`: a tiny CLIP trained on the `reach` simulator's own renders.

The `reach` env's `reward="clip"` (VLM-RM's goal-baseline reward, `configs/clip_reach_tiny.yaml`) needs a CLIP that
knows what "the gripper is on the red disc" looks like in that simulator. This script makes one, offline, in about
five minutes on one CPU thread, and every run writes the same bytes:

    python scripts/make_tiny_clip.py                                  # into assets/tiny_models/clip_reach
    python scripts/make_tiny_clip.py --frames 64 --steps 5 --out /tmp/x   # a seconds-long smoke run

**Frames.** Reach worlds rendered as `configs/vla_reach_tiny.yaml` renders them (`RENDER`: 128 px, the egocentric
camera), from their reset and after each of 8 steps of the scripted expert plus Gaussian noise whose size is drawn
per world (0 to 1.5 action units: from straight onto the target to nearly random), with success switched off so an
episode goes on hovering around its target. So the gripper is far from, near, next to and on each disc colour.

**Captions** come from the privileged state: for every disc in view, "the gripper is {grade} the {colour} disc" with
the grade read from the gripper-to-disc distance `d` (`GRADES`: on at 0 m, next to at 0.06, near at 0.15, far from
at 0.3 and beyond). The training target is soft and ordinal: a disc's mass is split between the two grades whose
anchor distances bracket `d`, linearly, so the image-text similarity learns to vary smoothly with the distance (what
a potential-based reward needs) instead of in four steps.

**Model.** `transformers.CLIPModel`: a ViT of 2 layers, hidden 64, 8 px patches on the frame resized to 64 px (as
`rewards.clip.CLIPScorer` resizes it), and a text transformer of 2 layers, hidden 64, over a word-level tokenizer of
the caption words (a `tokenizers` WordLevel model wrapped as `PreTrainedTokenizerFast`, appending `<|endoftext|>`
where CLIP pools). Trained with CLIP's two-way softmax loss against the 16 captions (4 colours x 4 grades), with
the soft targets above. About 0.2 M parameters, saved in float32 safetensors (about 1 MB: float16 would save half a
megabyte and make every user cast).

At the end it loads the folder back with `rewards.clip.load_clip` and prints held-out figures on worlds whose seeds
training never saw: grade accuracy, colour accuracy on the discs the gripper is on, and for the goal-baseline reward
(goal "on the c disc", baseline "far from the c disc", alpha 0.5) its Spearman correlation with `d`, the AUC of
on (`d` < 0.025 m) against far (`d` > 0.15 m), and over the held-out episodes the Spearman correlation of the CLIP
return towards the named target, `phi(last) - phi(first)`, with the distance the episode closed.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from rewards.clip import goal_baseline_reward, load_clip
from sim.robotics.planar import COLOURS
from sim.robotics.reach import ReachEnv

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "assets" / "tiny_models" / "clip_reach"
SEED = 20_251_125
HELD_OUT_SEED = 10_000_000  # held-out worlds' seeds start here, far from the training ones
RENDER = {"image_size": 128, "camera": "ego"}  # configs/vla_reach_tiny.yaml's env.options
EPISODE_STEPS = 8  # the env's default episode length: 9 frames an episode
INPUT_SIZE = 64  # the CLIP's input side; CLIPScorer resizes the 128 px frames to it
GRADES = (("on", 0.0), ("next to", 0.06), ("near", 0.15), ("far from", 0.3))  # (words, anchor distance in metres)
ON_RADIUS = 0.025  # the env's default success radius: "on" in the held-out figures
FAR_DISTANCE = 0.15


def caption(grade: str, colour: str) -> str:
    return f"the gripper is {grade} the {colour} disc"


CAPTIONS = [caption(grade, colour) for colour in COLOURS for grade, _ in GRADES]  # index colour * 4 + grade


def render_frames(frames: int, seed: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """`frames` egocentric reach frames, each colour's gripper-to-disc distance, and the named target's colour.

    Returns:
        images `[F, H, W, 3]` uint8, distances `[F, C]` float64 in metres (C = 4 colours; NaN for a colour the
        world does not show) and the instruction's target colour `[F]` int (an index into `COLOURS`).
    """
    episodes = math.ceil(frames / (EPISODE_STEPS + 1))
    batch = min(episodes, 64)
    env = ReachEnv(batch, success_radius=-1.0, max_episode_steps=EPISODE_STEPS, **RENDER)  # never succeeds
    generator = torch.Generator().manual_seed(seed)
    images, distances, targets = [], [], []
    for start in range(0, episodes, batch):
        obs = env.reset(seed=[seed + start + k for k in range(batch)])
        noise = 1.5 * torch.rand(batch, 1, generator=generator)  # [N, 1] per-world noise scale
        for step in range(EPISODE_STEPS + 1):
            images.append(obs.image)
            distances.append(disc_distances(obs.state.double().numpy(), env.num_targets))
            targets.append([COLOURS.index(colour) for colour in env.target_colour])
            if step < EPISODE_STEPS:
                action = env.expert_action() + noise * torch.randn(batch, 2, generator=generator)
                obs = env.step(action.clamp(-1.0, 1.0)).obs
    env.close()
    # Frames in (world, step) order, so a prefix of them is whole episodes of the first worlds.
    images_t = torch.stack(images, 1).flatten(0, 1)[:frames]  # [F, H, W, 3]
    distances_a = np.stack(distances, 1).reshape(-1, len(COLOURS))[:frames]
    return images_t, distances_a, np.stack(targets, 1).reshape(-1)[:frames]


def disc_distances(state: np.ndarray, num_targets: int) -> np.ndarray:
    """Reach's privileged state `[N, 4 + 3K]` -> each colour's gripper-to-disc distance `[N, C]`, NaN if absent."""
    gripper = state[:, None, 0:2]  # [N, 1, 2]
    discs = state[:, 4 : 4 + 2 * num_targets].reshape(-1, num_targets, 2)  # [N, K, 2]
    colours = state[:, 4 + 2 * num_targets :].astype(np.int64)  # [N, K]
    out = np.full((state.shape[0], len(COLOURS)), np.nan)
    np.put_along_axis(out, colours, np.linalg.norm(discs - gripper, axis=-1), axis=1)
    return out


def soft_targets(distances: np.ndarray) -> torch.Tensor:
    """`[F, C]` distances -> `[F, C * 4]` caption targets summing to 1 per frame (module docstring)."""
    anchors = np.array([anchor for _, anchor in GRADES])
    present = ~np.isnan(distances)  # [F, C]
    d = np.clip(np.nan_to_num(distances, nan=anchors[-1]), 0.0, anchors[-1])
    upper = np.clip(np.searchsorted(anchors, d, side="right"), 1, len(anchors) - 1)  # [F, C] bracket's upper grade
    lower = upper - 1
    share = (d - anchors[lower]) / (anchors[upper] - anchors[lower])  # [F, C] of the mass on the upper grade
    targets = np.zeros((*d.shape, len(GRADES)))
    np.put_along_axis(targets, lower[..., None], (1 - share)[..., None], axis=-1)
    np.put_along_axis(targets, upper[..., None], share[..., None], axis=-1)
    targets *= present[..., None] / present.sum(1, keepdims=True)[..., None]
    return torch.from_numpy(targets.reshape(len(d), -1)).float()


def hard_grades(distances: np.ndarray) -> np.ndarray:
    """The grade whose anchor is nearest `d`, `[F, C]` int (meaningless where NaN)."""
    anchors = np.array([anchor for _, anchor in GRADES])
    return np.abs(np.nan_to_num(distances, nan=1.0)[..., None] - anchors).argmin(-1)


def build_tokenizer():
    """A word-level tokenizer over the caption words that ends every text with `<|endoftext|>`."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = sorted({word for text in CAPTIONS for word in text.split()})
    # End-of-text gets the last id: CLIP reads eos_token_id == 2 as the legacy "largest id" pooling, avoided here.
    vocab = {"<pad>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(words)}, "<|endoftext|>": len(words) + 2}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    eos = vocab["<|endoftext|>"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", eos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<|endoftext|>",
        model_max_length=16,
    )


def build_model(tokenizer, seed: int):
    from transformers import CLIPConfig, CLIPModel

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = CLIPConfig(
        text_config={
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
            "vocab_size": len(tokenizer), "max_position_embeddings": 16,
            "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": pad,
        },
        vision_config={
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
            "image_size": INPUT_SIZE, "patch_size": 8,
        },
        projection_dim=64,
    )  # fmt: skip
    torch.manual_seed(seed)
    return CLIPModel(config)


def resize(images: torch.Tensor) -> torch.Tensor:
    """`[F, H, W, 3]` uint8 -> `[F, 3, S, S]` uint8, exactly as `rewards.image.HFImageEncoder` resizes."""
    x = images.permute(0, 3, 1, 2)
    return F.interpolate(x, size=(INPUT_SIZE, INPUT_SIZE), mode="bilinear", antialias=True).contiguous()


def pooled(output) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.pooler_output


def train(model, tokenizer, pixels, targets, mean, std, *, steps: int, seed: int, batch_size: int = 128) -> None:
    """CLIP's two-way softmax loss between a batch of frames and the 16 captions, against the soft targets.

    Args:
        pixels: `[F, 3, S, S]` uint8 frames at the model's input size.
        targets: `[F, 16]` soft caption targets.
    """
    text = tokenizer(CAPTIONS, padding=True, return_tensors="pt")
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    generator = torch.Generator().manual_seed(seed)
    scale = (1.0 / (255.0 * std)).float().view(1, 3, 1, 1)
    shift = (mean / std).float().view(1, 3, 1, 1)
    model.train()
    for step in range(steps):
        index = torch.randint(len(pixels), (batch_size,), generator=generator)
        x = pixels[index].float() * scale - shift  # [B, 3, S, S]
        image = F.normalize(pooled(model.get_image_features(pixel_values=x)), dim=-1)  # [B, D]
        texts = F.normalize(pooled(model.get_text_features(**text)), dim=-1)  # [16, D]
        logits = model.logit_scale.exp().clamp(max=100.0) * image @ texts.T  # [B, 16]
        target = targets[index]  # [B, 16]
        image_loss = -(target * logits.log_softmax(-1)).sum(-1).mean()
        mass = target.sum(0)  # [16] captions that hold in some frame of the batch
        seen = mass > 0
        text_target = target[:, seen] / mass[seen]  # [B, T'] each caption's frames
        text_loss = -(text_target * logits[:, seen].log_softmax(0)).sum(0).mean()
        loss = 0.5 * (image_loss + text_loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 200 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  logit scale {model.logit_scale.exp().item():.1f}")
    model.eval()


def save(model, tokenizer, mean: torch.Tensor, std: torch.Tensor, out: Path) -> None:
    import transformers

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    processor_class = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
    processor = processor_class(
        size={"shortest_edge": INPUT_SIZE},
        crop_size={"height": INPUT_SIZE, "width": INPUT_SIZE},
        image_mean=mean.tolist(),
        image_std=std.tolist(),
    )
    processor.save_pretrained(out)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    rank_a, rank_b = a.argsort().argsort().astype(float), b.argsort().argsort().astype(float)
    return float(np.corrcoef(rank_a, rank_b)[0, 1])


def auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(a positive scores above a negative), ties counting half (the Mann-Whitney form of the ROC AUC)."""
    diff = positive[:, None] - negative[None, :]
    return float((diff > 0).mean() + 0.5 * (diff == 0).mean())


def held_out_figures(
    folder: Path, images: torch.Tensor, distances: np.ndarray, targets: np.ndarray, alpha: float = 0.5
) -> dict:
    """The figures the module docstring lists, through `load_clip` (the path the env's reward takes).

    Also, over the whole episodes among the frames, the Spearman correlation of the episode's CLIP return towards its
    named target, `phi(last) - phi(first)`, with its privileged one, the distance it closed.
    """
    scorer = load_clip(folder, device="cpu")
    image_emb = scorer.embed_images(images)  # [F, D]
    text_emb = scorer.embed_texts(CAPTIONS).view(len(COLOURS), len(GRADES), -1)  # [C, 4, D]
    similarity = torch.einsum("fd,cgd->fcg", image_emb, text_emb).numpy()  # [F, C, 4]
    present = ~np.isnan(distances)  # [F, C]
    grade_accuracy = float((similarity.argmax(-1) == hard_grades(distances))[present].mean())
    frame, colour = np.nonzero(present & (np.nan_to_num(distances, nan=1.0) < ON_RADIUS))
    colour_accuracy = float((similarity[frame, :, 0].argmax(-1) == colour).mean()) if len(frame) else float("nan")
    frame, colour = np.nonzero(present)
    rewards = goal_baseline_reward(
        image_emb[frame], text_emb[colour, 0], text_emb[colour, -1], alpha=alpha
    ).numpy()  # [P] one per (frame, disc in view)
    d = distances[frame, colour]
    episodes = len(images) // (EPISODE_STEPS + 1)
    starts = np.arange(episodes) * (EPISODE_STEPS + 1)  # [E] first frames; the last ones are EPISODE_STEPS later
    colour = targets[starts]
    first, last = (
        goal_baseline_reward(image_emb[at], text_emb[colour, 0], text_emb[colour, -1], alpha=alpha).numpy()
        for at in (starts, starts + EPISODE_STEPS)
    )  # [E] each
    closed = distances[starts, colour] - distances[starts + EPISODE_STEPS, colour]  # [E] metres
    return {
        "frames": len(images),
        "grade_accuracy": grade_accuracy,
        "on_colour_accuracy": colour_accuracy,
        "on_frames": int((d < ON_RADIUS).sum()),
        "spearman_reward_distance": spearman(rewards, d),
        "auc_on_vs_far": auc(rewards[d < ON_RADIUS], rewards[d > FAR_DISTANCE]),
        "episodes": episodes,
        "spearman_episode_return_vs_privileged": spearman(last - first, closed),
    }


def make_tiny_clip(out: Path, *, frames: int = 4608, steps: int = 2000, eval_frames: int = 1152) -> dict:
    """Render, caption, train, save to `out`, and return the held-out figures (see the module docstring)."""
    torch.set_num_threads(1)  # a shared CPU box; and one thread keeps the float sums in one order
    began = time.time()
    images, distances, _ = render_frames(frames, SEED)
    pixels = resize(images)  # [F, 3, S, S] uint8
    # The dataset's own channel statistics, rounded so that they print and reload exactly.
    values = pixels.permute(1, 0, 2, 3).flatten(1).double() / 255.0  # [3, F*S*S]
    mean, std = values.mean(1).round(decimals=4), values.std(1).round(decimals=4)  # [3] float64
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, SEED)
    print(f"{len(images)} frames rendered in {time.time() - began:.0f} s; {model.num_parameters()} parameters")
    train(model, tokenizer, pixels, soft_targets(distances), mean, std, steps=steps, seed=SEED)
    save(model, tokenizer, mean, std, out)
    figures = held_out_figures(out, *render_frames(eval_frames, HELD_OUT_SEED))
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out} ({size / 1e6:.2f} MB) in {time.time() - began:.0f} s")
    print("held-out: " + json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoint folder (replaced)")
    parser.add_argument("--frames", type=int, default=4608, help="training frames (9 per episode)")
    parser.add_argument("--steps", type=int, default=2000, help="optimiser steps of 128 frames")
    parser.add_argument("--eval-frames", type=int, default=1152, help="held-out frames for the printed figures")
    args = parser.parse_args()
    make_tiny_clip(args.out, frames=args.frames, steps=args.steps, eval_frames=args.eval_frames)


if __name__ == "__main__":
    main()
