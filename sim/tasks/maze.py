"""Visual maze navigation: read a top-down maze and answer the moves from the green cell to the red one.

After Ariadne (visual maze navigation with controlled difficulty): the image holds everything the answer needs,
the difficulty is one number (the length of the shortest path), and the answer is checked by walking it.

**Task.** Each world is an image of a `size` x `size` grid maze: dark walls on white, the start cell filled green,
the goal cell filled red. The instruction is `"Find the way through the maze from the green cell to the red cell."`,
followed (with `answer_hint`) by `"Answer with the moves, each one of U (up), D (down), L (left) or R (right),
separated by spaces: <answer>R R D L</answer>."`. Episodes last one step.

**Answer format.** The moves are read from the content of the last `<answer>...</answer>` tag (the whole text when
there is none; `<think>` blocks are dropped first). They are separated by whitespace, commas, semicolons, slashes,
hyphens or arrows (`->`, `→`); brackets, quotes and full stops around them are ignored. Each move is one of `U`, `D`,
`L`, `R` or the words `up`, `down`, `left`, `right`, in any case; a run of move letters such as `RRDL` reads as that
many moves. Anything else (an empty answer, prose, `X Y`) does not parse: reward 0 with a reason, never an error.
`U` is up the image (row - 1), `D` down (row + 1), `L` left (column - 1) and `R` right (column + 1).

**Randomizations** (per world, from that world's seed only): the maze, a perfect maze (exactly one path between any
two cells) carved by a randomized depth-first search (the recursive backtracker); the start cell; the goal cell,
drawn among the cells at least `min_path` moves from the start along the maze. A maze without such a pair is
replaced by the next one the world's generator draws, so the result still depends on the seed alone. The drawing
itself (colours, wall thickness, layout) is the same in every world.

**Reward.** The moves are walked from the start; a move into a wall (the outer border is a wall too) stops the walk
there, and the moves after it are ignored (so a walk stopped by a wall while on the goal has ended on it). With
`d(cell)` the length of the shortest path from a cell to the goal and `end` the cell the walk stops on:

    reward = 1                                                          if end is the goal
    reward = 0.5 * progress,  progress = max(0, 1 - d(end) / d(start))  otherwise

so only an answer that ends on the goal scores above 0.5; a walk that passes the goal and goes on ends elsewhere and
scores as partial progress. An answer that does not parse scores 0. Components (`[N]` float): `reached` (0/1),
`progress` (1 where the goal is reached), `format` (1 where the answer parsed). **Success** is ending on the goal.
`info["task"]` is `"path{L}"`, L the length of the world's shortest path, so evaluation reports by difficulty.
"""

from __future__ import annotations

import functools
import re
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw

from rewards import answer_region
from sim.base import SingleStepImageEnv, check_expert_noise
from sim.registry import ENVS

MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}  # move -> (row step, column step)
_WORDS = {"up": "U", "down": "D", "left": "L", "right": "R", **{m.lower(): m for m in MOVES}}
_SEPARATORS = re.compile(r"(?:\s|[,;/|]|->|→|-)+")
_STRIP = "[](){}'\".`"  # dropped from around the answer and around each move
_LETTERS = re.compile(r"[udlr]+", re.IGNORECASE)

BACKGROUND = (255, 255, 255)
WALL = (40, 40, 40)
START = (30, 160, 50)  # green
GOAL = (220, 30, 30)  # red
_MARGIN = 3  # pixels between the image border and the maze's outer wall
_MIN_CELL = 6  # smallest cell side in pixels that still leaves a visible coloured square inside the walls
_MAX_MAZES = 1000  # mazes a world may draw before giving up (min_path's bound makes one or two the rule)

Cell = tuple[int, int]  # (row, column), row 0 at the top


def max_min_path(size: int) -> int:
    """The largest `min_path` a `size` x `size` maze takes: `min(size**2 - 1, size**2 // 2 + size)`.

    `size**2 - 1` is the longest any path can be (one through every cell); random mazes rarely come close, so the
    bound stays where at least about half of the recursive backtracker's mazes have a long enough path (3x3: 7,
    4x4: 12, 8x8: 40), which keeps drawing a world to one or two mazes.
    """
    return min(size * size - 1, size * size // 2 + size)


@dataclass(frozen=True, eq=False)  # eq would compare arrays
class Maze:
    """A world: a grid maze with its start and goal.

    `right[r, c]` is True where cells (r, c) and (r, c + 1) are joined (no wall between them), `down[r, c]` where
    (r, c) and (r + 1, c) are; the last column of `right` and the last row of `down` are False (the outer wall).
    """

    right: np.ndarray  # [S, S] bool
    down: np.ndarray  # [S, S] bool
    start: Cell
    goal: Cell

    @property
    def size(self) -> int:
        return int(self.right.shape[0])

    def neighbour(self, cell: Cell, move: str) -> Cell | None:
        """The cell one `move` (U, D, L, R) away from `cell`, or None when a wall is in the way."""
        r, c = cell
        n = self.size
        if move == "U":
            ok = r > 0 and self.down[r - 1, c]
        elif move == "D":
            ok = r < n - 1 and self.down[r, c]
        elif move == "L":
            ok = c > 0 and self.right[r, c - 1]
        elif move == "R":
            ok = c < n - 1 and self.right[r, c]
        else:
            raise ValueError(f"unknown move {move!r}; valid: {', '.join(MOVES)}")
        dr, dc = MOVES[move]
        return (r + dr, c + dc) if ok else None

    @functools.cached_property
    def distance(self) -> np.ndarray:
        """`[S, S]` int: the length of the shortest path from each cell to the goal."""
        return bfs_distances(self, self.goal)

    @property
    def path_length(self) -> int:
        """The number of moves of the shortest path from the start to the goal."""
        return int(self.distance[self.start])

    @functools.cached_property
    def shortest_path(self) -> str:
        """The moves of the shortest (in a perfect maze, the only) path from the start to the goal, e.g. "RRDL"."""
        moves, cell = [], self.start
        while cell != self.goal:
            move, cell = next(
                (m, nb)
                for m in MOVES
                if (nb := self.neighbour(cell, m)) is not None and self.distance[nb] == self.distance[cell] - 1
            )
            moves.append(move)
        return "".join(moves)


@ENVS.register("maze")
class MazeEnv(SingleStepImageEnv):
    """N worlds of single-step maze navigation with text answers (see the module docstring for the task).

    >>> env = MazeEnv(num_envs=2, size=4, min_path=4)
    >>> obs = env.reset(seed=0)
    >>> env.step(env.expert_action()).reward  # the shortest paths reach the goal
    tensor([1., 1.])

    Args:
        num_envs: N, the number of worlds.
        image_size: Side of the square images, in pixels; each cell gets at least 6 of them.
        size: Cells per side of the maze (2 or more).
        min_path: The fewest moves of the shortest path from start to goal, the difficulty (what a curriculum
            raises); 1 to `max_min_path(size)` (3x3: 7, 4x4: 12, 8x8: 40).
        answer_hint: Append one sentence saying how to write the answer to each instruction.
        device: Where the returned tensors live. Mazes are always drawn on the CPU.
    """

    has_boxes = False

    def __init__(
        self,
        num_envs: int,
        image_size: int = 112,
        size: int = 4,
        min_path: int = 4,
        answer_hint: bool = True,
        device: str = "cpu",
    ):
        if isinstance(size, bool) or not isinstance(size, int) or size < 2:
            raise ValueError(f"size must be an int >= 2 (cells per side), got {size!r}")
        limit = max_min_path(size)
        if isinstance(min_path, bool) or not isinstance(min_path, int) or not 1 <= min_path <= limit:
            raise ValueError(
                f"min_path must be an int in 1..{limit} for size {size} (random {size}x{size} mazes rarely have "
                f"longer shortest paths), got {min_path!r}"
            )
        if isinstance(image_size, bool) or not isinstance(image_size, int) or _cell_side(image_size, size) < _MIN_CELL:
            need = _MIN_CELL * size + 2 * _MARGIN
            raise ValueError(f"image_size must be an int >= {need} for size {size} (cells of >= {_MIN_CELL} pixels), "
                             f"got {image_size!r}")  # fmt: skip
        super().__init__(num_envs, image_size, device)
        self.size = size
        self.min_path = min_path
        self.answer_hint = answer_hint
        self.mazes: list[Maze | None] = [None] * num_envs

    def draw_worlds(self, ids: list[int], seeds: list[int]) -> tuple[np.ndarray, list[str], None]:
        """Draw new mazes for the worlds `ids`, each from its own seed (the `SingleStepImageEnv` hook)."""
        images = np.empty((len(ids), self.image_size, self.image_size, 3), dtype=np.uint8)  # [K, H, W, 3]
        instruction = "Find the way through the maze from the green cell to the red cell."
        if self.answer_hint:
            instruction += (
                " Answer with the moves, each one of U (up), D (down), L (left) or R (right), separated by spaces: "
                "<answer>R R D L</answer>."
            )
        for row, (i, world_seed) in enumerate(zip(ids, seeds)):
            maze = generate_maze(self.size, self.min_path, world_seed)
            images[row] = draw_maze(maze, self.image_size)
            self.mazes[i] = maze
        return images, [instruction] * len(ids), None

    def score(self, texts: list[str]) -> tuple[torch.Tensor, dict]:
        """Walk one answer per world from its start (the `SingleStepImageEnv` hook; `step` ends every episode after).

        Args:
            texts: N answer strings, ideally `<answer>R R D L</answer>`.

        Returns:
            Reward `[N]` and info: `reward_components` (`reached`, `progress`, `format`: `[N]` float32), `reasons`
            (N strings: why the answer did not parse, which move hit a wall, or how far from the goal the walk
            ended; "" where it reached the goal), `success` (`[N]` bool, the walk ended on the goal) and `task`
            (N strings `"path{L}"`).
        """
        n = self.num_envs
        reached = torch.zeros(n)  # [N]
        progress = torch.zeros(n)  # [N]
        parsed = torch.zeros(n)  # [N]
        reasons, tasks = [], []
        for k, text in enumerate(texts):
            maze = self.mazes[k]
            assert maze is not None, "step checks that every world was reset"
            tasks.append(f"path{maze.path_length}")
            moves, reason = parse_moves(text)
            if moves is None:
                reasons.append(reason)
                continue
            parsed[k] = 1.0
            end, reason = walk(maze, moves)
            left, total = int(maze.distance[end]), maze.path_length  # total >= min_path >= 1
            if left == 0:
                reached[k] = progress[k] = 1.0
            else:
                progress[k] = max(0.0, 1.0 - left / total)
                reason = f"{reason}; " if reason else ""
                reason += f"ends {left} move{'s' if left > 1 else ''} from the goal ({total} from the start)"
            reasons.append(reason if left else "")
        reward = torch.where(reached > 0, reached, 0.5 * progress)  # [N]
        info = {
            "reward_components": {"reached": reached, "progress": progress, "format": parsed},
            "reasons": reasons,
            "success": reached > 0,
            "task": tasks,
        }
        return reward, info

    # ------------------------------------------------------------------------------------------------ expert
    def expert_action(self, noise: float = 0.0, generator: torch.Generator | None = None) -> list[str]:
        """Each world's shortest path as `<answer>R R D L</answer>`, for an SFT cold start.

        Args:
            noise: The probability that a world's answer is corrupted: one move (drawn uniformly) is dropped or
                changed to another direction, with equal chances (a one-move path is always changed). Such an answer
                almost never reaches the goal.
            generator: Source of that randomness; required when `noise > 0`.

        Returns:
            N answer strings.
        """
        check_expert_noise(noise, generator, [k for k, maze in enumerate(self.mazes) if maze is None])
        answers = []
        for maze in self.mazes:
            assert maze is not None  # checked above
            moves = list(maze.shortest_path)
            if noise > 0 and float(torch.rand((), generator=generator)) < noise:
                at = int(torch.randint(len(moves), (), generator=generator))
                drop = bool(torch.randint(2, (), generator=generator)) and len(moves) > 1
                if drop:
                    del moves[at]
                else:
                    others = [m for m in MOVES if m != moves[at]]
                    moves[at] = others[int(torch.randint(len(others), (), generator=generator))]
            answers.append(f"<answer>{' '.join(moves)}</answer>")
        return answers


def parse_moves(text: str) -> tuple[list[str] | None, str]:
    """The moves of an answer (see the module docstring for the format); never raises.

    Returns:
        The moves as letters of `MOVES` and "", or None and the reason the answer does not parse.
    """
    region = answer_region(text).strip().strip(_STRIP)
    moves: list[str] = []
    for token in _SEPARATORS.split(region):
        token = token.strip(_STRIP + ".")
        if not token:
            continue
        word = _WORDS.get(token.lower())
        if word is not None:
            moves.append(word)
        elif _LETTERS.fullmatch(token):
            moves.extend(token.upper())
        else:
            shown = token if len(token) <= 20 else token[:20] + "..."
            return None, f"cannot read {shown!r} as a move (U, D, L or R)"
    if not moves:
        return None, "no moves in the answer"
    return moves, ""


def walk(maze: Maze, moves: list[str]) -> tuple[Cell, str]:
    """Walk `moves` from the maze's start; the walk stops at the first move into a wall.

    Returns:
        The cell the walk ends on, and "" or the reason it stopped early (e.g. "move 3 (L) hits a wall").
    """
    cell = maze.start
    for number, move in enumerate(moves, start=1):
        nxt = maze.neighbour(cell, move)
        if nxt is None:
            return cell, f"move {number} ({move}) hits a wall"
        cell = nxt
    return cell, ""


def bfs_distances(maze: Maze, source: Cell) -> np.ndarray:
    """`[S, S]` int: the number of moves from `source` to each cell (-1 where unreachable; never in a perfect maze)."""
    distance = np.full((maze.size, maze.size), -1, dtype=np.int64)  # [S, S]
    distance[source] = 0
    queue = deque([source])
    while queue:
        cell = queue.popleft()
        for move in MOVES:
            nxt = maze.neighbour(cell, move)
            if nxt is not None and distance[nxt] < 0:
                distance[nxt] = distance[cell] + 1
                queue.append(nxt)
    return distance


def carve_maze(size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A perfect maze by randomized depth-first search (the recursive backtracker, iteratively).

    Returns:
        `right` and `down`, `[S, S]` bool each (see `Maze`).
    """
    right = np.zeros((size, size), dtype=bool)  # [S, S]
    down = np.zeros((size, size), dtype=bool)  # [S, S]
    seen = np.zeros((size, size), dtype=bool)  # [S, S]
    first = (int(rng.integers(size)), int(rng.integers(size)))
    seen[first] = True
    stack = [first]
    while stack:
        r, c = stack[-1]
        fresh = [
            (r + dr, c + dc)
            for dr, dc in MOVES.values()
            if 0 <= r + dr < size and 0 <= c + dc < size and not seen[r + dr, c + dc]
        ]
        if not fresh:
            stack.pop()
            continue
        nr, nc = fresh[int(rng.integers(len(fresh)))]
        if nr == r:
            right[r, min(c, nc)] = True
        else:
            down[min(r, nr), c] = True
        seen[nr, nc] = True
        stack.append((nr, nc))
    return right, down


def generate_maze(size: int, min_path: int, seed: int) -> Maze:
    """One world from its own seed: a maze, a start, and a goal at least `min_path` moves from the start.

    Starts are tried in a random order; the goal is drawn uniformly among the cells far enough from the first start
    that has any. A maze where no pair is far enough apart is replaced by the next one the same generator carves.
    """
    rng = np.random.default_rng(seed)
    for _ in range(_MAX_MAZES):
        right, down = carve_maze(size, rng)
        for index in rng.permutation(size * size):
            start = divmod(int(index), size)
            distance = bfs_distances(Maze(right, down, start, start), start)  # [S, S]
            far = np.argwhere(distance >= min_path)  # [F, 2]
            if len(far):
                goal = far[int(rng.integers(len(far)))]
                return Maze(right, down, start, (int(goal[0]), int(goal[1])))
    raise RuntimeError(f"no {size}x{size} maze with a path of >= {min_path} moves in {_MAX_MAZES} tries (seed {seed})")


def draw_maze(maze: Maze, image_size: int) -> np.ndarray:
    """The top-down picture of a maze: `[H, W, 3]` uint8, walls dark on white, start green, goal red.

    The maze is centred, `(image_size - 6) // size` pixels a cell; walls are lines of `max(2, cell // 8)` pixels
    centred on the grid lines, and the start and goal are filled squares kept clear of the walls.
    """
    n = maze.size
    cell = _cell_side(image_size, n)
    offset = (image_size - cell * n) // 2
    thick = max(2, cell // 8)
    canvas = Image.new("RGB", (image_size, image_size), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    inset = thick + max(1, cell // 8)
    for (r, c), colour in ((maze.start, START), (maze.goal, GOAL)):
        x, y = offset + c * cell, offset + r * cell
        draw.rectangle((x + inset, y + inset, x + cell - inset, y + cell - inset), fill=colour)

    def line(x0: int, y0: int, x1: int, y1: int) -> None:
        # A wall along the grid line from (x0, y0) to (x1, y1), thickened around it (PIL boxes include both ends).
        half = thick // 2
        draw.rectangle((x0 - half, y0 - half, x1 - half + thick - 1, y1 - half + thick - 1), fill=WALL)

    end = offset + n * cell
    line(offset, offset, end, offset)  # the outer wall
    line(offset, end, end, end)
    line(offset, offset, offset, end)
    line(end, offset, end, end)
    for r in range(n):
        for c in range(n):
            x, y = offset + c * cell, offset + r * cell
            if c < n - 1 and not maze.right[r, c]:
                line(x + cell, y, x + cell, y + cell)
            if r < n - 1 and not maze.down[r, c]:
                line(x, y + cell, x + cell, y + cell)
    return np.asarray(canvas)


def _cell_side(image_size: int, size: int) -> int:
    """The side of a cell, in pixels, of a `size` x `size` maze drawn `image_size` pixels wide."""
    return (image_size - 2 * _MARGIN) // size
