"""The demo's warm start: a short supervised cold start of a tiny VLM on the grounding task, from sloppy demos.

The RL papers this toolkit follows fine-tune on demonstrations before RL so that the policy gets some reward to
learn from; a random tiny model never emits a box, so GRPO would see only zero rewards. Here the demonstrator is
sloppy: its boxes are padded by `demo_margin` of their size on every side (a loose annotation convention). The
imitating model learns where shapes are and which one the instruction names, and copies the loose boxes; GRPO on
the true IoU reward then has something to improve that imitation cannot: the demonstrator's own error.
(Measured while designing the demo: from exact demonstrations, plain GRPO on this tiny model moved held-out IoU by
at most +0.03 in 150 steps; refining perception from a scalar reward is slow at this scale.)

`scripts/make_assets.py` runs this once and ships the result (about 2.5 MB in float16).

Seeds: supervised examples come from [SFT_SEED_BASE, ...), validation from [VAL_SEED_BASE, ...); both are
disjoint from GRPO's training seeds (which count up from 0) and from the held-out evaluation seeds.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForImageTextToText

import sim
from mmrl.policy import Sampling
from mmrl.policy.vlm import VLMPolicy
from mmrl.policy.vlm.demonstrations import sft_loss, supervised_batch
from mmrl.policy.vlm.tiny import ASSETS, tiny_processor
from sim.seeds import DEMO_SEED_BASE as VAL_SEED_BASE
from sim.seeds import SFT_SEED_BASE

# Instruction before the image: image tokens can then attend to the named shape, which a tiny model learns much
# faster than building a query from an instruction that comes after the image (measured: 0.11 vs 0.02 IoU at step
# 1000 of the same curriculum).
PROMPT_TEMPLATE = "{instruction} {image} Answer as <answer>[x1,y1,x2,y2]</answer>."


def box_answer(box: torch.Tensor, margin: float = 0.0, image_size: int | None = None) -> str:
    """The answer text for an xyxy pixel box, in the format the demo's prompt asks for.

    `margin` pads the box by that fraction of its width and height on every side (clamped to the image): the
    demonstrations of a sloppy annotator whose boxes are loose.
    """
    x1, y1, x2, y2 = (float(v) for v in box)
    dx, dy = margin * (x2 - x1), margin * (y2 - y1)
    x1, y1, x2, y2 = x1 - dx, y1 - dy, x2 + dx, y2 + dy
    if image_size is not None:
        x1, y1, x2, y2 = max(x1, 0.0), max(y1, 0.0), min(x2, float(image_size)), min(y2, float(image_size))
    x1, y1, x2, y2 = (int(round(v)) for v in (x1, y1, x2, y2))
    return f"<answer>[{x1},{y1},{x2},{y2}]</answer>"


@torch.no_grad()
def validation_iou(policy, image_size: int, episodes: int = 200) -> float:
    env = sim.make("grounding", num_envs=episodes, image_size=image_size)
    obs = env.reset(seed=VAL_SEED_BASE)
    rollout = policy.generate(obs, 1, Sampling(max_new_tokens=24, temperature=0.0))
    return float(env.step(rollout.texts).info["reward_components"]["iou"].mean())


def build_warm_model(arch: str, text_layers: int, seed: int, prompt_template: str):
    """A tiny `arch` model with `text_layers` language layers (the tests' tiny models have 2)."""
    config = AutoConfig.from_pretrained(ASSETS / "tiny_models" / arch)
    config.text_config.num_hidden_layers = text_layers
    config.text_config.layer_types = ["full_attention"] * text_layers
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config)
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    return VLMPolicy(model, tiny_processor(arch), prompt_template=prompt_template)


def make_warm_start(
    out_dir: str | Path,
    arch: str = "qwen3_vl",
    text_layers: int = 4,
    image_size: int = 128,
    prompt_template: str = PROMPT_TEMPLATE,
    single_shape_steps: int = 600,
    exact_steps: int = 1750,
    sloppy_steps: int = 0,
    demo_margin: float = 0.4,
    batch_size: int = 32,
    lr: float = 5e-4,
    eval_every: int = 250,
    seed: int = 0,
    resume_from: str | Path | None = None,
    resume_step: int = 0,
    snapshot_dir: str | Path | None = None,
) -> float:
    """Supervised warm start in three phases; the result is saved to `out_dir`.

    1. steps [0, single_shape_steps): one shape per image, exact boxes (learn *where*);
    2. steps [single_shape_steps, exact_steps): the full task with distractors, exact boxes (learn *which*);
    3. steps [exact_steps, exact_steps + sloppy_steps): the full task, boxes padded by `demo_margin` of their size
       on every side: the sloppy demonstrator, whose error GRPO then has to undo. This phase starts with a fresh
       optimiser; the first two share one.

    With `snapshot_dir`, the model at every validation point is also saved to `snapshot_dir/step_XXXXX` (float32,
    after that many updates). `resume_from` the snapshot taken at `exact_steps` continues exactly as an
    uninterrupted run would, since the sloppy phase starts with a fresh optimiser anyway.

    Returns:
        The validation IoU of the saved model.
    """
    # One thread: CPU float sums then come out in the same order on any machine, so the script reproduces the
    # committed checkpoint bit for bit with this torch version (a few minutes slower than two threads).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    if resume_from is not None:
        if resume_step != exact_steps:
            raise ValueError(f"resume only where the sloppy phase begins (step {exact_steps}), not {resume_step}")
        policy = VLMPolicy.from_pretrained(resume_from, prompt_template=prompt_template)
    else:
        policy = build_warm_model(arch, text_layers, seed, prompt_template)
    start = resume_step if resume_from is not None else 0
    total = exact_steps + sloppy_steps
    full = sim.make("grounding", num_envs=batch_size, image_size=image_size)
    single = sim.make("grounding", num_envs=batch_size, image_size=image_size, min_shapes=1, max_shapes=1)
    optimizer = None
    iou = 0.0
    bar = tqdm(range(start, total), desc="warm start (supervised)", dynamic_ncols=True)
    for step in bar:
        if step in (start, exact_steps):  # the run or the sloppy phase begins: fresh optimiser
            optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr, weight_decay=0.0)
        if step % eval_every == 0 and step > start:
            iou = validation_iou(policy, image_size)
            bar.set_postfix(val_iou=f"{iou:.3f}")
            print(f"step {step}: validation IoU {iou:.3f}", flush=True)
            if snapshot_dir is not None:
                policy.save_pretrained(Path(snapshot_dir) / f"step_{step:05d}")
        env = single if step < single_shape_steps else full
        margin = demo_margin if step >= exact_steps else 0.0
        obs = env.reset(seed=SFT_SEED_BASE + step * batch_size)
        answers = [box_answer(b, margin, image_size) for b in env.target_boxes]
        batch = supervised_batch(policy, obs, answers)
        loss = sft_loss(policy.logprobs(batch), batch.completion_mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
        optimizer.step()
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", val_iou=f"{iou:.3f}")
    bar.close()
    iou = validation_iou(policy, image_size)
    torch.set_num_threads(threads)
    policy.model.to(torch.float16)
    # It answers boxes in pixels, not in Qwen3-VL's 0-1000: the config reads this (mmrl.runtime.conventions).
    policy.model.config.grounding_coordinates = "pixels"
    policy.save_pretrained(out_dir)
    print(f"warm start: validation IoU {iou:.3f} after {total} supervised steps -> {out_dir}")
    return iou
