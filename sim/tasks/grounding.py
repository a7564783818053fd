"""Synthetic visual grounding: find "the red circle" among a few coloured shapes and answer with its box.

**Task.** Each world is an image of 2-4 flat shapes on a light background and the instruction
`"Find the {colour} {kind}."`. The policy answers with text, ideally `<answer>[x1, y1, x2, y2]</answer>` in the
model family's units (`coordinates`, chosen from the model by the config, `mmrl.families`): pixels of the image
as the model saw it (`input_size` on a side after its processor's resize; the image's own size by default), or 0-1000
or 0-1 relative, which the instruction then names ("Coordinates are relative, 0 to 1000."). Answers are converted to
pixels of the drawn image before scoring. Episodes last one step.

**Randomizations** (per world, from that world's seed only): background tone; number of shapes; each shape's
kind (circle, square, triangle, diamond), colour (red, green, blue, yellow), size and position; which shape is
the target. Shapes never overlap, and every distractor differs from the target in colour or kind, so the
instruction names exactly one shape.

**Reward.** `iou_weight * IoU(answer box, target box) + format_weight * [text is exactly <answer>[box]</answer>]`
`+ giou_weight * (GIoU + 1) / 2`. With `answer_format="think_answer"` (DeepSeek-R1's, https://arxiv.org/abs/2501.12948)
the format term is `think_answer_format_reward` (exactly `<think>...</think><answer>...</answer>`), the box is read
only from the `<answer>` tag after the think block, and `info["reasons"]` says what is malformed. The optional GIoU term (https://arxiv.org/abs/1902.09630) is dense: a box that
misses still scores more the closer it is, which gives RL a signal where IoU is zero for almost every sample.
**Success** is IoU >= 0.5.

The target box is the tight box of the target's drawn pixels, `[x1, y1, x2, y2]` with x2 and y2 exclusive (so a
shape covering columns 10..19 has x1=10, x2=20), as floats.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw

from rewards import box_giou, box_iou, extract_answer, format_reward, parse_boxes, strip_think
from rewards.coordinates import HINTS, check_coordinates, to_pixels
from rewards.text import think_answer_format_reward, think_answer_problem
from sim.base import SingleStepImageEnv
from sim.registry import ENVS

KINDS = ("circle", "square", "triangle", "diamond")
ANSWER_FORMATS = ("answer", "think_answer")
# Saturated and far apart in RGB, and each has a channel below 60 while backgrounds have all channels >= 185,
# so no shape colour can be confused with the background, even by exact pixel matching.
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (235, 195, 10),
}
_MAX_PLACEMENT_TRIES = 50  # per shape; a shape that finds no free spot is dropped, so a world may have fewer
_GAP = 2  # free pixels kept between the footprints of two shapes, so they never touch


@dataclass(frozen=True)
class Shape:
    """One drawn shape of a scene."""

    kind: str  # one of KINDS
    colour: str  # one of COLOURS
    box: tuple[int, int, int, int]  # tight pixel box (x1, y1, x2, y2), x2/y2 exclusive


@dataclass(frozen=True)
class Scene:
    """The description a world's image was drawn from."""

    shapes: tuple[Shape, ...]  # in drawing order
    target: int  # index into shapes of the shape the instruction names
    background: tuple[int, int, int]  # RGB

    @property
    def target_shape(self) -> Shape:
        return self.shapes[self.target]


@ENVS.register("grounding")
class GroundingEnv(SingleStepImageEnv):
    """N worlds of single-step visual grounding with text answers (see the module docstring for the task).

    >>> env = GroundingEnv(num_envs=2, image_size=64)
    >>> obs = env.reset(seed=0)
    >>> boxes = env.target_boxes  # [2, 4]
    >>> answers = [f"<answer>[{', '.join(str(int(v)) for v in b)}]</answer>" for b in boxes.tolist()]
    >>> env.step(answers).reward  # iou_weight + format_weight
    tensor([1.1000, 1.1000])

    Args:
        num_envs: N, the number of worlds.
        image_size: Side of the square images, in pixels.
        min_shapes: Fewest shapes per image (target included).
        max_shapes: Most shapes per image. Fewer may be drawn when the placement tries run out.
        min_size: Smallest shape side, in pixels.
        max_size: Largest shape side, in pixels.
        iou_weight: Weight of the IoU term of the reward.
        format_weight: Weight of the exact-format term of the reward.
        giou_weight: Weight of the shaping term `(GIoU + 1) / 2` in [0, 1] (0: off); unparsed answers score 0.
        coordinates: The units answers are read in: "pixels", "0-1000" or "0-1" (relative to the image side), as
            the model family writes boxes (`mmrl.families`); relative units are named in the instruction.
        input_size: With "pixels", the side of the image the model sees after its processor resizes it (Qwen-VL
            rounds sides to its patch grid); 0: `image_size`.
        answer_format: "answer" (`<answer>[box]</answer>`, or a bare box without the format term) or "think_answer"
            (DeepSeek-R1's `<think>...</think><answer>[box]</answer>`; the box only from the answer tag).
        device: Where the returned tensors live. Scenes are always drawn on the CPU.
    """

    def __init__(
        self,
        num_envs: int,
        image_size: int = 112,
        min_shapes: int = 2,
        max_shapes: int = 4,
        min_size: int = 16,
        max_size: int = 36,
        iou_weight: float = 1.0,
        format_weight: float = 0.1,
        giou_weight: float = 0.0,
        coordinates: str = "pixels",
        input_size: int = 0,
        answer_format: str = "answer",
        device: str = "cpu",
    ):
        if not 1 <= min_shapes <= max_shapes:
            raise ValueError(f"need 1 <= min_shapes <= max_shapes, got {min_shapes}, {max_shapes}")
        if not 3 <= min_size <= max_size <= image_size:
            raise ValueError(f"need 3 <= min_size <= max_size <= image_size, got {min_size}, {max_size}, {image_size}")
        check_coordinates(coordinates, input_size)
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}")
        self.answer_format = answer_format
        super().__init__(num_envs, image_size, device)
        self.coordinates = coordinates
        self.input_size = input_size
        self.min_shapes = min_shapes
        self.max_shapes = max_shapes
        self.min_size = min_size
        self.max_size = max_size
        self.iou_weight = iou_weight
        self.format_weight = format_weight
        self.giou_weight = giou_weight
        self.scenes: list[Scene | None] = [None] * num_envs

    def draw_worlds(self, ids: list[int], seeds: list[int]) -> tuple[np.ndarray, list[str], np.ndarray]:
        """Draw new scenes for the worlds `ids`, each from its own seed (the `SingleStepImageEnv` hook)."""
        images = np.empty((len(ids), self.image_size, self.image_size, 3), dtype=np.uint8)  # [K, H, W, 3]
        boxes = np.empty((len(ids), 4), dtype=np.float32)  # [K, 4]
        instructions = []
        for row, (i, world_seed) in enumerate(zip(ids, seeds)):
            images[row], scene = self._draw_world(world_seed)
            boxes[row] = scene.target_shape.box
            self.scenes[i] = scene
            target = scene.target_shape
            instructions.append(f"Find the {target.colour} {target.kind}.{HINTS[self.coordinates]}")
        return images, instructions, boxes

    def score(self, texts: list[str]) -> tuple[torch.Tensor, dict]:
        """Score one answer per world (the `SingleStepImageEnv` hook; `step` ends every episode after it).

        Args:
            texts: N answer strings, ideally `<answer>[x1, y1, x2, y2]</answer>`.

        Returns:
            Reward `[N]` and info: `reward_components` (`iou`, `format`: `[N]`), `reasons` (N strings, "" where the
            answer parsed), `target_box` and `pred_box` (`[N, 4]` float32, NaN rows where nothing parsed) and
            `success` (`[N]` bool, IoU >= 0.5).
        """
        if self.answer_format == "think_answer":  # R1: the box only from the answer tag after the think block
            answers = [extract_answer(strip_think(t)) if isinstance(t, str) else None for t in texts]
            pred, reasons = parse_boxes([f"<answer>{a}</answer>" if a is not None else "" for a in answers])
            problems = [think_answer_problem(t) for t in texts]
            reasons = ["; ".join(r for r in pair if r) for pair in zip(problems, reasons)]
            fmt = think_answer_format_reward(texts)  # [N]
        else:
            pred, reasons = parse_boxes(texts)
            fmt = format_reward(texts).to(torch.float32)  # [N]
        pred = pred.to(torch.float32)  # [N, 4], NaN rows where unparsed
        size = self.image_size
        pred = to_pixels(pred, self.coordinates, size, size, self.input_size)  # [N, 4] pixels of the drawn image
        target = self._target_boxes.clone()  # [N, 4]
        iou = box_iou(pred, target).to(torch.float32)  # [N]
        reward = self.iou_weight * iou + self.format_weight * fmt  # [N]
        components = {"iou": iou, "format": fmt}
        if self.giou_weight:
            components["giou"] = (box_giou(pred, target).to(torch.float32) + 1) / 2  # [N] in [0, 1]
            reward = reward + self.giou_weight * components["giou"]
        info = {
            "reward_components": components,
            "reasons": list(reasons),
            "target_box": target,
            "pred_box": pred.clone(),
            "success": iou >= 0.5,
        }
        return reward, info

    def _draw_world(self, seed: int) -> tuple[np.ndarray, Scene]:
        """Draw one world from its own seed.

        Args:
            seed: The world's seed; nothing else influences the result.

        Returns:
            The image `[H, W, 3]` uint8 and the scene it was drawn from.
        """
        rng = np.random.default_rng(seed)
        size = self.image_size
        # A light grey, tinted towards a random pastel: every channel stays in [185, 245].
        grey = int(rng.integers(200, 236))
        red, green, blue = (int(np.clip(grey + t, 185, 245)) for t in rng.integers(-15, 16, size=3))
        background = (red, green, blue)
        canvas = Image.new("RGB", (size, size), background)

        kind_ids = list(range(len(KINDS)))
        colour_names = list(COLOURS)
        target_kind = KINDS[int(rng.choice(kind_ids))]
        target_colour = colour_names[int(rng.integers(len(colour_names)))]
        # Distractors draw from every (kind, colour) pair except the target's, so the instruction stays unique.
        others = [(k, c) for k in KINDS for c in colour_names if (k, c) != (target_kind, target_colour)]
        count = int(rng.integers(self.min_shapes, self.max_shapes + 1))
        wanted = [(target_kind, target_colour)] + [others[int(j)] for j in rng.integers(len(others), size=count - 1)]

        footprints: list[tuple[int, int, int, int]] = []  # (x, y, side, side) of placed shapes
        shapes: list[Shape] = []
        target = 0
        for n, (kind, colour) in enumerate(wanted):
            side = int(rng.integers(self.min_size, self.max_size + 1))
            spot = None
            for _ in range(_MAX_PLACEMENT_TRIES):
                x, y = (int(v) for v in rng.integers(0, size - side + 1, size=2))
                if all(_apart((x, y, side), f) for f in footprints):
                    spot = (x, y)
                    break
            if spot is None:
                if n == 0:  # cannot happen on an empty canvas (side <= size), but never lose the target silently
                    raise RuntimeError("could not place the target shape")
                continue
            x, y = spot
            mask, (left, top, right, bottom) = _shape_mask(kind, side)
            canvas.paste(COLOURS[colour], (x, y), mask)
            footprints.append((x, y, side, side))
            if n == 0:
                target = len(shapes)
            shapes.append(Shape(kind, colour, (x + left, y + top, x + right, y + bottom)))

        # Shuffle the scene list so the target's position in it carries no information.
        order = [int(j) for j in rng.permutation(len(shapes))]
        scene = Scene(
            shapes=tuple(shapes[j] for j in order),
            target=order.index(target),
            background=background,
        )
        return np.asarray(canvas), scene


def _apart(candidate: tuple[int, int, int], placed: tuple[int, int, int, int]) -> bool:
    """Whether a square (x, y, side) keeps `_GAP` pixels away from a placed footprint (x, y, w, h)."""
    x, y, side = candidate
    px, py, pw, ph = placed
    return x + side + _GAP <= px or px + pw + _GAP <= x or y + side + _GAP <= py or py + ph + _GAP <= y


@functools.lru_cache(maxsize=1024)
def _shape_mask(kind: str, side: int) -> tuple[Image.Image, tuple[int, int, int, int]]:
    """A shape filling a `side` x `side` square, drawn once per (kind, side) and cached (callers never modify it).

    Returns:
        The mask (mode "L", 255 inside the shape) and the tight box of its drawn pixels (x1, y1, x2, y2),
        x2/y2 exclusive.
    """
    mask = Image.new("L", (side, side), 0)
    draw = ImageDraw.Draw(mask)
    last = side - 1  # PIL boxes are inclusive of both corners
    mid = last / 2
    if kind == "circle":
        draw.ellipse((0, 0, last, last), fill=255)
    elif kind == "square":
        draw.rectangle((0, 0, last, last), fill=255)
    elif kind == "triangle":
        draw.polygon([(mid, 0), (last, last), (0, last)], fill=255)
    elif kind == "diamond":
        draw.polygon([(mid, 0), (last, mid), (mid, last), (0, mid)], fill=255)
    else:
        raise ValueError(f"unknown shape kind {kind!r}; valid: {', '.join(KINDS)}")
    box = mask.getbbox()
    assert box is not None, f"empty {kind} mask of side {side}"
    return mask, box
