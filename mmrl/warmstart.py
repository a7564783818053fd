"""The demo's warm start: a short supervised cold start of a tiny VLM on the grounding task.

The RL papers this toolkit follows fine-tune on demonstrations before RL so that the policy gets some reward to
learn from; a random tiny model never emits a box, so GRPO would see only zero rewards. `scripts/make_assets.py`
runs this once and ships the result (about 2 MB in float16). Training stops as soon as the validation IoU passes
`target_iou`, which leaves room for RL to improve.

Seeds: supervised examples come from [SFT_SEED_BASE, ...), validation from [VAL_SEED_BASE, ...); both are
disjoint from GRPO's training seeds (which count up from 0) and from the held-out evaluation seeds.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm.auto import tqdm

import sim

from .evaluate import EVAL_SEED_BASE
from .policy import Sampling, build_tiny
from .sft import sft_loss, supervised_batch

SFT_SEED_BASE = 500_000_000
VAL_SEED_BASE = 900_000_000
assert SFT_SEED_BASE + 10**8 <= VAL_SEED_BASE < EVAL_SEED_BASE
PROMPT_TEMPLATE = "{instruction} Answer as <answer>[x1,y1,x2,y2]</answer>."


def box_answer(box: torch.Tensor) -> str:
    """The answer text for an xyxy pixel box, in the format the demo's prompt asks for."""
    x1, y1, x2, y2 = (int(round(float(v))) for v in box)
    return f"<answer>[{x1},{y1},{x2},{y2}]</answer>"


@torch.no_grad()
def validation_iou(policy, image_size: int, episodes: int = 200) -> float:
    env = sim.make("grounding", num_envs=episodes, image_size=image_size)
    obs = env.reset(seed=VAL_SEED_BASE)
    rollout = policy.generate(obs, 1, Sampling(max_new_tokens=24, temperature=0.0))
    return float(env.step(rollout.texts).info["reward_components"]["iou"].mean())


def make_warm_start(
    out_dir: str | Path,
    arch: str = "qwen3_vl",
    image_size: int = 128,
    max_steps: int = 6000,
    batch_size: int = 32,
    lr: float = 5e-4,
    target_iou: float = 0.30,
    eval_every: int = 250,
    seed: int = 0,
) -> float:
    """Train a tiny `arch` model on grounding answers until validation IoU >= `target_iou`; save it to `out_dir`.

    Returns:
        The validation IoU of the saved model.
    """
    torch.manual_seed(seed)
    policy = build_tiny(arch, seed=seed, prompt_template=PROMPT_TEMPLATE)
    env = sim.make("grounding", num_envs=batch_size, image_size=image_size)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr, weight_decay=0.0)
    iou = 0.0
    bar = tqdm(range(max_steps), desc="warm start (supervised)", dynamic_ncols=True)
    for step in bar:
        if step % eval_every == 0 and step > 0:
            iou = validation_iou(policy, image_size)
            bar.set_postfix(val_iou=f"{iou:.3f}")
            if iou >= target_iou:
                break
        obs = env.reset(seed=SFT_SEED_BASE + step * batch_size)
        batch = supervised_batch(policy, obs, [box_answer(b) for b in env.target_boxes])
        loss = sft_loss(policy.logprobs(batch), batch.completion_mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
        optimizer.step()
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", val_iou=f"{iou:.3f}")
    bar.close()
    policy.model.to(torch.float16)
    policy.save_pretrained(out_dir)
    print(f"warm start: validation IoU {iou:.3f} after {step} supervised steps -> {out_dir}")
    return iou
