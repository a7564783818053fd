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
from .policy import Sampling
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


def build_warm_model(arch: str, text_layers: int, seed: int, prompt_template: str):
    """A tiny `arch` model with `text_layers` language layers (the tests' tiny models have 2)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from .policy.tiny import ASSETS, tiny_processor
    from .policy.vlm import VLMPolicy

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
    max_steps: int = 6000,
    single_shape_steps: int = 600,
    batch_size: int = 32,
    lr: float = 5e-4,
    target_iou: float = 0.30,
    eval_every: int = 250,
    seed: int = 0,
) -> float:
    """Train a tiny model on grounding answers until validation IoU >= `target_iou`; save it to `out_dir`.

    A curriculum: the first `single_shape_steps` steps show one shape per image (learn *where*), the rest the
    full task with distractors (learn *which*). The model of every validation point is saved to
    `out_dir/step_XXXXX` as well, so a run can be cut short and its best point kept.

    Returns:
        The validation IoU of the saved model.
    """
    torch.manual_seed(seed)
    policy = build_warm_model(arch, text_layers, seed, prompt_template)
    full = sim.make("grounding", num_envs=batch_size, image_size=image_size)
    single = sim.make("grounding", num_envs=batch_size, image_size=image_size, min_shapes=1, max_shapes=1)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr, weight_decay=0.0)
    out_dir = Path(out_dir)
    iou = 0.0
    bar = tqdm(range(max_steps + 1), desc="warm start (supervised)", dynamic_ncols=True)
    for step in bar:
        if step % eval_every == 0 and step > 0:
            iou = validation_iou(policy, image_size)
            bar.set_postfix(val_iou=f"{iou:.3f}")
            print(f"step {step}: validation IoU {iou:.3f}", flush=True)
            policy.save_pretrained(out_dir / f"step_{step:05d}")
            if iou >= target_iou:
                break
        env = single if step < single_shape_steps else full
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
    for old in out_dir.glob("step_*"):
        import shutil

        shutil.rmtree(old)
    policy.model.to(torch.float16)
    policy.save_pretrained(out_dir)
    print(f"warm start: validation IoU {iou:.3f} after {step} supervised steps -> {out_dir}")
    return iou
