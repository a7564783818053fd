"""The cold start: imitation of the env expert's demonstrations before the first RL step (`sft.episodes > 0`).

One loop for every policy kind: the kind collects its demonstrations (`Policy.demonstrations`: a VLM's answers or
action tokens, a flow policy's action chunks) and gives the loss of a batch of them (`Policy.demonstration_loss`: the
NLL of the expert's tokens, π0's flow-matching loss). The held-out score of the initial model is measured first, so a
run reports what the cold start and what RL each added. The cold-started policy is kept in `<output_dir>/cold_start`
(written atomically), so a resumed run finds it instead of repeating it. Under torchrun every process runs the same
seeded cold start (no long wait at a barrier); only rank 0 prints and writes.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..policy import Policy
from ..runtime import distributed
from ..runtime.config import TrainConfig
from ..runtime.schema import require
from ..types import Demonstrations
from .evaluate import held_out

FOLDER = "cold_start"  # under output_dir: the cold-started policy and the initial model's held-out score


def cold_start(cfg: TrainConfig, policy: Policy, env, out: Path, world: distributed.World) -> Policy:
    """The policy after imitating `env`'s expert (`cfg.sft`), saved in `out / FOLDER`; `policy` itself with
    `sft.episodes` 0. The env must have a scripted expert (`expert_action`)."""
    sft = cfg.sft
    if sft.episodes <= 0:
        return policy
    require(hasattr(env, "expert_action"), "sft.episodes", f"> 0 needs an env with a scripted expert; "
            f"{cfg.env.name!r} has none", sep=" ")  # fmt: skip
    demonstrations = policy.demonstrations(env, cfg)
    initial = held_out(policy, cfg, world)
    if world.is_main:
        print(f"held-out {cfg.env.eval_metric} of the initial model: {initial.metrics[cfg.env.eval_metric]:.3f}\n"
              f"{demonstrations.describe()}; noise {sft.noise}, label noise {sft.label_noise}", file=sys.stderr)  # fmt: skip
    imitate(policy, demonstrations, steps=sft.steps, batch_size=sft.batch_size, lr=sft.lr, seed=cfg.trainer.seed)
    if world.is_main:
        tmp = out / f"{FOLDER}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)  # a half-written one from a killed run
        policy.save_pretrained(tmp)
        (tmp / "initial_eval.json").write_text(json.dumps(initial.metrics, indent=2))
        tmp.rename(out / FOLDER)  # atomic: a folder named cold_start is always complete
    return policy


def imitate(
    policy: Policy,
    demonstrations: Demonstrations,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int = 0,
    on_step: Callable[[int, list[float]], None] | None = None,
) -> list[float]:
    """Minimise the kind's demonstration loss: `steps` AdamW steps on batches drawn from `seed` (as are whatever the
    loss draws: a flow policy's times and noise); returns every step's loss. `on_step(step, losses)`, if given, runs
    after each step (1-based; e.g. a validation)."""
    generator = torch.Generator().manual_seed(seed)
    model = policy.model
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    bar = tqdm(range(steps), desc="cold start", dynamic_ncols=True)
    for step in bar:
        rows = torch.randint(len(demonstrations), (min(batch_size, len(demonstrations)),), generator=generator)
        loss = policy.demonstration_loss(demonstrations, rows, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if on_step is not None:
            on_step(step + 1, losses)
    bar.close()
    return losses
