"""Write assets/tiny_models/pi0/: a tiny π0 (transformers' `PI0ForConditionalGeneration`) laid out as a hub folder.

    python scripts/make_tiny_pi0.py

What it writes, deterministically (no weights: `mmrl.policy.flow.build_tiny_flow` draws them from a seed):
- config.json: a `PI0Config` with a PaliGemma backbone (SigLIP 64 px / 16 px patches -> 16 tokens an image, a Gemma
  text model of hidden 64, 2 layers) and a Gemma action expert (hidden 32, 2 layers, sharing the backbone's key/value
  heads, as π0's expert must); chunks of 4 actions, state and action padded to 8 and 4 dimensions (the real π0
  pads both to 32), 4 denoising steps. About 0.3 M parameters.
- tokenizer.json, tokenizer_config.json, special_tokens_map.json: a SentencePiece-style BPE (Metaspace
  pre-tokenisation, as Gemma's) trained locally on the phrases of the robot tasks and Python's help texts, with
  PaliGemma's special tokens at PaliGemma's ids (`<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3) and `<image>` after the
  vocabulary (PaliGemma's image token id 257152 is the first id past Gemma's 256000-word vocabulary plus its 1024
  location and 128 segmentation tokens; here it is the first id past this small vocabulary).
- preprocessor_config.json: `PI0ImageProcessor`'s settings (64 px, mean and std 0.5, 16 image tokens), written as
  JSON: the class itself needs torchvision, which has no CPU build on the package index, so mmrl reads the file.

The prompt follows PaliGemma's convention (what `PI0Processor` builds): `<image>` x (tokens per image x views), then
`<bos>`, the instruction, and a newline.

    python scripts/make_tiny_pi0.py --warm-start      # also assets/tiny_models/pi0_warm_start/ (minutes)

**The warm start** (`assets/tiny_models/pi0_warm_start/`, what `configs/pi0_reach_tiny.yaml` starts from): the
tiny π0 drawn from seed 0 (`build_tiny_flow(seed=0)`, bit for bit what `tiny:pi0` gives), whose vision tower
(SigLIP) and PaliGemma projector alone were then trained by a perception probe; every other weight (the Gemma
backbone, the action expert, the action and state projections) stays the random draw, and nothing in it has seen an
action. A real π0 starts from a pretrained PaliGemma; a randomly drawn tiny one cannot learn to see from the
flow-matching loss alone (its cold start learns to ignore the image: RESULTS.md#pi0-on-reach), so this stands in
for the vision pretraining.

*What the perception step learns from:* the reach env's **privileged state** (the true positions and colours of the
discs), not actions and not the task's reward: 4096 egocentric 64 px frames of reach worlds from the warm-start seed
range (`SFT_SEED_BASE`, disjoint from demonstrations and held-out worlds), each reset and moved 0-2 uniformly random
steps, labelled per colour with (in view, the disc's offset from the gripper in half-views of 0.32 m). A linear head
on the mean of the projector's image tokens predicts them (binary cross-entropy on presence + 10 x the squared error
of the offsets of the colours in view); 3000 steps of 128 frames at lr 3e-3, gradients clipped to norm 1, and the
tower kept at its best loss on 256 validation frames of other worlds (checked every 250 steps: at this lr the probe
learns after a plateau of about 1300 steps and can diverge later). The head is thrown away. It is a perception
pretraining on labelled frames, as a VLM's detection data, and the same kind of labels the reach CLIP
(`scripts/make_tiny_clip.py`) is trained on; note that the action-token VLA's warm start
(`assets/tiny_models/qwen3_vl_warm_start`) learned its vision from another task (grounding) instead, so the two
presets' starting points are not equal. Float32 safetensors (about 1.2 MB; float16 would change the trained weights).
It prints the probe's validation losses, and every run on one thread writes the same weights.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import sim
from mmrl.policy.flow import build_tiny_flow
from sim.seeds import SFT_SEED_BASE

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "assets" / "tiny_models" / "pi0"
WARM_OUT = ROOT / "assets" / "tiny_models" / "pi0_warm_start"
REACH = {"image_size": 64, "camera": "ego"}  # configs/pi0_reach_tiny.yaml's env.options
HALF_VIEW = 0.32  # metres: the ego camera's half-width, the unit of the probe's offsets
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]  # PaliGemma's ids 0..3
IMAGE_TOKEN = "<image>"
VOCAB_SIZE = 512
IMAGE_SIZE, PATCH = 64, 16


def corpus() -> list[str]:
    """The robot tasks' instructions (so they tokenise compactly) and Python's help texts."""
    import pydoc_data.topics

    rng = random.Random(0)
    colours = ["red", "green", "blue", "yellow"]
    lines = []
    for _ in range(2000):
        c = rng.choice(colours)
        lines += [f"move the gripper to the {c} disc", f"push the block onto the {c} square", f"reach the {c} target"]
    return lines + [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>",
        additional_special_tokens=[IMAGE_TOKEN], model_max_length=512, padding_side="left",
    )  # fmt: skip
    assert [hf.convert_tokens_to_ids(t) for t in SPECIALS] == [0, 1, 2, 3]
    return hf


def build_config(vocab_size: int, image_token_id: int):
    from transformers import PI0Config

    text = {
        "model_type": "gemma", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": vocab_size,
    }  # fmt: skip
    vision = {
        "model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "patch_size": PATCH, "image_size": IMAGE_SIZE, "vision_use_head": False,
    }  # fmt: skip
    vlm = {
        "model_type": "paligemma", "text_config": text, "vision_config": vision, "projection_dim": 64,
        "image_token_id": image_token_id, "vocab_size": vocab_size,
    }  # fmt: skip
    # The expert attends to the backbone's keys and values layer by layer: same layer count, kv heads and head size.
    dit = {
        "model_type": "gemma", "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
    }  # fmt: skip
    return PI0Config(
        vlm_config=vlm, dit_config=dit, chunk_size=4, max_state_dim=8, max_action_dim=4, num_inference_steps=4
    )


def write_tiny_pi0() -> None:
    """assets/tiny_models/pi0/: the config, tokenizer and image settings (no weights)."""
    tokenizer = build_tokenizer()
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    config = build_config(len(tokenizer), image_token_id)
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    config.save_pretrained(OUT)
    tokenizer.save_pretrained(OUT)
    tokens_per_image = (IMAGE_SIZE // PATCH) ** 2
    image = {
        "image_processor_type": "PI0ImageProcessor", "processor_class": "PI0Processor", "do_resize": True,
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "image_seq_length": tokens_per_image,
    }  # fmt: skip
    (OUT / "preprocessor_config.json").write_text(json.dumps(image, indent=2, sort_keys=True) + "\n")
    print(f"wrote {OUT}: vocabulary {len(tokenizer)}, <image> id {image_token_id}, {tokens_per_image} tokens an image")


# ------------------------------------------------------------------------------------------- perception warm start
@torch.no_grad()
def perception_frames(env, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The env's N worlds reset from `seed` and moved 0-2 uniformly random steps (the count and moves drawn from
    `seed`): their egocentric frames `[N, H, W, 3]` uint8 and per colour `[N, 4, 3]` the labels (in view 0/1, the
    disc's offset from the gripper in half-views), read from the privileged state."""
    obs = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(int(rng.integers(0, 3))):
        obs = env.step(torch.from_numpy(rng.uniform(-1, 1, (env.num_envs, 2)).astype(np.float32))).obs
    # reach's state: gripper xy, gripper velocity, then K disc xy pairs, then K colour indices.
    state, k, rows = obs.state.numpy(), env.num_targets, np.arange(env.num_envs)
    discs, colours = state[:, 4 : 4 + 2 * k].reshape(-1, k, 2), state[:, 4 + 2 * k :].astype(int)
    labels = np.zeros((env.num_envs, 4, 3), np.float32)
    for slot in range(k):
        labels[rows, colours[:, slot], 0] = 1
        labels[rows, colours[:, slot], 1:] = (discs[:, slot] - state[:, 0:2]) / HALF_VIEW
    return obs.image, torch.from_numpy(labels)


def perception_set(env, frames: int, first_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`frames` (a multiple of the env's worlds) frames and labels of `perception_frames`, batch b from seed
    `first_seed + b * N`."""
    parts = [perception_frames(env, first_seed + i * env.num_envs) for i in range(frames // env.num_envs)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def image_summary(vlm, frames: torch.Tensor) -> torch.Tensor:
    """The mean of PaliGemma's projected image tokens `[B, hidden]` for frames `[B, H, W, 3]` uint8, scaled as
    `FlowPolicy.encode` scales pixels (mean and std 0.5)."""
    pixels = (frames.permute(0, 3, 1, 2).float() / 255 - 0.5) / 0.5
    return vlm.get_image_features(pixels).pooler_output.mean(1)


def perception_losses(out: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(presence BCE, offsets' squared error per coordinate of the colours in view) of the probe's `[B, 4, 3]`."""
    present = F.binary_cross_entropy_with_logits(out[..., 0], labels[..., 0])
    mask = labels[..., :1]
    return present, ((out[..., 1:] - labels[..., 1:]) ** 2 * mask).sum() / mask.sum() / 2


def train_perception(policy, env, steps: int = 3000, seed: int = 0, lr: float = 3e-3, check_every: int = 250) -> dict:
    """Train `policy`'s vision tower and projector (in place) by the perception probe of the module docstring;
    keep them at their best validation loss. Returns the probe's validation figures at that point."""
    vlm = policy.model.model.vlm
    frames, labels = perception_set(env, 4096, SFT_SEED_BASE + 60_000_000)
    val_frames, val_labels = perception_set(env, 256, SFT_SEED_BASE + 70_000_000)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        head = torch.nn.Linear(vlm.config.text_config.hidden_size, 12)
    tower = [vlm.vision_tower, vlm.multi_modal_projector]
    params = [p for part in tower for p in part.parameters()] + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=lr)
    generator = torch.Generator().manual_seed(seed)
    variance = float((val_labels[..., 1:] ** 2 * val_labels[..., :1]).sum() / val_labels[..., :1].sum() / 2)
    best = {"val_loss": float("inf")}
    for step in range(1, steps + 1):
        idx = torch.randint(len(frames), (128,), generator=generator)
        present, offset = perception_losses(head(image_summary(vlm, frames[idx])).view(-1, 4, 3), labels[idx])
        optimizer.zero_grad(set_to_none=True)
        (present + 10 * offset).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % check_every == 0 or step == steps:
            with torch.no_grad():
                present, offset = perception_losses(head(image_summary(vlm, val_frames)).view(-1, 4, 3), val_labels)
            row = {"step": step, "val_presence_bce": round(float(present), 4), "val_offset_mse": round(float(offset), 4),
                   "offset_variance": round(variance, 4), "val_loss": float(present + 10 * offset)}  # fmt: skip
            print(json.dumps({k: v for k, v in row.items() if k != "val_loss"}), flush=True)
            if row["val_loss"] < best["val_loss"]:
                weights = [{k: v.detach().clone() for k, v in part.state_dict().items()} for part in tower]
                best = {**row, "weights": weights}
    for part, weights in zip(tower, best.pop("weights")):
        part.load_state_dict(weights)
    return best


def make_pi0_warm_start(out: Path = WARM_OUT, steps: int = 3000, seed: int = 0) -> dict:
    """Write the perception warm start (module docstring) to `out`; returns the probe's kept validation figures."""
    torch.set_num_threads(1)  # one thread: the same weights on every run
    policy = build_tiny_flow(seed=0)
    env = sim.make("reach", num_envs=64, **REACH)
    try:
        best = train_perception(policy, env, steps=steps, seed=seed)
    finally:
        env.close()
    shutil.rmtree(out, ignore_errors=True)
    policy.save_pretrained(out)  # no statistics: the cold start computes them from its demonstrations
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the asset's own bytes (a re-save notes how it loaded)
        shutil.copyfile(OUT / name, out / name)
    (out / "perception_probe.json").write_text(json.dumps({**best, "steps": steps, "seed": seed}, indent=2) + "\n")
    print(f"wrote {out}: probe kept at step {best['step']} (validation presence BCE {best['val_presence_bce']}, "
          f"offsets' MSE {best['val_offset_mse']} against their variance {best['offset_variance']})")  # fmt: skip
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm-start", action="store_true", help="also write assets/tiny_models/pi0_warm_start")
    parser.add_argument("--warm-start-only", action="store_true", help="write only the warm start")
    parser.add_argument("--steps", type=int, default=3000, help="perception steps (a smoke run: fewer)")
    parser.add_argument("--out", type=Path, default=WARM_OUT, help="where the warm start goes")
    args = parser.parse_args()
    if not args.warm_start_only:
        write_tiny_pi0()
    if args.warm_start or args.warm_start_only:
        make_pi0_warm_start(args.out, steps=args.steps)


if __name__ == "__main__":
    main()
