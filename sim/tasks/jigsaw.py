"""Jigsaw puzzles (after Jigsaw-R1, https://arxiv.org/abs/2505.23590): put the shuffled tiles of a picture back.

**Task.** Each world is a picture cut into a `grid` x `grid` grid of square tiles that have been shuffled, shown with
thin white lines between the tiles. The tiles are numbered 1..n (n = grid * grid) in reading order (left to right,
top to bottom) of the shuffled image as shown. The policy answers, for each position of the restored picture in
reading order, the number of the shown tile that belongs there. For a 2x2 puzzle, `<answer>[3, 1, 4, 2]</answer>`
says: the restored top-left is shown tile 3 (the shown bottom-left), the restored top-right is shown tile 1, the
restored bottom-left is shown tile 4 and the restored bottom-right is shown tile 2. Episodes last one step. `grid` is
the difficulty (the option a curriculum varies).

**Randomizations** (per world, from that world's seed only): the source picture (a two-axis colour gradient, so every
tile differs from every other and its colour hints where it belongs, under 3-6 translucent shapes that straddle the
tile borders, so neighbours continue each other) and the shuffle, a uniform permutation that is never the identity.
The picture does not depend on `grid`: the same seed shows the same picture cut finer at a higher level.

**Answer parsing** (never raises). The answer region is the last `<answer>...</answer>` (think blocks removed), else
the whole text; in it, the last `[...]` list, or else a bare list of integers (`3, 1, 4, 2`). Anything else, a list
of the wrong length, or one that is not a permutation of 1..n scores 0 with a reason.

**Reward.** `placed + format_weight * format`, where `placed` is the fraction of positions holding the right tile
(dense: a swap of two tiles in a 3x3 puzzle still earns 7/9) and `format` is 1 when the answer parsed as a
permutation of 1..n. The small format term (0.1 by default, as in grounding) lets GRPO tell a well-formed wrong order
from garbage early in training. **Success** is every tile placed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw

from rewards.parse import answer_region
from sim.base import SingleStepImageEnv, check_expert_noise
from sim.registry import ENVS

GRIDS = (2, 3, 4)
MIN_TILE = 8  # pixels per tile side: thinner tiles are mostly grid line
_LINE = (255, 255, 255)  # the grid lines' colour; they cover the pixel row/column on each side of a tile border
_MAX_DRAWS = 10  # pictures drawn per world until no two tiles are pixel-identical (the first one always is)
_LIST = re.compile(r"\[([^\[\]]*)\]")
_BARE_LIST = re.compile(r"[\d\s,+]+")  # one character class: linear, no backtracking blow-up
_NUMBER = re.compile(r"\+?\d{1,6}")  # longer digit strings are never a tile number (and int() of them is costly)


@dataclass(frozen=True)
class Puzzle:
    """What a world's image was made from."""

    picture: np.ndarray  # [H, W, 3] uint8, the solved picture (without grid lines)
    shown: tuple[int, ...]  # n entries: the source tile (0-based, reading order) shown at each position
    solution: tuple[int, ...]  # n entries: the expected answer, the shown tile (1-based) for each solved position


@ENVS.register("jigsaw")
class JigsawEnv(SingleStepImageEnv):
    """N worlds of single-step jigsaw puzzles with text answers (see the module docstring for the task).

    >>> env = JigsawEnv(num_envs=2, grid=2)
    >>> obs = env.reset(seed=0)
    >>> env.step(env.expert_action()).reward  # placed + format_weight
    tensor([1.1000, 1.1000])

    Args:
        num_envs: N, the number of worlds.
        image_size: Side of the square images, in pixels; a multiple of `grid` with tiles of at least `MIN_TILE`.
        grid: Tiles per side, one of `GRIDS` (2, 3, 4): the difficulty.
        answer_hint: Whether the instruction spells out the tile numbering and the answer format (with an example);
            False leaves that to the prompt template and names only the task.
        format_weight: Weight of the format term (the answer parsed as a permutation) of the reward.
        device: Where the returned tensors live. Pictures are always drawn on the CPU.
    """

    has_boxes = False

    def __init__(
        self,
        num_envs: int,
        image_size: int = 112,
        grid: int = 2,
        answer_hint: bool = True,
        format_weight: float = 0.1,
        device: str = "cpu",
    ):
        if isinstance(grid, bool) or grid not in GRIDS:
            raise ValueError(f"grid must be one of {', '.join(map(str, GRIDS))}, got {grid!r}")
        if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size % grid:
            raise ValueError(f"image_size must be an int divisible by grid={grid}, got {image_size!r}")
        if image_size // grid < MIN_TILE:
            raise ValueError(f"image_size {image_size} gives tiles under {MIN_TILE} pixels at grid={grid}")
        if not isinstance(answer_hint, bool):
            raise ValueError(f"answer_hint must be a bool, got {answer_hint!r}")
        if isinstance(format_weight, bool) or not isinstance(format_weight, (int, float)):
            raise ValueError(f"format_weight must be a number, got {format_weight!r}")
        if not math.isfinite(format_weight) or format_weight < 0:
            raise ValueError(f"format_weight must be a finite number >= 0, got {format_weight!r}")
        super().__init__(num_envs, image_size, device)
        self.grid = grid
        self.answer_hint = answer_hint
        self.format_weight = float(format_weight)
        self.puzzles: list[Puzzle | None] = [None] * num_envs
        self._solutions = torch.zeros(num_envs, grid * grid, dtype=torch.long)  # [N, n], 1-based; 0: never reset

    @property
    def num_tiles(self) -> int:
        """n = grid * grid, the length of an answer."""
        return self.grid * self.grid

    @property
    def target_orders(self) -> torch.Tensor:
        """The expected answers `[N, n]` int64 (1-based tile numbers; rows of zeros for worlds never reset), a copy."""
        return self._out(self._solutions)

    # ------------------------------------------------------------------------------------------------ hooks
    def draw_worlds(self, ids: list[int], seeds: list[int]) -> tuple[np.ndarray, list[str], None]:
        """Draw new puzzles for the worlds `ids`, each from its own seed (the `SingleStepImageEnv` hook)."""
        images = np.empty((len(ids), self.image_size, self.image_size, 3), dtype=np.uint8)  # [K, H, W, 3]
        for row, (i, world_seed) in enumerate(zip(ids, seeds)):
            images[row], puzzle = self._draw_world(world_seed)
            self.puzzles[i] = puzzle
            self._solutions[i] = torch.tensor(puzzle.solution)
        return images, [self._instruction()] * len(ids), None

    def score(self, texts: list[str]) -> tuple[torch.Tensor, dict]:
        """Score one answer per world (the `SingleStepImageEnv` hook; `step` ends every episode after it).

        Args:
            texts: N answer strings, ideally `<answer>[t1, ..., tn]</answer>`.

        Returns:
            Reward `[N]` and info: `reward_components` (`placed`: the fraction of positions holding the right tile,
            `format`: 1 where the answer parsed as a permutation of 1..n; `[N]` each), `reasons` (N strings, "" where
            every tile is placed), `success` (`[N]` bool, every tile placed) and `task` (N strings `grid{g}`).
        """
        n = self.num_tiles
        pred = torch.zeros(self.num_envs, n, dtype=torch.long)  # [N, n], rows of zeros where nothing parsed
        parsed = torch.zeros(self.num_envs, dtype=torch.bool)  # [N]
        reasons = []
        for i, text in enumerate(texts):
            order, reason = parse_order(text, n)
            if order is not None:
                pred[i] = torch.tensor(order)
                parsed[i] = True
            reasons.append(reason)
        hits = pred == self._solutions  # [N, n]
        placed = torch.where(parsed, hits.float().mean(-1), 0.0)  # [N]
        fmt = parsed.float()  # [N]
        success = parsed & hits.all(-1)  # [N]
        for i in range(self.num_envs):
            if parsed[i] and not success[i]:
                reasons[i] = f"{int(hits[i].sum())} of {n} tiles in place"
        info = {
            "reward_components": {"placed": placed, "format": fmt},
            "reasons": reasons,
            "success": success,
            "task": [f"grid{self.grid}"] * self.num_envs,
        }
        return placed + self.format_weight * fmt, info

    def expert_action(self, noise: float = 0.0, generator: torch.Generator | None = None) -> list[str]:
        """Each world's solution as `<answer>[t1, ..., tn]</answer>`, for an SFT cold start.

        Args:
            noise: The probability that a world's answer has two of its entries swapped (a plausible slip that
                leaves n - 2 tiles in place), in [0, 1].
            generator: Source of that randomness; required when `noise > 0`.

        Returns:
            N answer strings.

        Raises:
            ValueError: `noise` is outside [0, 1], or `noise > 0` without a generator.
            RuntimeError: Some world was never reset.
        """
        check_expert_noise(noise, generator, [i for i, puzzle in enumerate(self.puzzles) if puzzle is None])
        answers = []
        for puzzle in self.puzzles:
            order = list(puzzle.solution)
            if noise > 0 and float(torch.rand((), generator=generator)) < noise:
                a, b = torch.randperm(len(order), generator=generator)[:2].tolist()
                order[a], order[b] = order[b], order[a]
            answers.append(format_order(order))
        return answers

    # ------------------------------------------------------------------------------------------------ helpers
    def _instruction(self) -> str:
        g, n = self.grid, self.num_tiles
        task = f"This picture was cut into a {g}x{g} grid of tiles, and the tiles were shuffled."
        if not self.answer_hint:
            return f"{task} Restore the picture."
        example = format_order(list(range(n, 0, -1)))
        return (
            f"{task} The tiles are numbered 1 to {n} in reading order (left to right, top to bottom) as shown. For "
            f"each position of the restored picture, in reading order, give the number of the tile that belongs "
            f"there, as a list of all {n} numbers, for example {example}."
        )

    def _draw_world(self, seed: int) -> tuple[np.ndarray, Puzzle]:
        """Draw one world from its own seed.

        Args:
            seed: The world's seed; nothing else influences the result.

        Returns:
            The shuffled image with grid lines `[H, W, 3]` uint8 and the puzzle it shows.
        """
        rng = np.random.default_rng(seed)
        g, n, size = self.grid, self.num_tiles, self.image_size
        side = size // g
        for _ in range(_MAX_DRAWS):
            picture = _draw_picture(rng, size)
            tiles = picture.reshape(g, side, g, side, 3).swapaxes(1, 2).reshape(n, side, side, 3)  # [n, t, t, 3]
            if len({tile.tobytes() for tile in tiles}) == n:  # distinct tiles: the solution is unique
                break
        else:  # the gradient makes tiles differ by construction; never answer an ambiguous puzzle silently
            raise RuntimeError(f"seed {seed}: no picture with {n} distinct tiles in {_MAX_DRAWS} draws")
        shown = rng.permutation(n)
        while (shown == np.arange(n)).all():  # an unshuffled puzzle is no puzzle
            shown = rng.permutation(n)
        image = tiles[shown].reshape(g, g, side, side, 3).swapaxes(1, 2).reshape(size, size, 3)  # [H, W, 3]
        image = image.copy()
        for k in range(1, g):  # 2-pixel lines centred on the inner tile borders
            image[:, k * side - 1 : k * side + 1] = _LINE
            image[k * side - 1 : k * side + 1, :] = _LINE
        solution = tuple(int(j) + 1 for j in np.argsort(shown))  # solved position p holds shown tile solution[p]
        return image, Puzzle(picture=picture, shown=tuple(int(j) for j in shown), solution=solution)


def format_order(order: list[int]) -> str:
    """An answer as the env parses it: `<answer>[3, 1, 4, 2]</answer>`."""
    return f"<answer>[{', '.join(str(t) for t in order)}]</answer>"


def parse_order(text: str, n: int) -> tuple[list[int] | None, str]:
    """Read a permutation of 1..n out of one completion; total (never raises).

    Args:
        text: One completion.
        n: The number of tiles.

    Returns:
        The n tile numbers and "", or None and the reason the answer is not a permutation of 1..n.
    """
    region = answer_region(text)
    lists = _LIST.findall(region)
    if lists:
        body = lists[-1]
    elif _BARE_LIST.fullmatch(region):
        body = region
    else:
        return None, f"no [..] list of tile numbers in {_preview(region)}"
    items = [item.strip() for item in (body.split(",") if "," in body else body.split())]
    if items and not items[-1]:  # "[]", or a trailing comma as in "[3, 1, 4, 2,]"
        items.pop()
    if len(items) != n:
        return None, f"expected {n} tile numbers, got {len(items)}"
    if not all(_NUMBER.fullmatch(item) for item in items):
        return None, f"not a list of whole numbers: [{_preview(body)}]"
    order = [int(item) for item in items]
    if sorted(order) != list(range(1, n + 1)):
        return None, f"not a permutation of 1..{n}: {order}"
    return order, ""


def _preview(text: str, limit: int = 40) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _draw_picture(rng: np.random.Generator, size: int) -> np.ndarray:
    """A source picture `[size, size, 3]` uint8: a colour gradient along both axes under 3-6 translucent shapes.

    One channel ramps along x and another along y by at least 70 levels over the image, so tiles of different
    columns (rows) differ in every background pixel; shapes at most 200/255 opaque keep a third of that visible.
    """
    base = rng.integers(60, 196, size=3).astype(np.float64)  # every channel stays in [5, 250] after the ramps
    x_channel, y_channel = (int(c) for c in rng.permutation(3)[:2])
    ramp = np.linspace(-0.5, 0.5, size)
    picture = np.broadcast_to(base, (size, size, 3)).copy()  # [H, W, 3]
    picture[:, :, x_channel] += rng.choice([-1, 1]) * rng.integers(70, 111) * ramp[None, :]
    picture[:, :, y_channel] += rng.choice([-1, 1]) * rng.integers(70, 111) * ramp[:, None]
    canvas = Image.fromarray(np.round(picture).astype(np.uint8)).convert("RGBA")
    for _ in range(int(rng.integers(3, 7))):
        layer = Image.new("RGBA", (size, size), (0, 0, 0, 0))
        draw = ImageDraw.Draw(layer)
        colour = (*(int(c) for c in rng.integers(0, 256, size=3)), int(rng.integers(140, 201)))
        w, h = (int(v) for v in rng.integers(size // 5, size // 2 + 1, size=2))
        x, y = (int(v) for v in rng.integers(-size // 10, size - size // 10, size=2))
        kind = int(rng.integers(4))
        if kind == 0:
            draw.ellipse((x, y, x + w, y + h), fill=colour)
        elif kind == 1:
            draw.rectangle((x, y, x + w, y + h), fill=colour)
        elif kind == 2:
            draw.polygon([(x + w / 2, y), (x + w, y + h), (x, y + h)], fill=colour)
        else:
            draw.line((x, y, x + w, y + h), fill=colour, width=max(2, size // 20))
        canvas = Image.alpha_composite(canvas, layer)
    return np.asarray(canvas.convert("RGB")).copy()
