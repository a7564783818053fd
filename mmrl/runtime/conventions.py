"""The coordinate convention a run's env reads answers in, chosen from the model's family (`TrainConfig` calls this).

Grounding, GUI and dataset envs take `coordinates` ("pixels", "0-1000", "0-1") and, for pixels, `input_size` (the side of the
image as the model sees it after its processor's resize): `rewards.coordinates`. A model answers in its family's
units (`mmrl.families.Family.coordinates`), so the config fills them in from the model it names, before any
env is made, and every reader of the config (the collector, evaluation, rollout workers, `config.json`) sees the
values in force. Order, first found wins:

1. `env.options.coordinates` as the user set it (the override);
2. `grounding_coordinates` in the model folder's config.json: a checkpoint trained to answer in other units than its
   family's says so (the tiny warm start learned pixels of 128 px images; `mmrl.build` writes the key into
   the checkpoints of every run that reads coordinates);
3. the family's convention, from `model.path` ("tiny:<family>", or config.json's `model_type` of a folder or of a
   hub id already in the local cache).

A model whose family cannot be read here (a hub id not yet downloaded) leaves the env's own default, pixels: set
`env.options.coordinates` for it. With pixels, `input_size` follows the family's processor: Qwen-VL's `smart_resize`
onto its patch grid within `model.min_pixels`/`max_pixels` (a 128 px image is 140 px for a 14 px patch), a fixed
`size` {height, width} otherwise; it is set only where it differs from the env's `image_size`.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from rewards.coordinates import COORDINATES
from sim.registry import ENVS

from ..families import FAMILIES
from .paths import model_folder
from .schema import require

FOLDER_KEY = "grounding_coordinates"  # config.json key of a checkpoint that answers in other units than its family


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def model_coordinates(path: str) -> tuple[str | None, Path | None, str | None]:
    """(the convention the model at `path` answers in, its folder, its family) or Nones where unknown."""
    folder = model_folder(path)
    if folder is None:
        return None, None, None
    config = _read_json(folder / "config.json")
    family = path.removeprefix("tiny:") if path.startswith("tiny:") else config.get("model_type")
    if config.get(FOLDER_KEY):
        return config[FOLDER_KEY], folder, family
    return (FAMILIES[family].coordinates if family in FAMILIES else None), folder, family


def input_side(folder: Path, family: str, side: int, min_pixels: int = 0, max_pixels: int = 0) -> int | None:
    """The side of a `side` x `side` image after the family's image processor resized it, or None if unknown."""
    settings = _read_json(folder / "preprocessor_config.json")
    if family in FAMILIES and FAMILIES[family].pixel_bounds:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        size = settings.get("size", {})
        low = min_pixels or size.get("shortest_edge") or settings.get("min_pixels") or 56 * 56
        high = max_pixels or size.get("longest_edge") or settings.get("max_pixels") or 28 * 28 * 1280
        factor = int(settings.get("patch_size", 14)) * int(settings.get("merge_size", 2))
        height, width = smart_resize(side, side, factor=factor, min_pixels=low, max_pixels=high)
        return height if height == width else None
    size = settings.get("size", {})
    if size.get("height") and size.get("height") == size.get("width"):
        return int(size["height"])
    return None


def resolve_coordinates(cfg) -> dict[str, Any] | None:
    """The env options of `cfg` (a `TrainConfig`) with `coordinates` (and `input_size`) filled in, or None when
    nothing changes (an env without coordinates, a model whose convention is unknown here).

    Raises:
        ConfigError: naming `env.options.coordinates` when pixels are asked of a model whose resized size is not
            known here (and `env.options.input_size` is not set).
    """
    env = cfg.env
    if env.name not in ENVS:
        return None
    parameters = inspect.signature(ENVS.get(env.name)).parameters
    if "coordinates" not in parameters:
        return None
    options = dict(env.options)
    path = cfg.checkpoint or cfg.model.path
    convention, folder, family = model_coordinates(path)
    if "coordinates" not in options:
        if convention is None:
            return None
        options["coordinates"] = convention
    require(
        options["coordinates"] in COORDINATES,
        "env.options.coordinates",
        f"must be one of {', '.join(COORDINATES)} (the units answers are read in), got {options['coordinates']!r}",
    )
    size = options.get("input_size", 0)
    require(
        isinstance(size, int) and not isinstance(size, bool) and size >= 0,
        "env.options.input_size",
        f"must be an int >= 0 (the side of the image as the model sees it; 0: the env's image_size), got {size!r}",
    )
    if options["coordinates"] != "pixels" or "input_size" in options or "input_size" not in parameters:
        return options if options != env.options else None
    # Images shown at their own sizes (the dataset env's `resize: native`) are on the processor's grid already
    # (`mmrl.build.native_pixel_bounds`): the model sees them as they are, so there is no square side to set.
    if folder is None or family is None or options.get("resize") == "native":
        return options if options != env.options else None
    default = parameters["image_size"].default if "image_size" in parameters else None
    side = int(options.get("image_size", default))
    seen = input_side(folder, family, side, cfg.model.min_pixels, cfg.model.max_pixels)
    require(
        seen is not None,
        "env.options.coordinates",
        f"is 'pixels' for a {family} model, whose processor's resized image size is not known here: set "
        "env.options.input_size (the side it resizes images to), or choose 0-1000 or 0-1",
    )
    if seen != side:
        options["input_size"] = seen
    return options if options != env.options else None
