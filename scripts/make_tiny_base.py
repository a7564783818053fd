"""A shared multi-task base for the tiny presets: the tiny Qwen3-VL supervised on several families' scripted answers.

The grounding warm start (scripts/warmstart.py) knows one task: boxes. A tiny preset of another family that starts
from it must learn that family's perception from its own short cold start, and for some it does not (the PAPO preset's
shape questions stayed at chance, 0.255). This base is trained across families instead, so each family's RL starts
from a competent, imperfect policy.

Recipe (`make_tiny_base`): start from the grounding warm start (assets/tiny_models/qwen3_vl_warm_start, same
architecture: a tiny Qwen3-VL with 4 language layers, about 1.2 M parameters), then supervised training on the
**exact** scripted answers of each family (`box_answer` for grounding, the env's `expert_action()` for the others),
round-robin in `ORDER` (grounding, shape questions, GUI clicks, shape questions): step t trains one family, so every
batch holds one image size, with that family's preset prompt template. Each step draws fresh worlds (nothing to
memorise). The answers are exact, not sloppy: the base's error is its own (too few steps for a small model), which
each family's RL then has to improve.

Why the warm start and not a seeded init (`init=None`, also supported): the warm start's 1750 grounding steps taught
the vision tower where shapes are and which one is meant; from a seeded init, grounding's quarter of a round-robin
stayed near 0 IoU (0.019 at step 1200 of 2400, validation), while from the warm start it reached 0.30 by step 400.

Seeds: training worlds come from [SFT_SEED_BASE, +10**8) (step t: SFT_SEED_BASE + t * batch_size, so the steps'
worlds never repeat); validation from [DEMO_SEED_BASE, ...) as the warm start's. Both are disjoint from GRPO's
training seeds and from the held-out evaluation seeds, which `mmrl eval` uses for the figures in the README.

    python scripts/make_tiny_base.py                   # assets/tiny_models/qwen3_vl_base (what make_assets runs)
    python scripts/make_tiny_base.py --steps 300 --out /tmp/base_trial
    python scripts/make_tiny_base.py --from-scratch --steps 2400 --single-shape-steps 400 --out /tmp/base_scratch
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from warmstart import PROMPT_TEMPLATE as GROUNDING_TEMPLATE  # scripts/: this script's folder is on sys.path
from warmstart import box_answer, build_warm_model

import sim
from mmrl.policy import Sampling
from mmrl.policy.vlm import VLMPolicy
from mmrl.policy.vlm.demonstrations import sft_loss, supervised_batch
from sim.seeds import DEMO_SEED_BASE as VAL_SEED_BASE
from sim.seeds import SFT_SEED_BASE

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "assets" / "tiny_models" / "qwen3_vl_base"
WARM_START = ROOT / "assets" / "tiny_models" / "qwen3_vl_warm_start"  # scripts/make_assets.py builds it first


@dataclass(frozen=True)
class Family:
    """One family of the round-robin: its env, the options and prompt template of its tiny preset, and how its
    validation reads a greedy answer's score.

    Attributes:
        name: The family's label in logs.
        env: The registered env name.
        options: The env's options (the preset's `env.options`).
        prompt_template: The preset's `model.prompt_template`.
        max_new_tokens: The preset's `sampling.max_new_tokens`: enough for the longest exact answer.
        metric: `info["reward_components"][metric]` where present, else `info[metric]`, averaged: the validation score.
        early_options: Options overriding `options` for the first `single_shape_steps` steps of the run.
    """

    name: str
    env: str
    options: dict = field(default_factory=dict)
    prompt_template: str = "{instruction} {image}"
    max_new_tokens: int = 16
    metric: str = "success"
    early_options: dict = field(default_factory=dict)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        # configs/grounding_tiny.yaml: boxes at 128 px; single shapes first, as the warm start.
        Family("grounding", "grounding", {"image_size": 128}, GROUNDING_TEMPLATE, 24, "iou",
               early_options={"min_shapes": 1, "max_shapes": 1}),
        # configs/papo_shapes_tiny.yaml: colour / shape / count multiple choice at 64 px.
        Family("shape_questions", "shape_questions", {"image_size": 64}, "{instruction} {image}", 16, "success"),
        # configs/gui_click_tiny.yaml: click the named element of a 128 px screen.
        Family("gui_click", "gui_click", {"image_size": 128}, "{instruction} {image} Answer as click(x, y).", 12,
               "hit"),
    )
}  # fmt: skip
# The round-robin's order: shape questions twice per cycle. Their answer is one letter among the answer's seven
# tokens, learned from four image tokens (64 px), the slowest of the three to rise above chance.
ORDER = ("grounding", "shape_questions", "gui_click", "shape_questions")


def exact_answers(env, family: Family) -> list[str]:
    """The exact scripted answer of every world of a freshly reset env (grounding has boxes, not an expert)."""
    if family.env == "grounding":
        return [box_answer(b, 0.0, env.image_size) for b in env.target_boxes]
    return env.expert_action()


@torch.no_grad()
def validate(policy, family: Family, episodes: int, seed: int | Sequence[int] = VAL_SEED_BASE) -> float:
    """The greedy mean score of `policy` on `episodes` fresh worlds of `family`, from `seed` up (or on these seeds)."""
    env = sim.make(family.env, num_envs=episodes, **family.options)
    obs = env.reset(seed=seed)
    template, policy.prompt_template = policy.prompt_template, family.prompt_template
    try:
        rollout = policy.generate(obs, 1, Sampling(max_new_tokens=family.max_new_tokens, temperature=0.0))
    finally:
        policy.prompt_template = template
    info = env.step(rollout.texts).info
    values = info["reward_components"].get(family.metric, info.get(family.metric))
    return float(torch.as_tensor(values).float().mean())


def make_tiny_base(
    out_dir: str | Path,
    families: Sequence[str] = ORDER,
    steps: int = 1600,
    single_shape_steps: int = 0,
    text_layers: int = 4,
    batch_size: int = 32,
    lr: float = 5e-4,
    eval_every: int = 400,
    eval_episodes: int = 100,
    final_eval_episodes: int = 200,
    seed: int = 0,
    init: str | Path | None = WARM_START,
    verbose: bool = True,
) -> dict[str, float]:
    """Build the multi-task base (module docstring) and save it to `out_dir` in float16.

    Args:
        out_dir: Where the checkpoint folder goes.
        families: Names in `FAMILIES`, trained round-robin in this order (step t trains `families[t % F]`); a name
            may repeat, which gives that family more of the steps.
        steps: Optimiser steps in all.
        single_shape_steps: Grounding's scenes hold one shape until this step (its `early_options`; for a seeded
            init, which must learn *where* before *which*, as the warm start does).
        text_layers: Language layers of the tiny Qwen3-VL (the warm start has 4).
        batch_size: Worlds per step.
        lr: AdamW's learning rate (constant; gradients clipped to norm 1).
        eval_every: Steps between validations (0: only at the end).
        eval_episodes: Validation worlds per family during training.
        final_eval_episodes: Validation worlds per family at the end.
        seed: The init's seed.
        init: The checkpoint folder to start from (default: the grounding warm start); None: a seeded random init
            of the warm start's architecture with `text_layers` language layers (then `seed` and `text_layers` apply).
        verbose: Print the losses and validations.

    Returns:
        Each family's final validation score (greedy; `Family.metric`), of the float16 model saved.
    """
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise ValueError(f"families must be a non-empty subset of {', '.join(FAMILIES)}, got {list(families)!r}")
    chosen = [FAMILIES[f] for f in families]
    distinct = [FAMILIES[f] for f in dict.fromkeys(families)]
    # One thread: CPU float sums then come out in the same order on any machine, so the script reproduces the
    # committed checkpoint bit for bit with this torch version.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        if init is None:
            policy = build_warm_model("qwen3_vl", text_layers, seed, chosen[0].prompt_template)
        else:
            policy = VLMPolicy.from_pretrained(init, prompt_template=chosen[0].prompt_template)
        envs = {f.name: sim.make(f.env, num_envs=batch_size, **f.options) for f in distinct}
        early = {
            f.name: sim.make(f.env, num_envs=batch_size, **{**f.options, **f.early_options})
            for f in distinct
            if f.early_options
        }
        optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr, weight_decay=0.0)
        losses: dict[str, list[float]] = {f.name: [] for f in distinct}
        start = time.monotonic()
        for step in range(steps):
            if eval_every and step % eval_every == 0 and step > 0 and verbose:
                scores = {f.name: validate(policy, f, eval_episodes) for f in distinct}
                _report(step, losses, scores, start)
            family = chosen[step % len(chosen)]
            env = early[family.name] if family.name in early and step < single_shape_steps else envs[family.name]
            obs = env.reset(seed=SFT_SEED_BASE + step * batch_size)
            policy.prompt_template = family.prompt_template
            batch = supervised_batch(policy, obs, exact_answers(env, family))
            loss = sft_loss(policy.logprobs(batch), batch.completion_mask)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
            optimizer.step()
            losses[family.name].append(loss.item())
        policy.model.to(torch.float16)
        policy.model.eval()
        policy.save_pretrained(out_dir)
        # Validate what was saved: the float16 weights, read back as float32 (as a preset loads them).
        saved = VLMPolicy.from_pretrained(out_dir)
        scores = {f.name: validate(saved, f, final_eval_episodes) for f in distinct}
        if verbose:
            _report(steps, losses, scores, start)
            print(f"tiny base -> {out_dir}")
        return scores
    finally:
        torch.set_num_threads(threads)


def _report(step: int, losses: dict[str, list[float]], scores: dict[str, float], start: float) -> None:
    parts = []
    for name, score in scores.items():
        recent = losses[name][-20:]
        loss = sum(recent) / len(recent) if recent else float("nan")
        parts.append(f"{name} loss {loss:.3f} val {score:.3f}")
    print(f"step {step} ({time.monotonic() - start:.0f} s): " + "; ".join(parts), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(OUT), help="the checkpoint folder to write")
    parser.add_argument("--families", nargs="+", default=list(ORDER), choices=list(FAMILIES))
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--single-shape-steps", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=400)
    parser.add_argument("--init", default=str(WARM_START), help="the checkpoint folder to start from")
    parser.add_argument("--from-scratch", action="store_true", help="a seeded init instead of --init")
    args = parser.parse_args()
    make_tiny_base(
        args.out,
        families=args.families,
        steps=args.steps,
        single_shape_steps=args.single_shape_steps,
        eval_every=args.eval_every,
        init=None if args.from_scratch else args.init,
    )


if __name__ == "__main__":
    main()
