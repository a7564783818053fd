"""Checkpoints written atomically: a run killed at any moment resumes from its last complete checkpoint.

A checkpoint is a folder `checkpoints/step_XXXXXXXX/` holding the model (`save_pretrained`, loadable on its own
by `VLMPolicy.from_pretrained`), the optimiser and scheduler state, the RNG states and `trainer_state.json`
(step, data position, held-out score before training). It is written under a temporary name and renamed into
place, and a rename within one filesystem is atomic, so a folder with the final name is always complete.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import distributed

_NAME = re.compile(r"^step_(\d{8})$")


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    policy,
    optimizer: torch.optim.Optimizer,
    scheduler,
    trainer_state: dict[str, Any],
    keep: int = 2,
    *,
    world: distributed.World | None = None,
    master=None,
    extra: dict[str, Any] | None = None,
) -> Path | None:
    """Write the checkpoint of `step` atomically and keep only the newest `keep` checkpoints.

    Under torchrun (`world` of K > 1 processes) every process must call this: the full weights and optimiser state
    are gathered from the shards and rank 0 writes them (the others return None). With float32 master weights
    (`master`, a `mmrl.run.precision.MasterWeights`), those are saved rather than the model's rounding of them.
    `extra` (the critic's head and optimiser, ...) is saved with the optimiser's state, under its keys.
    """
    world = world or distributed.World()
    policy, optimizer = distributed.checkpoint_views(policy, optimizer, world)
    if master is not None:
        policy = distributed.with_weights(policy, master.state_dict())
    if not world.is_main:
        return None
    root = checkpoint_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp_step_{step:08d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    policy.save_pretrained(tmp)
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
            **(extra or {}),
        },
        tmp / "training_state.pt",
    )
    (tmp / "trainer_state.json").write_text(json.dumps({**trainer_state, "step": step}, indent=2))
    _fsync_tree(tmp)
    if final.exists():  # the same step saved again (a resumed run re-reaching it): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(output_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary folders of an interrupted write are ignored)."""
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def load_training_state(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer_state.json contents, optimizer/scheduler/rng states) of a checkpoint folder."""
    path = Path(path)
    trainer_state = json.loads((path / "trainer_state.json").read_text())
    states = torch.load(path / "training_state.pt", weights_only=False)
    return trainer_state, states


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
