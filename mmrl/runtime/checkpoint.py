"""Checkpoints written atomically and verified when read: a run resumes from its last complete checkpoint.

A checkpoint is a folder `checkpoints/step_XXXXXXXX/` holding the model (`save_pretrained`, loadable on its own
by `VLMPolicy.from_pretrained`), the optimiser and scheduler state, the RNG states and `trainer_state.json`
(step, data position, held-out score before training). It is written under a temporary name and renamed into
place, and a rename within one filesystem is atomic, so a kill never leaves a half-written folder under the final
name. What happens to a folder afterwards (a full disk, a copy cut short, a file deleted or overwritten by hand) is
caught by `manifest.json`, written last: every other file's size, and the SHA-256 of the small ones (up to
`HASHED_BYTES`: the JSON files, the tokenizer; hashing the weights would cost seconds per GB at every save and
resume, and a cut or missing weight file already shows in its size). A checkpoint is complete when every file the
manifest lists is there with its size and hash (`checkpoint_problem`). A folder without a manifest is checked by
what it must hold instead: a readable `trainer_state.json`, a non-empty `training_state.pt` and
weights whose safetensors headers match their sizes.

`training_state.pt` holds tensors and plain data only (the numpy RNG state as a tensor; the steps queued ahead by
asynchronous collection as the project's own batch dataclasses, `mmrl.types.CHECKPOINT_TYPES`), so it loads with
`torch.load(..., weights_only=True)`: a checkpoint folder handed over by someone else cannot run code when resumed. A checkpoint
written before this format resumes only with the opt-in `MMRL_TRUST_CHECKPOINTS=1` (environment), which loads it as
a full pickle: for folders one wrote oneself.

`latest_checkpoint` returns the newest complete checkpoint, warning (one line each) about newer ones it skips;
`resume_checkpoint` is what `resume=true` starts from, and refuses to start over a run folder that holds an earlier
run's history when no complete checkpoint is left.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import random
import re
import shutil
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sim.base import Observation
from sim.errors import InputError

from ..types import CHECKPOINT_TYPES
from . import distributed

_NAME = re.compile(r"^step_(\d{8})$")
MANIFEST = "manifest.json"
HASHED_BYTES = 1 << 20  # files up to this size get a SHA-256 in the manifest; larger ones their size only
TRUST_ENV = "MMRL_TRUST_CHECKPOINTS"  # =1: load a training state as a full pickle (it may run code: own folders only)


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def rng_state() -> dict[str, Any]:
    """The random states, as tensors and plain data (numpy's key as a tensor): what `weights_only` loads."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    numpy = (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))
    return {"torch": torch.get_rng_state(), "numpy": numpy, "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    keys = keys.numpy().astype(np.uint32) if isinstance(keys, torch.Tensor) else keys  # an older checkpoint's array
    np.random.set_state((name, keys, pos, has_gauss, cached))
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
    (`master`, a `mmrl.runtime.precision.MasterWeights`), those are saved rather than the model's rounding of them.
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
    with quiet_transformers():  # its "Writing model shards" bar would cut the training bar at every save
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
    (tmp / MANIFEST).write_text(json.dumps(_manifest(tmp), indent=1))  # last: it vouches for the files above
    _fsync_tree(tmp, only=MANIFEST)
    if final.exists():  # the same step saved again (a resumed run re-reaching it): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(output_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Checkpoint folders by name, oldest first, complete or not (temporary folders of an interrupted write are
    ignored); `checkpoint_problem` says whether each is complete."""
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest_checkpoint(output_dir: str | Path, warn: bool = True) -> Path | None:
    """The newest complete checkpoint of a run folder; None if it has no checkpoint folder at all.

    Newer folders that are not complete are skipped, each with one line on stderr (with `warn`) naming it and what
    is wrong with it.

    Raises:
        InputError: There are checkpoint folders, but none is complete (the message names each and why).
    """
    skipped = []
    for path in reversed(list_checkpoints(output_dir)):
        problem = checkpoint_problem(path)
        if problem is None:
            for name, reason in skipped if warn else ():
                print(f"mmrl: skipping checkpoint {name} (newer than {path.name}): {reason}", file=sys.stderr)
            return path
        skipped.append((path.name, problem))
    if skipped:
        listed = "; ".join(f"{name}: {reason}" for name, reason in skipped)
        raise InputError(f"no complete checkpoint in {checkpoint_dir(output_dir)} ({listed})")
    return None


def resume_checkpoint(output_dir: str | Path, warn: bool = True) -> Path | None:
    """The checkpoint `resume=true` continues from: the newest complete one (see `latest_checkpoint`), or None for a
    run folder with no history (nothing was trained there yet: the run starts from scratch).

    Raises:
        InputError: No complete checkpoint is left but the folder holds an earlier run's checkpoints or metrics:
            starting over would overwrite its `metrics.jsonl`, so resume refuses.
    """
    out = Path(output_dir)
    history = out / "metrics.jsonl"
    advice = (
        f"starting over would overwrite the earlier run's {history.name}: start a new run there with "
        "resume=false overwrite=true (the earlier run is moved aside), or choose another output_dir"
    )
    try:
        found = latest_checkpoint(out, warn)
    except InputError as error:
        raise InputError(f"resume=true: {error}; {advice}") from None
    if found is None and history.is_file() and history.stat().st_size > 0:
        raise InputError(f"resume=true: no checkpoint in {checkpoint_dir(out)}, but {out} holds a {history.name}; "
                         f"{advice}")  # fmt: skip
    return found


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' progress bars off inside the block (as they were after it)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def earlier_run(output_dir: str | Path) -> str | None:
    """What in `output_dir` shows an earlier run (its metrics, its checkpoints), or None: a new run there would
    overwrite it. A cold start left alone is no run yet (a new run takes it up)."""
    out = Path(output_dir)
    history = out / "metrics.jsonl"
    if history.is_file() and history.stat().st_size > 0:
        return str(history)
    if list_checkpoints(out) or any(checkpoint_dir(out).glob(".tmp_step_*")):
        return str(checkpoint_dir(out))
    return None


def set_aside(output_dir: str | Path) -> Path:
    """Move `output_dir` to the first free `<output_dir>.previous-<n>` and return that path."""
    out = Path(output_dir)
    n = 1
    while (aside := out.with_name(f"{out.name}.previous-{n}")).exists():
        n += 1
    out.rename(aside)
    return aside


def checkpoint_problem(path: str | Path) -> str | None:
    """What makes checkpoint folder `path` incomplete ("training_state.pt is missing", ...), or None if it is whole.

    With a manifest: every file it lists is there, of its size, and the hashed ones match their SHA-256. Without
    (a folder written before manifests, or one whose manifest was lost): `trainer_state.json` reads as an object
    with a step, `training_state.pt` and `config.json` are there, and every `.safetensors` file is as long as its
    header says.
    """
    path = Path(path)
    if not path.is_dir():
        return "not a folder"
    if not any(path.iterdir()):
        return "the folder is empty"
    manifest = path / MANIFEST
    if manifest.is_file():
        try:
            listed = json.loads(manifest.read_text(encoding="utf-8"))["files"]
            entries = [(str(name), dict(entry)) for name, entry in listed.items()]
        except Exception as error:  # cut off, garbage, not UTF-8, not the expected shape
            return f"{MANIFEST} is unreadable ({type(error).__name__}: {error})"
        for name, entry in entries:
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            size = file.stat().st_size
            if size != entry.get("size"):
                return f"{name} is {size} bytes, {entry.get('size')} when saved (cut short or overwritten)"
            if "sha256" in entry and _sha256(file) != entry["sha256"]:
                return f"{name} does not match its checksum (changed since it was saved)"
        return None
    return _legacy_problem(path)


def _legacy_problem(path: Path) -> str | None:
    """`checkpoint_problem` for a folder without a manifest."""
    for name in ("trainer_state.json", "training_state.pt", "config.json"):
        if not (path / name).is_file():
            return f"{name} is missing"
    try:
        state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as error:  # cut off, garbage, not UTF-8
        return f"trainer_state.json is not readable JSON ({type(error).__name__}: {error})"
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        return "trainer_state.json holds no step"
    if (path / "training_state.pt").stat().st_size == 0:
        return "training_state.pt is empty"
    weights = list(path.rglob("*.safetensors"))
    if not weights:
        return "no .safetensors weights"
    for file in weights:
        problem = _safetensors_problem(file)
        if problem is not None:
            return f"{file.relative_to(path)} {problem}"
    return None


def _safetensors_problem(file: Path) -> str | None:
    """Whether a safetensors file is as long as its header says (8-byte header length, JSON header, data)."""
    size = file.stat().st_size
    try:
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > size - 8:
                return f"is cut short ({size} bytes; its header alone is {length})"
            header = json.loads(f.read(length))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except Exception as error:
        return f"has no readable header ({type(error).__name__}: {error})"
    if size != 8 + length + end:
        return f"is {size} bytes, its header says {8 + length + end} (cut short)"
    return None


def load_training_state(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer_state.json contents, optimizer/scheduler/rng states) of a checkpoint folder.

    Raises:
        InputError: A file cannot be read (damage `checkpoint_problem` could not see), naming the checkpoint.
    """
    path = Path(path)
    try:
        trainer_state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        raise InputError(
            f"checkpoint {path}: trainer_state.json cannot be read ({type(error).__name__}: {error})"
        ) from None
    trusted = os.environ.get(TRUST_ENV, "") == "1"
    try:
        with torch.serialization.safe_globals([*CHECKPOINT_TYPES, Observation]):
            states = torch.load(path / "training_state.pt", weights_only=not trusted)
    except pickle.UnpicklingError as error:
        if "Weights only load failed" not in str(error):
            raise InputError(
                f"checkpoint {path}: training_state.pt cannot be read (UnpicklingError: {error})"
            ) from None
        raise InputError(
            f"checkpoint {path}: training_state.pt holds objects other than tensors and plain data, which could run "
            f"code when loaded, so it is not loaded. A checkpoint an older mmrl wrote looks so too: if you wrote it "
            f"yourself, resume with {TRUST_ENV}=1 in the environment"
        ) from None
    except Exception as error:  # a damaged file raises anything from EOFError to RuntimeError
        raise InputError(
            f"checkpoint {path}: training_state.pt cannot be read ({type(error).__name__}: {error})"
        ) from None
    return trainer_state, states


def _manifest(folder: Path) -> dict[str, Any]:
    """`{"files": {relative path: {"size", "sha256" for files up to HASHED_BYTES}}}` of every file in `folder`."""
    files = {}
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        size = file.stat().st_size
        entry: dict[str, Any] = {"size": size}
        if size <= HASHED_BYTES:
            entry["sha256"] = _sha256(file)
        files[file.relative_to(folder).as_posix()] = entry
    return {"format": 1, "files": files}


def _sha256(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def _fsync_tree(path: Path, only: str | None = None) -> None:
    for p in path.rglob("*") if only is None else [path / only]:
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
