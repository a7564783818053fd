"""The jigsaw task: solvable puzzles whose solution the pixels confirm, the dense reward, and total answer parsing."""

import pytest
import torch

import sim
import sim.tasks.jigsaw  # noqa: F401  (registers "jigsaw" until sim.tasks imports it)
from sim.tasks.jigsaw import JigsawEnv, parse_order


def _tiles(image: torch.Tensor, grid: int) -> torch.Tensor:
    """`[n, t, t, 3]` tiles of an `[H, W, 3]` image, in reading order."""
    side = image.shape[0] // grid
    return image.reshape(grid, side, grid, side, 3).transpose(1, 2).reshape(grid * grid, side, side, 3)


def _answer(order: list[int]) -> str:
    return f"<answer>[{', '.join(map(str, order))}]</answer>"


@pytest.mark.parametrize("grid", [2, 3, 4])
def test_contract_with_garbage_and_with_the_experts_answers(grid):
    env = sim.make("jigsaw", num_envs=4, image_size=96, grid=grid)
    sim.check_vec_env(env, seed=0)  # garbage answers
    env.reset(seed=0)
    sim.check_vec_env(env, seed=0, actions=env.expert_action())  # check_vec_env steps after reset(seed=0)
    sim.check_vec_env(sim.make("jigsaw", num_envs=1, grid=grid, image_size=96), seed=7)


@pytest.mark.parametrize("grid", [2, 3, 4])
def test_expert_solves_every_puzzle(grid):
    env = sim.make("jigsaw", num_envs=16, image_size=96, grid=grid)
    env.reset(seed=3)
    result = env.step(env.expert_action())
    torch.testing.assert_close(result.reward, torch.full((16,), 1.1))
    torch.testing.assert_close(result.info["reward_components"]["placed"], torch.ones(16))
    torch.testing.assert_close(result.info["reward_components"]["format"], torch.ones(16))
    assert result.info["success"].all()
    assert result.info["reasons"] == [""] * 16
    assert result.info["task"] == [f"grid{grid}"] * 16
    assert result.terminated.all() and not result.truncated.any()


@pytest.mark.parametrize("grid", [2, 3, 4])
def test_the_solution_restores_the_picture_pixel_for_pixel(grid):
    # Read from the shown pixels, independently of how the env shuffles: putting shown tile answer[p] at position p
    # must give back the source picture everywhere but the grid lines (one pixel ring of each tile).
    env = JigsawEnv(num_envs=24, image_size=96, grid=grid)
    obs = env.reset(seed=10)
    n = grid * grid
    for i, puzzle in enumerate(env.puzzles):
        order, reason = parse_order(env.expert_action()[i], n)
        assert reason == "" and order == env.target_orders[i].tolist()
        shown = _tiles(obs.image[i], grid)  # [n, t, t, 3]
        source = _tiles(torch.from_numpy(puzzle.picture), grid)  # [n, t, t, 3]
        restored = shown[torch.tensor(order) - 1]
        assert torch.equal(restored[:, 1:-1, 1:-1], source[:, 1:-1, 1:-1]), f"world {i}"
        assert order != list(range(1, n + 1)), f"world {i} is not shuffled"
        assert not torch.equal(shown[:, 1:-1, 1:-1], source[:, 1:-1, 1:-1])
    side = 96 // grid
    assert (obs.image[:, :, side - 1 : side + 1] == 255).all(), "no grid line at the first inner border"


def test_no_puzzle_comes_unshuffled_and_tiles_are_told_apart():
    env = JigsawEnv(num_envs=240, image_size=48, grid=2)  # unguarded, 1 in 24 worlds would be the identity
    env.reset(seed=0)
    identity = torch.arange(1, 5)
    assert not (env.target_orders == identity).all(-1).any()
    for i, puzzle in enumerate(env.puzzles):
        tiles = _tiles(torch.from_numpy(puzzle.picture), 2).float()  # [4, t, t, 3]
        diffs = (tiles[:, None] - tiles[None]).abs().mean((2, 3, 4))  # [4, 4] mean absolute pixel difference
        off_diagonal = diffs[~torch.eye(4, dtype=torch.bool)]
        assert off_diagonal.min() > 3, f"world {i}: two tiles differ by {off_diagonal.min():.1f} levels only"


def test_hand_computed_partial_scores():
    # Find a world whose solution is [3, 1, 4, 2], then score answers against it by hand.
    finder = JigsawEnv(num_envs=256, image_size=48, grid=2)
    finder.reset(seed=0)
    row = (finder.target_orders == torch.tensor([3, 1, 4, 2])).all(-1).nonzero().flatten()[0].item()
    env = JigsawEnv(num_envs=5, image_size=48, grid=2)
    env.reset(seed=[row] * 5)  # world k of reset(seed=0) has seed k
    answers = ["[3, 1, 4, 2]", "[3, 1, 2, 4]", "[3, 2, 1, 4]", "[1, 2, 3, 4]", "<answer>[3, 4, 1, 2]</answer>"]
    result = env.step(answers)
    placed = torch.tensor([4, 2, 1, 0, 2]) / 4
    torch.testing.assert_close(result.info["reward_components"]["placed"], placed)
    torch.testing.assert_close(result.info["reward_components"]["format"], torch.ones(5))
    torch.testing.assert_close(result.reward, placed + 0.1)
    assert result.info["success"].tolist() == [True, False, False, False, False]
    assert result.info["reasons"] == ["", "2 of 4 tiles in place", "1 of 4 tiles in place", "0 of 4 tiles in place",
                                      "2 of 4 tiles in place"]  # fmt: skip


def test_swaps_and_cycles_on_a_3x3_score_what_they_leave_in_place():
    env = JigsawEnv(num_envs=6, image_size=96, grid=3, format_weight=0.0)
    env.reset(seed=20)
    answers = []
    for order in env.target_orders.tolist():
        swapped, cycled = list(order), list(order)
        swapped[0], swapped[8] = swapped[8], swapped[0]  # 2 tiles out of place
        cycled[2], cycled[4], cycled[6] = cycled[4], cycled[6], cycled[2]  # 3 tiles out of place
        answers += [_answer(swapped), _answer(cycled)]
    env = JigsawEnv(num_envs=12, image_size=96, grid=3, format_weight=0.0)
    env.reset(seed=[20 + k // 2 for k in range(12)])  # each world twice, as the answers are laid out
    result = env.step(answers)
    torch.testing.assert_close(result.reward, torch.tensor([7 / 9, 6 / 9] * 6))
    assert not result.info["success"].any()


def test_malformed_answers_score_zero_with_a_reason_and_never_raise():
    texts = [
        "",
        "[1,1,2,3]",
        "<answer>[1, 2, 3]</answer>",
        "I would put the sky at the top.",
        "<answer>[1, 2, 3, 4, 5]</answer>",
        "[a, b, c, d]",
        "[" * 5000,
        "<answer>[0, 1, 2, 3]</answer>",
        "[" + "9" * 5000 + ", 1, 2, 3]",
    ]
    env = JigsawEnv(num_envs=len(texts), image_size=48, grid=2)
    env.reset(seed=0)
    result = env.step(texts)
    reasons = result.info["reasons"]
    torch.testing.assert_close(result.reward, torch.zeros(len(texts)))
    torch.testing.assert_close(result.info["reward_components"]["format"], torch.zeros(len(texts)))
    assert not result.info["success"].any()
    assert all(reasons), reasons
    assert reasons[0].startswith("no [..] list of tile numbers")
    assert reasons[1] == "not a permutation of 1..4: [1, 1, 2, 3]"
    assert reasons[2] == "expected 4 tile numbers, got 3"
    assert reasons[3].startswith("no [..] list of tile numbers")
    assert reasons[4] == "expected 4 tile numbers, got 5"
    assert reasons[5].startswith("not a list of whole numbers")
    assert reasons[7] == "not a permutation of 1..4: [0, 1, 2, 3]"
    assert reasons[8].startswith("not a list of whole numbers")
    assert len(reasons[8]) < 100, "a reason must not echo a huge answer"


def test_answer_variants_that_parse():
    assert parse_order("<answer>[3, 1, 4, 2]</answer>", 4) == ([3, 1, 4, 2], "")
    assert parse_order("<answer>3, 1, 4, 2</answer>", 4) == ([3, 1, 4, 2], "")
    assert parse_order("[3 1 4 2]", 4) == ([3, 1, 4, 2], "")
    assert parse_order("[3, 1, 4, 2,]", 4) == ([3, 1, 4, 2], "")
    assert parse_order("First [1, 2] then... final: [2, 1, 4, 3]", 4) == ([2, 1, 4, 3], "")
    assert parse_order("<think>[1, 2, 3, 4]</think><answer>[4, 3, 2, 1]</answer>", 4) == ([4, 3, 2, 1], "")
    assert parse_order("<answer>[1, 2, 3, 4]</answer> or maybe [4, 3, 2, 1]", 4) == ([1, 2, 3, 4], "")
    assert parse_order(_answer(list(range(16, 0, -1))), 16) == (list(range(16, 0, -1)), "")
    assert parse_order("[3, 1, 4, 2]", 9) == (None, "expected 9 tile numbers, got 4")


def test_same_seed_same_puzzle_and_the_picture_does_not_depend_on_grid():
    a = JigsawEnv(num_envs=4, image_size=96, grid=3)
    b = JigsawEnv(num_envs=4, image_size=96, grid=3)
    obs_a, obs_b = a.reset(seed=5), b.reset(seed=5)
    assert torch.equal(obs_a.image, obs_b.image) and torch.equal(a.target_orders, b.target_orders)
    coarse = JigsawEnv(num_envs=4, image_size=96, grid=2)
    coarse.reset(seed=5)
    for fine_puzzle, coarse_puzzle in zip(a.puzzles, coarse.puzzles):
        assert (fine_puzzle.picture == coarse_puzzle.picture).all()
        assert len(fine_puzzle.solution) == 9 and len(coarse_puzzle.solution) == 4
    assert not torch.equal(a.reset(seed=6).image[3], obs_a.image[0])  # seed 6 + 3 is not seed 5 + 0


@pytest.mark.parametrize("grid", [2, 3, 4])
def test_grid_sizes_show_in_the_image_and_the_instruction(grid):
    env = sim.make("jigsaw", num_envs=2, image_size=48, grid=grid)
    obs = env.reset(seed=0)
    assert obs.image.shape == (2, 48, 48, 3) and obs.image.dtype == torch.uint8
    assert env.target_orders.shape == (2, grid * grid)
    assert f"{grid}x{grid}" in obs.instruction[0] and f"1 to {grid * grid}" in obs.instruction[0]
    assert "<answer>" in obs.instruction[0]
    bare = sim.make("jigsaw", num_envs=2, image_size=48, grid=grid, answer_hint=False).reset(seed=0)
    assert f"{grid}x{grid}" in bare.instruction[0] and "<answer>" not in bare.instruction[0]
    assert torch.equal(bare.image, obs.image)


def test_expert_noise_swaps_two_tiles_and_needs_a_generator():
    env = JigsawEnv(num_envs=8, image_size=96, grid=3)
    with pytest.raises(RuntimeError, match="never reset"):
        env.expert_action()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="torch.Generator"):
        env.expert_action(noise=0.5)
    with pytest.raises(ValueError, match="noise"):
        env.expert_action(noise=1.5, generator=torch.Generator().manual_seed(0))
    sloppy = env.expert_action(noise=1.0, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(env.step(sloppy).info["reward_components"]["placed"], torch.full((8,), 7 / 9))
    env.reset(seed=0)
    half = env.expert_action(noise=0.5, generator=torch.Generator().manual_seed(1))
    assert half == env.expert_action(noise=0.5, generator=torch.Generator().manual_seed(1))
    assert 0 < sum(a != b for a, b in zip(half, env.expert_action())) < 8


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"grid": 5}, "grid"),
        ({"grid": 1}, "grid"),
        ({"grid": True}, "grid"),
        ({"grid": 3, "image_size": 112}, "image_size"),
        ({"grid": 4, "image_size": 16}, "image_size"),
        ({"answer_hint": "yes"}, "answer_hint"),
        ({"format_weight": -0.1}, "format_weight"),
        ({"gird": 3}, "unknown option 'gird'"),
    ],
)
def test_bad_options_raise_naming_the_option(options, named):
    with pytest.raises(ValueError, match=named):
        sim.make("jigsaw", num_envs=2, **options)


def test_no_boxes_and_target_orders_is_a_copy():
    env = JigsawEnv(num_envs=2, image_size=48)
    env.reset(seed=0)
    assert env.reward_targets() == {}
    with pytest.raises(AttributeError, match="no target boxes"):
        _ = env.target_boxes
    orders = env.target_orders
    orders.fill_(0)
    assert (env.target_orders > 0).all()


def test_an_unclosed_answer_tag_still_reads_the_list():
    # answer_region falls back to the whole text when no tag pair closes; the list in it is the answer.
    env = JigsawEnv(num_envs=1, image_size=48)
    env.reset(seed=0)
    order = env.target_orders[0].tolist()
    result = env.step([f"<answer>[{', '.join(map(str, order))}]"])
    assert result.info["success"].all()
