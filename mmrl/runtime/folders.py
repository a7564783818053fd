"""Model folders checked before anything loads: a path a command would load that cannot be a model is a
`ConfigError` naming the field, not a transformers traceback minutes later."""

from __future__ import annotations

import os
from pathlib import Path

from .config import TrainConfig
from .paths import local_path
from .schema import require


def check_model_folders(cfg: TrainConfig, command: str = "train", tiny_archs: tuple[str, ...] = ()) -> None:
    """Refuse, before anything loads, a model folder a command would load that cannot be a model: `model.path` (for
    `train`, unless a resumed run loads its checkpoint instead), `judge.model` (train) and `checkpoint` (eval, and
    train, which starts from it).
    "tiny:<arch>" must name one of `tiny_archs` (`mmrl.policy.vlm.tiny.ALL_TINY_ARCHS`, which this module cannot import:
    the policy package imports it); empty: not checked.

    A folder must hold a `config.json` (what transformers reads first); a path that is no folder is refused where it
    cannot be a hub id either: it is absolute or starts with `.`, or the hub is off (`HF_HUB_OFFLINE`). Relative
    paths are also looked up in the repository, as `mmrl.build.load_policy` does. "tiny:<arch>" is no folder.

    Raises:
        ConfigError: naming the field, the path and what is missing.
    """
    if cfg.checkpoint is not None:  # eval scores it; train starts from it
        _check_model_folder("checkpoint", cfg.checkpoint, hub=False)
    if command == "eval":
        return
    resumes = cfg.resume and (Path(cfg.output_dir) / "checkpoints").is_dir() and cfg.algo.kl_coef == 0
    if cfg.model.path.startswith("tiny:"):
        arch = cfg.model.path.removeprefix("tiny:")
        require(not tiny_archs or arch in tiny_archs, "model.path", f"unknown tiny architecture {arch!r}; choose "
                f"one of {', '.join(tiny_archs)}", sep=": ")  # fmt: skip
    elif not resumes:
        _check_model_folder("model.path", cfg.model.path)
    if cfg.judge.enabled:
        _check_model_folder("judge.model", cfg.judge.model)


def _check_model_folder(field_name: str, value: str, hub: bool = True) -> None:
    path = local_path(value)  # presets name assets relative to the repository
    if path.is_dir():
        require((path / "config.json").is_file(), field_name, f"{path} has no config.json: not a model folder "
                "(transformers' save_pretrained writes one)", sep=": ")  # fmt: skip
        return
    require(not path.exists(), field_name, f"{path} is a file; name the model's folder", sep=": ")
    could_be_hub_id = hub and not path.is_absolute() and not value.startswith(".") and value.count("/") <= 1
    if could_be_hub_id and os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("0", "", "false", "no"):
        return  # a hub id: transformers downloads it
    if could_be_hub_id:  # the hub is off: transformers loads it only from the local cache
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(value, "config.json")
        except Exception:  # not a valid repository id
            cached = None
        if isinstance(cached, str):
            return
    require(False, field_name, f"no folder at {path}" + (
        " and no such model in the hub's local cache (the hub is off: HF_HUB_OFFLINE)" if could_be_hub_id else ""
    ), sep=": ")  # fmt: skip


def check_output_dir(out: Path) -> None:
    """Refuse, before anything loads, an `output_dir` that cannot be a run's folder: a file, or one whose nearest
    existing folder cannot be written to (the folder would fail to be made minutes later, after the model loaded).

    Raises:
        ConfigError: naming `output_dir`, the path and why.
    """
    require(not out.exists() or out.is_dir(), "output_dir", f"{out} is a file; name a folder", sep=": ")
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    require(existing.is_dir(), "output_dir", f"{existing} is a file, so {out} cannot be made", sep=": ")
    require(os.access(existing, os.W_OK | os.X_OK), "output_dir", f"{existing} cannot be written to (permission "
            "denied)", sep=": ")  # fmt: skip


def make_output_dir(out: Path) -> None:
    """Make `output_dir` (and the folders above it); an OS refusal is a `ConfigError` naming the field."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a read-only disk, a quota, permissions os.access did not see
        require(False, "output_dir", f"cannot create {out}: {error.strerror or error}", sep=": ")
