"""The maze task: perfect mazes as hard as asked, an expert that always arrives, and answers walked move by move."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
import torch

import sim.tasks.maze  # noqa: F401  (registers `maze`)
from sim import check_vec_env, make
from sim.tasks.maze import BACKGROUND, GOAL, START, WALL, Maze, MazeEnv, max_min_path, parse_moves

# A 3x3 snake by hand: (0,0) -> (0,1) -> (0,2) v (1,2) -> (1,1) -> (1,0) v (2,0) -> (2,1) -> (2,2).
#   +--+--+--+
#   |S       |
#   +--+--+  +
#   |        |
#   +  +--+--+
#   |       G|
#   +--+--+--+
SNAKE = Maze(
    right=np.array([[1, 1, 0], [1, 1, 0], [1, 1, 0]], dtype=bool),
    down=np.array([[0, 0, 1], [1, 0, 0], [0, 0, 0]], dtype=bool),
    start=(0, 0),
    goal=(2, 2),
)  # shortest path R R D L L D R R (8 moves); distances to the goal: (1,2) 5, (0,2) 6, (2,0) 2, (2,1) 1


def _reference_distances(maze: Maze, source: tuple[int, int]) -> np.ndarray:
    """BFS over the wall arrays directly, independent of `Maze.neighbour`."""
    n = maze.size
    dist = np.full((n, n), -1)
    dist[source] = 0
    queue = deque([source])
    while queue:
        r, c = queue.popleft()
        steps = [
            ((r, c + 1), c + 1 < n and maze.right[r, c]),
            ((r, c - 1), c > 0 and maze.right[r, c - 1]),
            ((r + 1, c), r + 1 < n and maze.down[r, c]),
            ((r - 1, c), r > 0 and maze.down[r - 1, c]),
        ]
        for cell, open_ in steps:
            if open_ and dist[cell] < 0:
                dist[cell] = dist[r, c] + 1
                queue.append(cell)
    return dist


def _snake_env(answers: list[str]):
    """An env whose every world holds SNAKE, stepped with `answers`."""
    env = MazeEnv(num_envs=len(answers), size=3, min_path=2)
    env.reset(seed=0)
    env.mazes = [SNAKE] * len(answers)
    return env.step(answers)


def test_contract_with_garbage_and_with_the_expert():
    for n, seed, size in ((4, 0, 4), (1, 7, 3), (3, 11, 6)):
        env = make("maze", num_envs=n, size=size, min_path=3)
        check_vec_env(env, seed=seed)
        env.reset(seed=seed)
        check_vec_env(env, seed=seed, actions=env.expert_action())


@pytest.mark.parametrize("size", [2, 3, 4, 8])
def test_expert_reaches_the_goal_on_every_seed(size):
    env = MazeEnv(num_envs=50, size=size, min_path=max_min_path(size), image_size=112)
    env.reset(seed=1000)
    answers = env.expert_action()
    result = env.step(answers)
    torch.testing.assert_close(result.reward, torch.ones(50))
    assert result.info["success"].all()
    assert result.info["reasons"] == [""] * 50
    for k, component in result.info["reward_components"].items():
        torch.testing.assert_close(component, torch.ones(50), msg=k)
    lengths = [maze.path_length for maze in env.mazes]
    assert [len(parse_moves(a)[0]) for a in answers] == lengths
    assert result.info["task"] == [f"path{length}" for length in lengths]


@pytest.mark.parametrize(("size", "min_path"), [(2, 3), (3, 1), (3, 7), (4, 6), (4, 12), (6, 20), (8, 40)])
def test_mazes_are_perfect_and_as_hard_as_asked(size, min_path):
    env = MazeEnv(num_envs=40, size=size, min_path=min_path, image_size=112)
    env.reset(seed=size * 100 + min_path)
    for k, maze in enumerate(env.mazes):
        # A perfect maze is a spanning tree of the grid: S*S - 1 passages, every cell reachable.
        assert int(maze.right.sum() + maze.down.sum()) == size * size - 1, f"world {k}"
        assert not maze.right[:, -1].any() and not maze.down[-1].any(), f"world {k}: a hole in the outer wall"
        dist = _reference_distances(maze, maze.goal)
        assert (dist >= 0).all(), f"world {k}: some cell cannot reach the goal"
        assert dist[maze.start] == maze.path_length >= min_path, f"world {k}: path {dist[maze.start]} < {min_path}"
        np.testing.assert_array_equal(maze.distance, dist)


def test_shorter_min_path_gives_shorter_paths_on_average():
    easy, hard = MazeEnv(num_envs=64, size=5, min_path=1), MazeEnv(num_envs=64, size=5, min_path=15)
    easy.reset(seed=0)
    hard.reset(seed=0)
    mean_easy = np.mean([m.path_length for m in easy.mazes])
    mean_hard = np.mean([m.path_length for m in hard.mazes])
    assert min(m.path_length for m in easy.mazes) < 15 and mean_easy + 3 < mean_hard


def test_hand_computed_rewards_on_a_snake():
    answers = {
        "<answer>R R D L L D R R</answer>": (1.0, 1.0, ""),
        "r, r, d, l, l, d, r, r": (1.0, 1.0, ""),  # no tags, commas, lower case
        "<answer>RRDLLDRR</answer>": (1.0, 1.0, ""),  # a run of letters
        "<answer>[right -> right -> down -> left -> left -> down -> right -> right]</answer>": (1.0, 1.0, ""),
        "<answer>R R D</answer>": (0.5 * (1 - 5 / 8), 1 - 5 / 8, "ends 5 moves from the goal (8 from the start)"),
        "<answer>R R D L L D</answer>": (0.5 * (1 - 2 / 8), 1 - 2 / 8, "ends 2 moves from the goal"),
        "<answer>R L</answer>": (0.0, 0.0, "ends 8 moves from the goal"),  # back at the start: no progress
        # Past the goal and on: ends one move away, so partial credit below 0.5.
        "<answer>R R D L L D R R L</answer>": (0.5 * (1 - 1 / 8), 1 - 1 / 8, "ends 1 move from the goal"),
        # A wall stops the walk on the goal: it has ended there.
        "<answer>R R D L L D R R U</answer>": (1.0, 1.0, ""),
    }
    result = _snake_env(list(answers))
    components = result.info["reward_components"]
    for k, (text, (reward, progress, reason)) in enumerate(answers.items()):
        assert result.reward[k].item() == pytest.approx(reward), text
        assert components["progress"][k].item() == pytest.approx(progress), text
        assert components["reached"][k].item() == float(reward == 1.0), text
        assert components["format"][k].item() == 1.0, text
        assert bool(result.info["success"][k]) == (reward == 1.0), text
        if reason:
            assert reason in result.info["reasons"][k], (text, result.info["reasons"][k])
        else:
            assert result.info["reasons"][k] == "", text
    assert result.info["task"] == ["path8"] * len(answers)


def test_a_wall_stops_the_walk_and_names_the_move():
    answers = [
        # Move 2 runs into the wall under (0,1); had the walk gone on from (0,1), the rest would reach the goal.
        "<answer>R D R D L L D R R</answer>",
        "<answer>R R R D</answer>",  # move 3 leaves the grid: the outer wall
        "<answer>D</answer>",
    ]
    result = _snake_env(answers)
    reasons = result.info["reasons"]
    assert reasons[0].startswith("move 2 (D) hits a wall") and "ends 7 moves from the goal" in reasons[0]
    assert reasons[1].startswith("move 3 (R) hits a wall") and "ends 6 moves from the goal" in reasons[1]
    assert reasons[2].startswith("move 1 (D) hits a wall")
    torch.testing.assert_close(result.reward, torch.tensor([0.5 * (1 - 7 / 8), 0.5 * (1 - 6 / 8), 0.0]))
    assert not result.info["success"].any()
    torch.testing.assert_close(result.info["reward_components"]["format"], torch.ones(3))


def test_malformed_answers_score_zero_with_a_reason():
    answers = [
        "",
        "   ",
        "<answer></answer>",
        "I would go right and then down to the red cell.",
        "X Y",
        "<answer>R R Q</answer>",
        "<answer>[0, 0, 10, 10]</answer>",
        "<think>R R D L L D R R</think>",  # an answer inside the reasoning does not count
        "}{",
        "→ → →",
    ]
    result = _snake_env(answers)
    torch.testing.assert_close(result.reward, torch.zeros(len(answers)))
    torch.testing.assert_close(result.info["reward_components"]["format"], torch.zeros(len(answers)))
    assert not result.info["success"].any()
    assert all(result.info["reasons"]), result.info["reasons"]
    assert "'X'" in result.info["reasons"][4] and "'Q'" in result.info["reasons"][5]


def test_parsing_never_raises_on_random_text():
    gen = torch.Generator().manual_seed(0)
    alphabet = list("UDLRudlrXq ,;-/>→[]()<>'\".\n\t") + ["<answer>", "</answer>", "<think>", "</think>", "up"]
    texts = []
    for _ in range(300):
        length = int(torch.randint(0, 30, (), generator=gen))
        picks = torch.randint(len(alphabet), (length,), generator=gen).tolist()
        texts.append("".join(alphabet[i] for i in picks))
    for text in texts:
        moves, reason = parse_moves(text)
        assert (moves is None and reason) or (moves and reason == "" and set(moves) <= set("UDLR")), repr(text)
    result = _snake_env(texts)  # and scoring them never raises either
    assert ((result.reward >= 0) & (result.reward <= 1)).all()
    assert (result.info["reward_components"]["format"] == 1).any() and (result.reward == 0).any()


def test_the_image_shows_the_maze():
    size, image_size = 5, 112
    env = MazeEnv(num_envs=6, size=size, min_path=5, image_size=image_size)
    obs = env.reset(seed=3)
    cell = (image_size - 6) // size  # the documented layout: centred, (image_size - 6) // size pixels a cell
    offset = (image_size - cell * size) // 2
    colours = {name: torch.tensor(value, dtype=torch.uint8) for name, value in
               (("bg", BACKGROUND), ("wall", WALL), ("start", START), ("goal", GOAL))}  # fmt: skip
    for k, maze in enumerate(env.mazes):
        image = obs.image[k]  # [H, W, 3]
        for name, (r, c) in (("start", maze.start), ("goal", maze.goal)):
            centre = (offset + c * cell + cell // 2, offset + r * cell + cell // 2)  # (x, y)
            assert torch.equal(image[centre[1], centre[0]], colours[name]), (
                f"world {k}: no {name} colour at cell {(r, c)}"
            )
            is_colour = (image == colours[name]).all(-1)  # [H, W]
            ys, xs = is_colour.nonzero(as_tuple=True)
            assert (xs >= offset + c * cell).all() and (xs < offset + (c + 1) * cell).all(), f"world {k}"
            assert (ys >= offset + r * cell).all() and (ys < offset + (r + 1) * cell).all(), f"world {k}"
        for r in range(size):
            for c in range(size):
                x, y = offset + c * cell, offset + r * cell
                if c < size - 1:  # the middle of the boundary with the cell to the right
                    want = "bg" if maze.right[r, c] else "wall"
                    assert torch.equal(image[y + cell // 2, x + cell], colours[want]), f"world {k}: {(r, c)} right"
                if r < size - 1:
                    want = "bg" if maze.down[r, c] else "wall"
                    assert torch.equal(image[y + cell, x + cell // 2], colours[want]), f"world {k}: {(r, c)} down"
        # The outer wall is closed.
        assert torch.equal(image[offset + cell // 2, offset], colours["wall"])
        assert torch.equal(image[offset + size * cell - cell // 2, offset + size * cell], colours["wall"])


def test_same_seed_same_world_and_different_seed_different_world():
    a = MazeEnv(num_envs=4).reset(seed=5)
    b = MazeEnv(num_envs=4).reset(seed=5)
    c = MazeEnv(num_envs=4).reset(seed=6)
    assert torch.equal(a.image, b.image) and a.instruction == b.instruction
    # Seeds are seed + k, so seed 6 shifts the worlds of seed 5 by one.
    assert torch.equal(c.image[:3], a.image[1:])
    assert not torch.equal(c.image[3], a.image[0])
    env = MazeEnv(num_envs=6)
    groups = env.reset(seed=[11, 11, 11, 12, 12, 12]).image.view(2, 3, 112, 112, 3)  # [B, G, H, W, 3]
    assert torch.equal(groups[:, 0], groups[:, 1]) and torch.equal(groups[:, 0], groups[:, 2])
    assert not torch.equal(groups[0, 0], groups[1, 0])
    assert env.expert_action()[:3] == [env.expert_action()[0]] * 3


def test_noisy_expert_is_seeded_and_corrupts_at_the_noise_rate():
    env = MazeEnv(num_envs=200, size=4, min_path=4)
    env.reset(seed=0)
    clean = env.expert_action()
    with pytest.raises(ValueError, match="torch.Generator"):
        env.expert_action(noise=0.5)
    noisy = env.expert_action(noise=0.5, generator=torch.Generator().manual_seed(1))
    assert noisy == env.expert_action(noise=0.5, generator=torch.Generator().manual_seed(1))
    changed = [n != c for n, c in zip(noisy, clean)]
    assert 0.35 < np.mean(changed) < 0.65, np.mean(changed)
    for n, c in zip(noisy, clean):  # one move dropped or changed, never more
        n_moves, c_moves = parse_moves(n)[0], parse_moves(c)[0]
        if len(n_moves) == len(c_moves):
            assert sum(a != b for a, b in zip(n_moves, c_moves)) <= 1
        else:
            assert len(n_moves) == len(c_moves) - 1
    result = env.step(env.expert_action(noise=1.0, generator=torch.Generator().manual_seed(2)))
    assert result.info["success"].float().mean() < 0.1  # a corrupted path almost never arrives
    assert (result.info["reward_components"]["format"] == 1).all()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"size": 1}, "size"),
        ({"size": 3.5}, "size"),
        ({"size": 4, "min_path": 0}, "min_path"),
        ({"size": 4, "min_path": 13}, "min_path"),  # max_min_path(4) == 12
        ({"size": 3, "min_path": 8}, "min_path"),
        ({"min_path": True}, "min_path"),
        ({"size": 8, "image_size": 40}, "image_size"),
        ({"num_envs": 0}, "num_envs"),
    ],
)
def test_bad_options_raise_naming_the_option(options, named):
    options = {"num_envs": 2, **options}
    with pytest.raises(ValueError, match=rf"^{named} must"):
        MazeEnv(**options)


def test_make_builds_with_options_and_rejects_typos():
    env = make("maze", num_envs=2, image_size=64, size=3, min_path=7, answer_hint=False)
    obs = env.reset(seed=0)
    assert obs.image.shape == (2, 64, 64, 3)
    assert "<answer>" not in obs.instruction[0] and "green" in obs.instruction[0]
    assert all(m.path_length >= 7 for m in env.mazes)
    assert "<answer>R R D L</answer>" in make("maze", num_envs=1).reset(seed=0).instruction[0]
    with pytest.raises(ValueError, match="unknown option 'min_paths' for env 'maze'"):
        make("maze", num_envs=2, min_paths=3)
    with pytest.raises(AttributeError):
        env.target_boxes  # noqa: B018


def test_expert_before_reset_names_the_world():
    env = MazeEnv(num_envs=2)
    with pytest.raises(RuntimeError, match=r"worlds \[0, 1\] were never reset"):
        env.expert_action()
