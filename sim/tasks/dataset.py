"""Files on disk as a single-step text env: a user's RefCOCO-, ScreenSpot- or ChartQA-style data trains with no code.

The records are read and validated in `sim.tasks.records`; this module is the env.

**Task.** Each world shows one record's image (letterboxed to `image_size`, or at its own size: "Images" below),
with the record's question (plus, with `answer_hint`, one sentence saying how to answer, in the units of "Coordinates"
below, e.g. `"Answer with <answer>[x1, y1, x2, y2]</answer> in pixels of the 64x64 image."`). The policy answers
once; the answer is scored by a reward registered in `rewards.REWARDS`, and the episode ends.

**Data** (`path`): a JSON-lines file (or a folder holding `data.jsonl`), a parquet file, a folder laid out as a
Hugging Face dataset repository (parquet shards, the split `hf_split`, the card's config `hf_config`), or a folder
written by `Dataset.save_to_disk`, read as published (docs/datasets.md); one row a line in JSON lines:

    {"image": "images/0001.png", "question": "Find the red car.", "box": [12, 30, 57, 64]}
    {"image": "/data/screens/17.png", "instruction": "Click 'Save'.", "point": [211.5, 40]}
    {"image": "charts/3.png", "question": "What is the peak value?", "answer": "42.5"}
    {"image": "street.png", "question": "Find every car.", "boxes": [[3, 40, 21, 52], [30, 38, 60, 55]]}

The image is a path (relative to the data's folder), bytes, a `{"bytes", "path"}` struct or a list of one; the
question the text (`<image>` placeholders dropped); the target `answer` (text, a number, or a list of accepted
texts), `box`, `boxes` (every object to find; `[]` for none) or `point`. The public sets' names (`problem`, `query`,
`label`, `bbox`, `images`, chat `messages`, ...) are found without options (`sim.tasks.columns`); `columns` maps
role -> column where two could be one. Boxes (`box_format` `"xyxy"`/`"xywh"`, `box_units` `"pixels"`/`"0-1"`/
`"0-1000"`) become pixels of the original image.
Bad records (unreadable JSON, a missing, broken or too large image file, a missing or malformed field, a box or
point outside its image, a row with several images) raise `sim.errors.InputError` (a `ValueError`) at construction,
naming the line (or row) and the field; image files are checked from their headers then (`sim.tasks.records`),
embedded images when a world first shows them (parquet rows are read lazily: `sim.tasks.parquet`). With
`bad_records="skip"` bad records are left out instead, counted and named on stderr (`skipped_records` lists why).

**Images** (`resize`). `"letterbox"` (default): the image is resized so that its longer side is `image_size`
(bilinear), keeping its aspect ratio, and pasted centred on a black `image_size` square. Boxes and points are mapped
the same way, `x' = x * w' / w + (S - w') // 2` and `y' = y * h' / h + (S - h') // 2` (w x h the original size,
w' x h' the resized one, S = `image_size`), so targets and answers are both in pixels of the image the policy sees.
`"native"`: each record keeps its own resolution, bounded as Qwen-VL's processors bound it (qwen-vl-utils'
`smart_resize`, `sim.tasks.records.fit_pixels`): aspect kept, both sides multiples of `factor` (the vision tower's
patch x merge size), the area within [`min_pixels`, `max_pixels`]; a Qwen-VL processor with the same bounds then
resizes it no further, so its pixels are the model's. `mmrl train` fills the three from the model (its
`model.min_pixels`/`max_pixels`, or its processor's own, and its patch grid) unless set. Boxes and points are
scaled, `x' = x * w' / w`, `y' = y * h' / h`, and the hint names each image's own size. The observation stays one
tensor: each image fills the top-left w' x h' of a black canvas as large as the largest record needs, and
`Observation.sizes` says how much (`Observation.view_images` crops; policies encode the cropped images). The
default stays `"letterbox"` because the presets' recorded figures (`dataset_tiny` and the others on this env) were
measured with it.

**Coordinates** (`coordinates`, `input_size`). Boxes and points are asked for and read in the units the model's family
writes them (`rewards.coordinates`; `mmrl train` chooses them from `model.path` as for the grounding env,
`mmrl.runtime.conventions`): `"pixels"` of the image as the model sees it (the letterboxed square as its processor
resizes it, `input_size` on a side when set; each image's own shown size with `"native"`), or `"0-1000"` / `"0-1"`
relative to the image. The hint names them ("... in pixels of the 56x56 image.", "... in coordinates relative to the
image, 0 to 1000."). Targets stay in pixels of the shown image (`info["target_box"]`); the rewards get them converted
to the answers' units (`from_pixels`), where box IoU, GIoU, point-in-box and the box-list rewards score exactly as in
pixels, and the expert writes its answers in those units. The default, pixels of the shown image, is what the
presets' recorded figures were measured with (their model, the tiny warm start, says it answers in pixels).

**Reward** (`reward`): a name in `rewards.REWARDS`, called as `fn(completions, target_box=..., answer=...)` (each
function takes the targets it names; `reward_kwargs` maps a reward name to its options, e.g.
`{"numeric_match": {"rel_tol": 0.05}}` for ChartQA's relaxed accuracy). Box targets feed `target_box`; a point
target feeds `target_box` as the square of half-side `point_tolerance * image_size` around it (so `point_in_box`
scores "within that many pixels of the point" on both axes); `boxes` feed `target_boxes` (`matched_iou`,
`detection_f1`: the answer lists every box it finds); text targets feed `answer`. With `reward=None` each record gets
the reward of its target: `box` -> `box_iou`, `boxes` -> `matched_iou`, `point` -> `point_in_box`, a numeric `answer`
("42", "-3.5", "45%") -> `numeric_match`, any other `answer` -> `exact_match`. Each reward used is logged as a
component (0 in rows it does not score). To add terms (a format bonus, a second box reward) or replace the record's
reward, mix rewards in YAML with `env.rewards` (`sim.mix`); this env hands those rewards `target_box`,
`target_boxes` (in the answers' units) and `answer`.

**Success** where the reward has a natural one: IoU >= 0.5 (`box_iou`, `box_giou`: the IoU of the same answer), a
hit (`point_in_box`), a match (`exact_match`, `numeric_match`, `multiple_choice`), every object found at IoU >= 0.5
and nothing else (`matched_iou`, `detection_f1`: the F1 at IoU 0.5 is 1); rows scored by other rewards count as not
successful, and `info["success"]` is left out when no reward in use has one.

**Seeds and the held-out split.** Three parts, as a Hugging Face dataset's `train` / `validation` / `test` splits:
the last `eval_fraction` of the records is the test split, the `val_fraction` before them (default 0: none) the
validation split (each at least one record when its fraction is > 0), the rest trains. Data that ships its own
splits (a hub repository's `validation-*.parquet`, a saved `DatasetDict`) can use them instead: `hf_validation_split`
and `hf_test_split` name the splits read as those parts (each read and checked as `hf_split`'s, its rows named with
their split: `"validation-00000-of-00001.parquet (split 'validation') row 3"`), `hf_split` the training one; a part
takes a named split or a fraction, not both (`eval_fraction` at its default 0.1 is unused with `hf_test_split`). With
`split="auto"` (default)
a seed reads the part of its range in `sim.seeds`: test seeds (>= `EVAL_SEED_BASE`, 1e9: the score before and after a
run, `mmrl eval`) the test records, validation seeds (`trainer.eval_every`, `mmrl eval --split validation`) the
validation records (none kept: an error naming `val_fraction`), other seeds the training records. Within its part,
seed `s` (less its range's base) picks `part[order_e[s % m]]`, `m` the part's size, `e = s // m` the epoch, `order_e`
a permutation drawn from `(shuffle_seed, part, e)` (the identity with `shuffle=False`): each epoch visits every
record once. The test records and their order do not depend on `val_fraction`. `split="train"` / `"validation"` /
`"test"` send every seed into that part; `split="all"` uses every record and holds none out.

**Re-asked multiple-choice questions** (`consistency`, ACRE: https://arxiv.org/abs/2510.10104). With `"measure"` or
`"acre"` every record is a `multiple_choice` question whose options are written inline, `(A) ... (B) ...`, and each
episode runs two turns: the question, then the same question with its options shuffled and the first completion's
reasoning quoted. The component `consistent` is 1 where both answers pick the same option; the reward is the first
answer's (`measure`: consistency is only measured) or ACRE's consistency-verified reward (`acre`: 1 for a right first
answer the re-ask keeps, `acre_partial` for one it overturns, 0 for a wrong one). See `sim.tasks.choices`.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image

from rewards import REWARDS
from rewards.combine import BoundReward
from rewards.consistency import split_options
from rewards.coordinates import check_coordinates, from_pixels
from sim.base import Observation, SingleStepImageEnv, StepResult, check_expert_noise, check_text_actions
from sim.errors import InputError
from sim.registry import ENVS
from sim.tasks.answers import answer_hint, format_answer, has_success, low_score_reason, successes, units_phrase
from sim.tasks.choices import ConsistencyMode, ReAsk
from sim.tasks.columns import BoxFormat, BoxUnits, check_layout
from sim.tasks.parts import DEFAULT_EVAL_FRACTION, RecordParts, check_named_splits, read_parts
from sim.tasks.records import Record, fit_pixels, image_size_of, in_pixels, open_image

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PATH = REPO / "assets" / "datasets" / "shapes_qa" / "data.jsonl"


@ENVS.register("dataset")
class DatasetEnv(SingleStepImageEnv):
    """N worlds of single-step questions about images read from disk (see the module docstring).

    >>> env = DatasetEnv(num_envs=2)  # the sample dataset assets/datasets/shapes_qa
    >>> obs = env.reset(seed=0)
    >>> env.step(env.expert_action()).reward  # the records' own answers score full marks
    tensor([1., 1.])

    Args:
        num_envs: N, the number of worlds.
        path: A JSON-lines file (or a folder holding `data.jsonl`), a parquet file, a hub repository folder of
            parquet files, or a folder saved by `datasets`.
        reward: A name in `rewards.REWARDS`, or None to pick one per record from its target.
        image_size: Side of the square images the policy sees, in pixels (`resize="letterbox"`).
        resize: `"letterbox"` (every image into one `image_size` square) or `"native"` (each record's own size,
            bounded by `min_pixels`/`max_pixels` on a `factor` grid); see "Images" in the module docstring.
        min_pixels: With `resize="native"`, the least area an image is brought up to, in pixels.
        max_pixels: With `resize="native"`, the most area an image keeps, in pixels.
        factor: With `resize="native"`, what both sides are multiples of (Qwen2-VL's 14 px patches merged 2x2: 28).
        split: `"auto"` (each seed reads its range's part: test seeds >= 1e9 the test records, validation seeds the
            validation records), `"train"`, `"validation"`, `"test"` or `"all"`.
        eval_fraction: The share of records, at the end of the data, held out as the test split (not used with
            `hf_test_split`, which refuses any other value than the default or 0).
        val_fraction: The share of records, just before the test records, kept as the validation split (taken from
            the training records: 0 keeps them all for training).
        shuffle: Visit each part in a per-epoch shuffled order (else in file order).
        shuffle_seed: Seeds those orders.
        point_tolerance: Half-side of the square around a point target, as a fraction of `image_size` (of the
            shown image's longer side with `resize="native"`).
        coordinates: The units answers' boxes and points are asked for and read in: "pixels", "0-1000" or "0-1"
            (relative to the image), as the model family writes them (`mmrl train` chooses them from the model);
            see "Coordinates" in the module docstring.
        input_size: With "pixels" and `resize="letterbox"`, the side of the square image the model sees after its
            processor resizes it (Qwen-VL rounds sides to its patch grid); 0: `image_size`.
        reward_kwargs: Reward name -> options bound to that reward (`{"numeric_match": {"rel_tol": 0.05}}`).
        answer_hint: Append one sentence saying how to format the answer to each question.
        hf_split: The split to read (of a saved `DatasetDict`, or of a repository folder's parquet files): the
            training records, or every record where no other split is named.
        hf_validation_split: The data's own split that is the validation part (`"validation"` as the hub names it;
            verl's `data.val_files`), in place of `val_fraction`; None: none named.
        hf_test_split: The data's own split that is the test part (`"test"`), in place of `eval_fraction`.
        hf_config: The configuration to read where a repository's README card declares several.
        columns: Role -> the data's column, where the usual names do not find it (docs/datasets.md).
        box_format: The data's boxes: `"xyxy"`, or `"xywh"` (RefCOCO's `[x, y, w, h]`).
        box_units: `"pixels"` of the original image, or `"0-1"` / `"0-1000"` of its width and height.
        cache_size: Prepared (decoded, letterboxed) images kept in memory.
        consistency: `"off"` (one question), `"measure"` or `"acre"` (the question re-asked with shuffled options;
            see "Re-asked multiple-choice questions" in the module docstring).
        acre_partial: With `consistency="acre"`, the reward of a right first answer that the re-ask overturns.
        expert_number_offset: Added to every numeric answer (`numeric_match` records) that `expert_action`
            writes: an annotator with a systematic error, which the reward, scored on the record's own answer, lets
            RL undo (`configs/dataset_tiny.yaml`'s annotator misses one shape in every count: -1). 0 writes the
            records' answers as they are.
        bad_records: `"error"` (strict): a bad record stops the construction with its message. `"skip"`
            (lenient): bad records are left out, each message kept in `skipped_records`, and one line on stderr
            gives their count and the first; the data must still hold a good record.
        device: Where the returned tensors live.
    """

    def __init__(
        self,
        num_envs: int,
        path: str | os.PathLike[str] = DEFAULT_PATH,
        reward: str | None = None,
        image_size: int = 64,
        split: Literal["auto", "train", "validation", "test", "all"] = "auto",
        eval_fraction: float = DEFAULT_EVAL_FRACTION,
        val_fraction: float = 0.0,
        shuffle: bool = True,
        shuffle_seed: int = 0,
        point_tolerance: float = 0.05,
        reward_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        answer_hint: bool = True,
        hf_split: str = "train",
        hf_validation_split: str | None = None,
        hf_test_split: str | None = None,
        hf_config: str | None = None,
        columns: Mapping[str, str | None] | None = None,
        box_format: BoxFormat = "xyxy",
        box_units: BoxUnits = "pixels",
        cache_size: int = 1024,
        consistency: ConsistencyMode = "off",
        acre_partial: float = 0.5,
        expert_number_offset: float = 0.0,
        bad_records: Literal["error", "skip"] = "error",
        resize: Literal["letterbox", "native"] = "letterbox",
        min_pixels: int = 56 * 56,
        max_pixels: int = 28 * 28 * 1280,
        factor: int = 28,
        coordinates: str = "pixels",
        input_size: int = 0,
        device: str = "cpu",
    ):
        if num_envs < 1:
            raise InputError(f"num_envs must be >= 1, got {num_envs}")
        if image_size < 8:
            raise InputError(f"image_size must be >= 8, got {image_size}")
        eval_fraction = check_named_splits(hf_split, hf_validation_split, hf_test_split, eval_fraction, val_fraction)
        for name, value in (("eval_fraction", eval_fraction), ("val_fraction", val_fraction)):
            if not 0.0 <= value < 1.0:
                raise InputError(f"{name} must be in [0, 1), got {value}")
        if consistency not in ("off", "measure", "acre"):
            raise InputError(f"consistency must be 'off', 'measure' or 'acre', got {consistency!r}")
        if not isinstance(expert_number_offset, int | float) or not math.isfinite(expert_number_offset):
            raise InputError(f"expert_number_offset must be a finite number, got {expert_number_offset!r}")
        if point_tolerance <= 0:
            raise InputError(f"point_tolerance must be > 0, got {point_tolerance}")
        if reward is not None and reward not in REWARDS:
            raise InputError(f"unknown reward {reward!r}; registered: {', '.join(REWARDS.names())}")
        if resize not in ("letterbox", "native"):
            raise InputError(f"resize must be 'letterbox' or 'native', got {resize!r}")
        for name, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels), ("factor", factor)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be an int >= 1, got {value!r}")
        if min_pixels > max_pixels:
            raise InputError(f"min_pixels ({min_pixels}) must be <= max_pixels ({max_pixels})")
        if max_pixels < factor * factor:
            raise InputError(f"max_pixels ({max_pixels}) must hold one factor x factor cell ({factor * factor})")
        try:
            check_coordinates(coordinates, input_size)
        except ValueError as error:
            raise InputError(str(error)) from None
        if resize == "native" and input_size:
            raise InputError(
                f"input_size={input_size} is for letterboxed images; with resize='native' the model sees each image "
                "at its own size (leave input_size 0)"
            )
        if resize == "native" and consistency != "off":
            raise InputError(
                "consistency re-asks with the first turn's image, which conversations keep uncropped; use "
                "resize='letterbox' with it"
            )
        super().__init__(num_envs, image_size, device)
        self.resize = resize
        self.pixel_bounds = (min_pixels, max_pixels, factor)
        self.split = split
        self.shuffle = shuffle
        self.shuffle_seed = shuffle_seed
        self.point_tolerance = float(point_tolerance)
        self.coordinates, self.input_size = coordinates, input_size
        self.answer_hint = answer_hint
        self.expert_number_offset = float(expert_number_offset)

        self.path = Path(path)
        if not self.path.is_absolute() and not self.path.exists() and (REPO / self.path).exists():
            self.path = REPO / self.path  # presets name the shipped samples relative to the repository
        if bad_records not in ("error", "skip"):
            raise InputError(f"bad_records must be 'error' or 'skip', got {bad_records!r}")
        self.skipped_records: list[str] = []  # with bad_records="skip", why each left-out record was bad
        layout = check_layout(columns, box_format, box_units)
        self.records, self._rows, named = read_parts(
            self.path,
            reward,
            (hf_split, hf_validation_split, hf_test_split),
            self.skipped_records if bad_records == "skip" else None,
            layout,
            hf_config,
        )
        if self.skipped_records:
            total = len(self.records) + len(self.skipped_records)
            print(f"dataset {self.path.name}: skipped {len(self.skipped_records)} bad record(s) of {total} "
                  f"(bad_records='skip'); the first: {self.skipped_records[0]}", file=sys.stderr)  # fmt: skip
        count = len(self.records)
        self.parts = RecordParts(count, split, eval_fraction, val_fraction, shuffle, shuffle_seed, named)
        self.train_ids, self.val_ids, self.eval_ids = self.parts.train, self.parts.validation, self.parts.test

        kwargs = dict(reward_kwargs or {})
        used = sorted({r.reward for r in self.records})
        unknown = sorted(set(kwargs) - set(used))
        if unknown:
            raise InputError(f"reward_kwargs names rewards {unknown} that no record uses; used: {', '.join(used)}")
        self._fns = {name: BoundReward(name, REWARDS.get(name), kwargs.get(name, {})) for name in used}
        self._has_success = any(map(has_success, used))

        self._reask = None if consistency == "off" else self._re_asker(consistency, acre_partial)
        self._shown: list[tuple[int, int] | None] = [None] * count  # record -> (W', H') shown, native only
        self._sizes = torch.zeros(num_envs, 2, dtype=torch.long)  # [N, 2] (H', W') of each world's image
        if resize == "native":  # one canvas that holds every record's image: the largest W' and H'
            for index, record in enumerate(self.records):
                width, height = image_size_of(record, self._rows)
                try:
                    self._shown[index] = fit_pixels(width, height, factor, min_pixels, max_pixels)
                except InputError as error:
                    raise InputError(f"{record.where}: field 'image': {error}") from None
            canvas_w = max(size[0] for size in self._shown)  # type: ignore[index]
            canvas_h = max(size[1] for size in self._shown)  # type: ignore[index]
            self._images = torch.zeros(num_envs, canvas_h, canvas_w, 3, dtype=torch.uint8)  # [N, Hc, Wc, 3]
        else:
            self._sizes[:] = image_size
        self._prepared = functools.lru_cache(maxsize=cache_size)(self._prepare)
        self._record_ids = [-1] * num_envs  # target boxes are in pixels of the shown image, NaN for text targets
        self._boxes: list[torch.Tensor | None] = [None] * num_envs  # [T, 4] per world with a `boxes` record

    reward_target_names = ("target_box", "target_boxes", "answer")

    def reward_targets(self) -> dict[str, Any]:
        """The current worlds' targets for `env.rewards` (`sim.mix`): `target_box` `[N, 4]` (NaN rows without one),
        `target_boxes` (N entries, `[T, 4]` or None) and `answer` (N entries, None without one), boxes in the units
        answers are written in (`coordinates`)."""
        box, box_list = self._targets_in_units()
        return {
            "target_box": box,
            "target_boxes": box_list,
            "answer": [None if i < 0 else self.records[i].answer for i in self._record_ids],
        }

    def _in_units(self, index: int, values: torch.Tensor) -> torch.Tensor:
        """`[..., 2k]` pixel values of record `index`'s shown image in the units answers are written in."""
        width, height = self.shown_size(index)
        return from_pixels(values, self.coordinates, width, height, self.input_size)

    def _targets_in_units(self) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """The current worlds' target box `[N, 4]` and box lists (`[T, 4]` or None), as fresh tensors in the units
        answers are written in; the targets themselves stay in pixels of the shown images."""
        box = self._target_boxes.clone()  # [N, 4]
        box_list = [None if b is None else b.clone() for b in self._boxes]
        for k, index in enumerate(self._record_ids):
            if index >= 0:
                box[k] = self._in_units(index, box[k])
                box_list[k] = None if box_list[k] is None else self._in_units(index, box_list[k])
        return box, box_list

    # ------------------------------------------------------------------------------------------------ contract
    def record_index(self, seed: int) -> int:
        """The record a world reset with `seed` shows (see "Seeds and the held-out split" in the module docstring)."""
        return self.parts.record(seed)

    def draw_worlds(self, ids: list[int], seeds: list[int]) -> tuple[torch.Tensor, list[str], torch.Tensor]:
        """Show new records in the worlds `ids` (the `SingleStepImageEnv` hook; `record_index` maps seeds to them)."""
        images, boxes, instructions = [], [], []
        for k, world_seed in zip(ids, seeds):
            index = self.record_index(world_seed)
            image, box, box_list = self._prepared(index)
            images.append(image)
            boxes.append(box)
            self._sizes[k] = torch.tensor(self.shown_size(index)[::-1])
            self._boxes[k] = box_list
            self._record_ids[k] = index
            instructions.append(self.instruction(index))
            if self._reask is not None:
                self._reask.start(k, world_seed)
        return torch.stack(images), instructions, torch.stack(boxes)

    def score(self, texts: list[str]) -> tuple[torch.Tensor, dict[str, Any]]:
        """Score one answer per world (the `SingleStepImageEnv` hook; `step` ends every episode after it).

        Args:
            texts: N answer strings.

        Returns:
            Reward `[N]` and info: `reward_components` (one `[N]` entry per reward in use, 0 where it does not score
            the row), `reasons` (N strings, "" for a correct answer), `target_box` (`[N, 4]` float32 in pixels of the
            shown image, NaN rows for text targets), `record` (`[N]` int64 record indices) and, when a reward in use
            has a notion of it, `success` (`[N]` bool).
        """
        n = self.num_envs
        records = [self.records[i] for i in self._record_ids]
        reward = torch.zeros(n)
        success = torch.zeros(n, dtype=torch.bool)
        reasons = [""] * n
        components = {}
        target_box, target_boxes = self._targets_in_units()  # the answers' units: the rewards compare like with like
        for name, fn in self._fns.items():
            rows = [k for k, record in enumerate(records) if record.reward == name]
            component = torch.zeros(n)
            if rows:
                index = torch.tensor(rows)
                row_texts = [texts[k] for k in rows]
                targets = {
                    "target_box": target_box[index],
                    "target_boxes": [target_boxes[k] for k in rows],
                    "answer": [records[k].answer for k in rows],
                }
                scores = fn(row_texts, **targets).to(torch.float32)  # [K]
                component[index] = scores
                hit = successes(name, self._fns[name].kwargs, scores, row_texts, targets)  # [K] bool or None
                if hit is not None:
                    success[index] = hit
                for row, k in enumerate(rows):
                    reasons[k] = low_score_reason(
                        name, texts[k], float(scores[row]), None if hit is None else bool(hit[row])
                    )
            components[name] = component
            reward += component
        info: dict[str, Any] = {
            "reward_components": components,
            "reasons": reasons,
            "task": [record.reward for record in records],  # the kind of question: the reward that scores it
            "target_box": self._target_boxes.clone(),
            "record": torch.tensor(self._record_ids, dtype=torch.long),
        }
        if self._has_success:
            info["success"] = success
        return reward, info

    def step(self, actions: list[str]) -> StepResult:
        """Score one answer per world: every episode ends, or with `consistency` on, first answers get the re-asked
        question and second answers end their episodes (see the module docstring)."""
        if self._reask is None:
            return super().step(actions)
        texts = check_text_actions(actions, self.num_envs, type(self).__name__)
        ended = self._ended.nonzero().flatten().tolist()
        if ended:
            raise RuntimeError(f"worlds {ended} have ended their episode (or were never reset); reset them first")
        reward, info = self.score(texts)
        records = [self.records[i] for i in self._record_ids]
        reward, terminated, info, reasks = self._reask.step(
            texts, [r.question for r in records], [r.answer for r in records], reward, info
        )
        for k, question in reasks.items():
            self._instructions[k] = question
        self._ended |= terminated
        n, device = self.num_envs, self.device
        return StepResult(
            obs=self._observation(),
            reward=reward.to(device=device, dtype=torch.float32),
            terminated=terminated.to(device),
            truncated=torch.zeros(n, dtype=torch.bool, device=device),
            info={k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in info.items()},
        )

    def close(self) -> None:
        """Drop the cached images."""
        self._prepared.cache_clear()

    def _observation(self) -> Observation:
        """The base's observation, with each world's image size where images keep their own (`resize="native"`)."""
        obs = super()._observation()
        return replace(obs, sizes=self._out(self._sizes)) if self.resize == "native" else obs

    # ------------------------------------------------------------------------------------------------ expert
    def expert_action(self, noise: float = 0.0, generator: torch.Generator | None = None) -> list[str]:
        """Each world's target written the way its reward parses it, for an SFT cold start.

        Boxes as `<answer>[x1, y1, x2, y2]</answer>`, points as `<answer>(x, y)</answer>` (a box record under
        `point_in_box` answers with the box centre), both in the env's `coordinates` (whole pixels of the image as
        the model sees it, whole 0-1000 units, or 0-1 to three decimals); text as
        `<answer>text</answer>` (the first of several accepted texts).

        Args:
            noise: The probability that a world answers with the target of another record of its part instead
                (a plausible wrong answer).
            generator: Source of that randomness; required when `noise > 0`.

        Returns:
            N answer strings.
        """
        check_expert_noise(noise, generator, [k for k, index in enumerate(self._record_ids) if index < 0])
        answers = []
        for k, index in enumerate(self._record_ids):
            box, box_list = self._target_boxes[k], self._boxes[k]
            again = None if self._reask is None else self._reask.expert(k, self.records[index].answer)
            if again is not None:  # the re-asked question: the option the first answer picked, in the new letters
                answers.append(again)
                continue
            if noise > 0 and float(torch.rand((), generator=generator)) < noise:
                part = self.parts.part_of(index)
                index = part[int(torch.randint(len(part), (), generator=generator))]
                _, box, box_list = self._prepared(index)
            box = self._in_units(index, box)
            box_list = None if box_list is None else self._in_units(index, box_list)
            answers.append(
                format_answer(self.records[index], box, box_list, self.expert_number_offset, self.coordinates)
            )
        return answers

    # ------------------------------------------------------------------------------------------------ helpers
    def _re_asker(self, mode: ConsistencyMode, partial: float) -> ReAsk:
        """The re-asked questions' state, after checking that every record is a multiple-choice question with inline
        options."""
        for record in self.records:
            if record.reward != "multiple_choice":
                raise InputError(
                    f"consistency={mode!r} re-asks multiple-choice questions; {record.where} is scored by "
                    f"{record.reward!r} (set reward='multiple_choice')"
                )
            try:
                split_options(record.question)
            except ValueError as error:
                raise InputError(f"{record.where}: field 'question': {error}") from None
        self.max_episode_steps = 2
        hint = "Answer with the letter of your choice in <answer></answer>."
        return ReAsk(self.num_envs, mode, partial, self.shuffle_seed, hint if self.answer_hint else "answer again.")

    def shown_size(self, index: int) -> tuple[int, int]:
        """(W', H') of record `index`'s image as shown: its own bounded size, or the letterbox square."""
        shown = self._shown[index]
        return shown if shown is not None else (self.image_size, self.image_size)

    def check_record(self, index: int) -> tuple[int, int]:
        """(W, H) of record `index`'s image, decoded and its targets checked inside it, as a world showing it does
        (`mmrl data check` reads every record so).

        Raises:
            InputError: the image does not decode, or a box or point lies outside it; naming the record and field.
        """
        return self._open(index)[0].size

    def _open(self, index: int) -> tuple[Image.Image, Record]:
        """Record `index`'s image, decoded, and the record with its targets in pixels of it, checked inside it."""
        record = self.records[index]
        try:
            image = open_image(record.image, self._rows)
        except Exception as error:  # decoding happens here, not at construction: name the record
            raise InputError(f"{record.where}: field 'image': cannot read the image: {error}") from error
        # Done at construction for image files; embedded images are seen here (normalised boxes scaled to them).
        return image, in_pixels(record, *image.size)

    def _prepare(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Record `index`'s image as shown `[H, W, 3]` uint8 (letterboxed into the square, or resized to its bounded
        size at the top left of the canvas), target box `[4]` (NaN for text targets) and target boxes `[T, 4]` (None
        unless the record has `boxes`), in pixels of that image."""
        image, record = self._open(index)
        width, height = image.size
        if self.resize == "native":
            new_w, new_h = self._shown[index]  # type: ignore[misc]
            left = top = 0
            canvas = Image.new("RGB", (self._images.shape[2], self._images.shape[1]), (0, 0, 0))
            radius = self.point_tolerance * max(new_w, new_h)
        else:
            size = self.image_size
            scale = size / max(width, height)
            new_w, new_h = max(1, round(width * scale)), max(1, round(height * scale))
            left, top = (size - new_w) // 2, (size - new_h) // 2
            canvas = Image.new("RGB", (size, size), (0, 0, 0))
            radius = self.point_tolerance * size
        shown = image if (new_w, new_h) == (width, height) else image.resize((new_w, new_h), Image.BILINEAR)
        canvas.paste(shown, (left, top))
        sx, sy = new_w / width, new_h / height
        if record.box is not None:
            x1, y1, x2, y2 = record.box
            box = [x1 * sx + left, y1 * sy + top, x2 * sx + left, y2 * sy + top]
        elif record.point is not None:
            x, y = record.point[0] * sx + left, record.point[1] * sy + top
            box = [x - radius, y - radius, x + radius, y + radius]
        else:
            box = [math.nan] * 4
        box_list = None
        if record.boxes is not None:
            box_list = torch.tensor(
                [[x1 * sx + left, y1 * sy + top, x2 * sx + left, y2 * sy + top] for x1, y1, x2, y2 in record.boxes],
                dtype=torch.float32,
            ).reshape(-1, 4)  # [T, 4]
        return torch.from_numpy(np.asarray(canvas).copy()), torch.tensor(box, dtype=torch.float32), box_list

    def instruction(self, index: int) -> str:
        """Record `index`'s question, with the answer hint (naming the units of coordinates: the size of the image as
        the model sees it, or the relative scale)."""
        record = self.records[index]
        if not self.answer_hint:
            return record.question
        width, height = (self.input_size,) * 2 if self.input_size else self.shown_size(index)
        return f"{record.question} {answer_hint(record.reward, units_phrase(self.coordinates, width, height))}"
