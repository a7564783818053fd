"""`mmrl data check PATH [--model M] [--config C] [key=value ...]`: a dataset read as training would read it.

The `dataset` env is built with the options a run would give it (the defaults, or `--config`'s `env.options`, then
the overrides: a bare `key=value` is an env option, `image_size=128`; a dotted one is any config field,
`model.max_pixels=200704`), so whatever that env reads (its formats, its column names, its options) is read here the
same way. Every record is then shown once, as a world would show it: its image decoded and its targets checked
inside it. The report says

- how many rows, and how many are bad;
- the target kinds (`box`, `boxes`, `point`, `answer`) and the rewards that score them;
- the images' sizes as stored (min / median / max of widths and heights) and how the model is shown them;
- the boxes' convention as understood: their format and units in the data, and the units the model is asked for
  and scored in (`coordinates`, chosen from the model as `mmrl train` chooses it);
- with `--model`, prompt tokens per row: the prompt as the policy writes it (chat template, prompt template, the
  question with its answer hint, the image's tokens) under that model's tokenizer and image processor;
- every bad row with its reason.

The exit code is 2 when a row is bad, 0 otherwise; a wrong option or a dataset with no good row is one line on
stderr (exit 2), as everywhere in `mmrl`. User guide: docs/datasets.md ("Checking a dataset").
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import statistics
from collections import Counter
from dataclasses import dataclass, field, replace

from PIL import Image

import sim
from sim.errors import InputError

from .build import native_pixel_bounds
from .policy.vlm.processing import VisionTextProcessor
from .policy.vlm.tiny import tiny_processor
from .runtime.config import TrainConfig, load_config
from .runtime.paths import TINY_PREFIX, model_folder
from .runtime.schema import ConfigError

ENV = "dataset"
TARGET_KINDS = ("box", "boxes", "point", "answer")


@dataclass
class DataReport:
    """What `check_dataset` found; `lines()` writes it."""

    path: str
    options: dict  # the env options in force (coordinates filled in from the model)
    model: str  # model.path: the model whose convention (and, with `--model`, tokenizer) the report uses
    rows: int = 0  # every row read, good or bad
    kinds: dict[str, Counter] = field(default_factory=dict)  # target kind -> reward name -> rows
    widths: list[int] = field(default_factory=list)  # the good rows' images as stored
    heights: list[int] = field(default_factory=list)
    shown: list[tuple[int, int]] = field(default_factory=list)  # (W', H') each good row is shown at
    tokens: list[int] | None = None  # prompt tokens per good row (with a model)
    bad: list[str] = field(default_factory=list)  # one message per bad row, naming it and the field

    def lines(self) -> list[str]:
        """The report, one fact a line (bad rows last, one a line)."""
        good = self.rows - len(self.bad)
        out = [f"dataset: {self.path}", f"rows: {self.rows} ({good} good, {len(self.bad)} bad)"]
        kinds = []
        for kind in TARGET_KINDS:
            if kind in self.kinds:
                scored = ", ".join(f"{name} {count}" for name, count in sorted(self.kinds[kind].items()))
                kinds.append(f"{kind} {sum(self.kinds[kind].values())} ({scored})")
        out.append(f"targets: {'; '.join(kinds) if kinds else 'none'}")
        if self.widths:
            out.append(
                f"image sizes: width {_spread(self.widths)}, height {_spread(self.heights)} (pixels, as stored)"
            )
            if self.options.get("resize", "letterbox") == "native":
                areas = sorted(self.shown, key=lambda s: s[0] * s[1])
                sizes = _size(areas[0]) + (f" to {_size(areas[-1])}" if areas[0] != areas[-1] else "")
                out.append(f"shown: at their own sizes, {sizes} (resize native)")
            else:
                side = self.options.get("image_size", _env_default("image_size"))
                out.append(f"shown: letterboxed into {side}x{side}")
        out.append(self._convention())
        if self.tokens:
            out.append(f"prompt tokens: {_spread(self.tokens)} per row ({self.model}'s template and tokenizer, "
                       "image tokens included)")  # fmt: skip
        elif self.tokens is None:
            out.append("prompt tokens: give --model to count them")
        out += [f"bad: {message}" for message in self.bad]
        return out

    def _convention(self) -> str:
        """The boxes' convention as understood: in the data, and as the model is asked for and scored in."""
        if not (self.kinds.keys() & {"box", "boxes", "point"}):
            return "boxes: none in the data (no box, boxes or point targets)"
        options = self.options
        # The env's box options where it has them (a box format, normalised units); else xyxy pixels, what it reads.
        box_format = options.get("box_format", "xyxy")
        units = options.get("box_units", "pixels")
        stored = f"{box_format} in {'pixels of the original image' if units == 'pixels' else units}"
        coordinates = options.get("coordinates", _env_default("coordinates"))
        side = options.get("image_size", _env_default("image_size"))
        if coordinates == "pixels" and options.get("input_size"):
            size = options["input_size"]
            asked = f"pixels of the {size}x{size} image the model sees (its processor resizes the {side}x{side} shown)"
        elif coordinates == "pixels" and options.get("resize") == "native":
            asked = "pixels of each image at its shown size"
        elif coordinates == "pixels":
            asked = f"pixels of the {side}x{side} image shown"
        else:
            asked = f"{coordinates}, relative to the image"
        return f"boxes: {stored} in the data; the model ({self.model}) is asked for and scored in {asked}"


def check_dataset(
    path: str, model: str | None = None, config: str | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> DataReport:
    """Read the dataset at `path` as a run would (see the module docstring) and report on it.

    Args:
        path: the dataset (`env.options.path`): a JSON-lines file, a folder, anything the `dataset` env reads.
        model: `model.path` (a folder, `tiny:<family>`, a cached hub id); also counts prompt tokens when given.
        config: a YAML preset whose env is `dataset`; None: the defaults.
        overrides: `key=value` env options or `section.field=value` config fields, applied after the preset.

    Raises:
        ConfigError: a bad override, or a preset whose env is not `dataset`.
        InputError: an env option the env refuses, or a dataset with no good row.
    """
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{item}: an override is key=value (an env option) or section.field=value")
    fields = [item if "." in item.split("=", 1)[0] else f"env.options.{item}" for item in overrides]
    fields = [f"env.options.path={path}", *fields] + ([f"model.path={model}"] if model else [])
    if config is None:
        fields = [f"env.name={ENV}", *fields]
    elif (name := load_config(config).env.name) != ENV:
        raise ConfigError(f"env.name: {config} trains on the {name!r} env; data check reads {ENV!r} datasets")
    cfg = load_config(config, fields)
    # Images at their own sizes are bounded by the model's processor as a run bounds them (`mmrl train` fills the
    # bounds in when it builds the run; the cold start's own objection to native sizes is no concern here).
    cfg = native_pixel_bounds(replace(cfg, sft=replace(cfg.sft, episodes=0)))
    options = dict(cfg.env.make_options())
    quiet = io.StringIO()  # the env's own one-line summary of skipped rows: the report names each of them
    with contextlib.redirect_stderr(quiet):
        env = sim.make(ENV, num_envs=1, **{**options, "bad_records": "skip"})
    report = DataReport(str(path), dict(cfg.env.options), cfg.model.path)
    report.bad += env.skipped_records
    report.rows = len(env.records) + len(env.skipped_records)
    counter = _PromptTokens(cfg) if model else None
    report.tokens = None if counter is None else []
    for index, record in enumerate(env.records):
        try:
            width, height = env.check_record(index)
        except InputError as error:
            report.bad.append(str(error))
            continue
        kind = next(k for k in TARGET_KINDS if getattr(record, k) is not None)
        report.kinds.setdefault(kind, Counter())[record.reward] += 1
        report.widths.append(width)
        report.heights.append(height)
        shown = env.shown_size(index)
        report.shown.append(shown)
        if counter is not None:
            report.tokens.append(counter(env.instruction(index), shown))  # type: ignore[union-attr]
    env.close()
    return report


def run(args: argparse.Namespace) -> int:
    """`mmrl data check`: print the report; 2 when a row is bad, else 0."""
    report = check_dataset(args.path, args.model, args.config, args.overrides)
    for line in report.lines():
        print(line)
    return 2 if report.bad else 0


class _PromptTokens:
    """Prompt tokens of one row as the policy writes its prompt: the model's chat template around the prompt template,
    the question with its hint, and one image's tokens (as many as the model's image processor gives an image of the
    shown size; computed once per size)."""

    def __init__(self, cfg: TrainConfig):
        path = cfg.model.path
        try:
            if path.startswith(TINY_PREFIX):
                processor = tiny_processor(path.removeprefix(TINY_PREFIX))
            else:
                folder = model_folder(path)
                if folder is None:
                    raise InputError(f"--model {path}: no model folder there (nor a cached hub model)")
                processor = VisionTextProcessor.from_pretrained(folder)
            processor.set_pixel_range(cfg.model.min_pixels, cfg.model.max_pixels)
        except (OSError, ValueError, KeyError) as error:
            if isinstance(error, InputError):
                raise
            raise InputError(f"--model {path}: cannot read its tokenizer and image processor: {error}") from None
        processor.system_prompt = cfg.model.system_prompt
        self.processor, self.template = processor, cfg.model.prompt_template
        self._image_texts: dict[tuple[int, int], list[str]] = {}

    def __call__(self, instruction: str, size: tuple[int, int]) -> int:
        if size not in self._image_texts:
            self._image_texts[size] = self.processor.vision([Image.new("RGB", size)], [1]).texts
        text = self.processor.prompt_text(instruction, num_images=1, template=self.template)
        expanded = self.processor.expand(text, iter(self._image_texts[size]))
        return len(self.processor.tokenizer(expanded, add_special_tokens=False)["input_ids"])


def _spread(values: list[int]) -> str:
    return f"min {min(values)} / median {statistics.median(values):g} / max {max(values)}"


def _size(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def _env_default(name: str):
    return inspect.signature(sim.ENVS.get(ENV)).parameters[name].default
