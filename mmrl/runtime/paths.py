"""Where a model path points: the one resolver every loader, check and detector reads.

A `model.path` (or `checkpoint`) is a folder, a folder named relative to the repository (what presets name, so they run
from any working directory), "tiny:<name>" (a random tiny model of a registered policy kind, built from `assets/`), or a
hub id (downloaded where a hub is reachable; only its cached files are read at config time).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TINY_PREFIX = "tiny:"


def local_path(value: str | Path) -> Path:
    """`value` as a path, looked up in the repository when it is relative and not found where the command runs."""
    path = Path(value)
    if not path.is_absolute() and not path.exists() and (REPO / path).exists():
        return REPO / path
    return path


def model_folder(path: str | Path) -> Path | None:
    """The local folder holding the `config.json` of a model path: a folder, a repository-relative preset path, the
    tiny assets of "tiny:<name>", or a hub id's cached snapshot; None when there is none here (never the network)."""
    path = str(path)
    if path.startswith(TINY_PREFIX):
        folder = REPO / "assets" / "tiny_models" / path.removeprefix(TINY_PREFIX)
        return folder if folder.is_dir() else None
    folder = local_path(path)
    if (folder / "config.json").is_file():
        return folder
    try:  # a hub id: its cached config only, never the network at config time
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(path, "config.json")
    except Exception:  # not a valid repo id (a path that does not exist): nothing cached
        return None
    return Path(cached).parent if isinstance(cached, str) else None


def folder_config(folder: Path | None) -> dict[str, Any]:
    """A model folder's `config.json` as a dict; empty when there is no folder, no file or no JSON object in it."""
    if folder is None or not (folder / "config.json").is_file():
        return {}
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}
