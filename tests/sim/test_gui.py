"""The GUI envs: screens whose labels and boxes can be trusted, hand-checked rewards, and state machines that work."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

import sim
import sim.gui  # registers gui_click and gui_task (sim/__init__.py may not import it)
from sim import check_vec_env
from sim.gui.envs import TASKS, GUIClickEnv, GUITaskEnv
from sim.gui.layouts import random_screen
from sim.gui.paint import draw
from sim.gui.screen import LAYOUTS, THEMES, Screen

SIZE = 96  # the smallest legal screen: the tightest layouts, and the cheapest to draw


def _screens(size: int, seeds: range) -> list[Screen]:
    themes = list(THEMES.values())
    return [
        random_screen(np.random.default_rng(seed), size, layout, themes[seed % len(themes)])
        for layout in LAYOUTS
        for seed in seeds
    ]


def _boxes_touch(a, b) -> bool:
    return a[0] <= b[2] and b[0] <= a[2] and a[1] <= b[3] and b[1] <= a[3]


def _run_expert(env, seed: int):
    """Run the noiseless expert until every world ended; return the last result and the summed rewards `[N]`."""
    env.reset(seed=seed)
    total = torch.zeros(env.num_envs)
    for _ in range(env.max_episode_steps):
        result = env.step(env.expert_action())
        total += result.reward
        if (result.terminated | result.truncated).all():
            break
    return result, total


def _task_world(task: str, accept=lambda app: True, size: int = SIZE) -> tuple[GUITaskEnv, int]:
    """A one-world env of `task` reset to the first seed whose app satisfies `accept` (deterministic)."""
    env = GUITaskEnv(num_envs=1, image_size=size, tasks=[task])
    for seed in range(100):
        env.reset(seed=[seed])
        if accept(env.apps[0]):
            return env, seed
    raise AssertionError(f"no {task} world among 100 seeds satisfies the condition")


# --------------------------------------------------------------------------------------------------------------------
# Contract and options
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gui_click", "gui_task"])
def test_contract_with_garbage_and_with_expert_actions(name):
    assert name in sim.ENVS
    env = sim.make(name, num_envs=4, image_size=SIZE)
    check_vec_env(env, seed=0)  # the default garbage strings
    env.reset(seed=0)
    check_vec_env(env, seed=0, actions=env.expert_action())  # valid actions for the worlds of seed 0


def test_options_are_checked_and_named():
    for kwargs, name in [
        ({"image_size": 64}, "image_size"),
        ({"layouts": ["form", "web"]}, "layouts"),
        ({"layouts": []}, "layouts"),
        ({"themes": ["neon"]}, "themes"),
        ({"answer": "polygon"}, "answer"),
        ({"hit_weight": -1.0}, "hit_weight"),
        ({"format_weight": math.nan}, "format_weight"),
        ({"max_area_ratio": 0.5}, "max_area_ratio"),
    ]:
        with pytest.raises(ValueError, match=name):
            GUIClickEnv(num_envs=1, **kwargs)
    for kwargs, name in [
        ({"tasks": ["form", "checkout"]}, "tasks"),
        ({"tasks": ["form", "form"]}, "tasks"),
        ({"max_episode_steps": 0}, "max_episode_steps"),
        ({"success_weight": math.inf}, "success_weight"),
        ({"image_size": 95}, "image_size"),
    ]:
        with pytest.raises(ValueError, match=name):
            GUITaskEnv(num_envs=1, **kwargs)
    # A single name is accepted as a one-element subset.
    assert GUIClickEnv(num_envs=1, layouts="dialog").layouts == ("dialog",)


def test_stepping_without_a_reset_raises():
    with pytest.raises(RuntimeError, match="reset"):
        GUITaskEnv(num_envs=2).step(["finish()", "finish()"])
    env = GUIClickEnv(num_envs=1, image_size=SIZE)
    env.reset(seed=0)
    env.step(["click(1, 1)"])
    with pytest.raises(RuntimeError, match="reset"):
        env.step(["click(1, 1)"])  # single-step: a second step needs a reset first


# --------------------------------------------------------------------------------------------------------------------
# Screens
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [96, 160])
def test_labels_are_unique_and_boxes_lie_apart_inside_the_image(size):
    for screen in _screens(size, range(12)):
        labels = [e.label.casefold() for e in screen.elements]
        assert len(labels) == len(set(labels)), f"{screen.layout}: repeated labels {labels}"
        assert len(screen.elements) >= 2, f"{screen.layout}: only {len(screen.elements)} elements"
        for k, e in enumerate(screen.elements):
            x1, y1, x2, y2 = e.box
            assert 0 <= x1 < x2 <= size and 0 <= y1 < y2 <= size, f"{e} leaves the {size} px screen"
            # Edges included: a click point never lies in two boxes.
            others = [o for o in screen.elements[k + 1 :] if _boxes_touch(e.box, o.box)]
            assert not others, f"{screen.layout}: {e} touches {others}"
            assert screen.element_at(*e.centre) is e


def test_each_element_is_drawn_inside_its_own_box():
    # Drawing the screen without one element changes pixels inside its box and nowhere else.
    for screen in _screens(SIZE, range(3)):
        full = draw(screen)
        assert full.shape == (SIZE, SIZE, 3) and full.dtype == np.uint8
        for e in screen.elements:
            rest = replace(
                screen,
                items=tuple(i for i in screen.items if i is not e),
                elements=tuple(o for o in screen.elements if o is not e),
            )
            changed = (draw(rest) != full).any(-1)  # [H, W]
            x1, y1, x2, y2 = e.box
            assert changed[y1:y2, x1:x2].any(), f"{screen.layout}: {e} leaves no pixel in its box"
            changed[y1:y2, x1:x2] = False
            assert not changed.any(), f"{screen.layout}: {e} draws outside its box"


def test_screens_are_deterministic_and_themes_differ():
    a = draw(random_screen(np.random.default_rng(5), SIZE, "form", THEMES["light"]))
    b = draw(random_screen(np.random.default_rng(5), SIZE, "form", THEMES["light"]))
    c = draw(random_screen(np.random.default_rng(5), SIZE, "form", THEMES["dark"]))
    assert np.array_equal(a, b)
    assert a.mean() > c.mean() + 60  # a light page against a dark one
    big = draw(random_screen(np.random.default_rng(5), SIZE, "form", THEMES["light"]), size=2 * SIZE)
    assert big.shape == (2 * SIZE, 2 * SIZE, 3)


# --------------------------------------------------------------------------------------------------------------------
# gui_click
# --------------------------------------------------------------------------------------------------------------------


def test_instruction_names_the_target_and_kinds_vary():
    env = GUIClickEnv(num_envs=24, image_size=SIZE)
    obs = env.reset(seed=0)
    for i, (screen, target) in enumerate(zip(env.screens, env.targets)):
        assert target in screen.elements
        assert obs.instruction[i] == target.instruction
        assert sum(e.label == target.label for e in screen.elements) == 1
        assert env.target_boxes[i].tolist() == [float(v) for v in target.box]
    assert len({t.kind for t in env.targets}) >= 6  # kinds are drawn first, so lists do not dominate
    assert {s.layout for s in env.screens} == set(LAYOUTS)


def test_click_rewards_by_hand():
    env = GUIClickEnv(num_envs=5, image_size=SIZE, hit_weight=2.0, format_weight=0.5)
    env.reset(seed=3)
    (x, y) = env.targets[0].centre
    x1, y1, x2, y2 = env.targets[1].box
    outside = (x2 + 1, y1) if x2 + 1 < SIZE else (x1 - 1, y1)  # one pixel right of (or left of) the target
    answers = [
        f"click({x}, {y})",  # a hit in the action grammar: hit + format
        f"click({outside[0]}, {outside[1]})",  # a well-formed miss: format only
        f"({env.targets[2].centre[0]}, {env.targets[2].centre[1]})",  # a bare point: the hit, no format term
        "no idea",
        'type("Save")',
    ]
    result = env.step(answers)
    torch.testing.assert_close(result.reward, torch.tensor([2.5, 0.5, 2.0, 0.0, 0.0]))
    torch.testing.assert_close(result.info["reward_components"]["hit"], torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0]))
    assert result.info["success"].tolist() == [True, False, True, False, False]
    assert result.info["reasons"][:3] == ["", "", ""]
    assert result.info["reasons"][3] == "no action found"
    assert "type action, not a click" in result.info["reasons"][4]
    assert torch.isnan(result.info["pred_point"][3]).all()
    assert result.terminated.all() and not result.truncated.any()


def test_ui_r1_json_clicks_count():
    env = GUIClickEnv(num_envs=1, image_size=SIZE)
    env.reset(seed=4)
    x, y = env.targets[0].centre
    result = env.step([f'<answer>[{{"action": "click", "coordinate": [{x}, {y}]}}]</answer>'])
    torch.testing.assert_close(result.reward, torch.tensor([1.1]))


def test_box_answers_pay_for_tight_boxes_only():
    env = GUIClickEnv(num_envs=3, image_size=SIZE, answer="box", size_weight=0.2, max_area_ratio=4.0)
    env.reset(seed=7)
    exact = env.expert_action()[0]
    x1, y1, x2, y2 = env.targets[1].box
    w, h = x2 - x1, y2 - y1
    # Same centre, 4x the width and height: 16x the area, so the hit is scaled by 4 / 16 and the size term is 1/16.
    big = f"[{x1 - 1.5 * w}, {y1 - 1.5 * h}, {x2 + 1.5 * w}, {y2 + 1.5 * h}]"
    result = env.step([exact, big, "click(3, 4)"])
    expected = torch.tensor([1.0 + 0.1 + 0.2, 0.25 + 0.1 + 0.2 / 16, 0.0])
    torch.testing.assert_close(result.reward, expected)
    assert result.info["success"].tolist() == [True, True, False]  # success is the centre's hit
    assert result.info["reasons"][2] != ""


def test_expert_clicks_always_hit_and_noise_needs_a_generator():
    for answer in ("point", "box"):
        env = GUIClickEnv(num_envs=50, image_size=SIZE, answer=answer)
        env.reset(seed=11)
        assert env.step(env.expert_action()).info["success"].all()
    env = GUIClickEnv(num_envs=50, image_size=SIZE)
    env.reset(seed=11)
    with pytest.raises(ValueError, match="Generator"):
        env.expert_action(noise=0.3)
    noisy = env.expert_action(noise=0.3, generator=torch.Generator().manual_seed(0))
    assert noisy == env.expert_action(noise=0.3, generator=torch.Generator().manual_seed(0))
    assert noisy != env.expert_action()
    rate = env.step(noisy).info["success"].float().mean().item()
    assert 0.5 < rate < 1.0  # a sloppy demonstrator: mostly hits, sometimes misses


# --------------------------------------------------------------------------------------------------------------------
# gui_task
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
def test_expert_solves_every_episode(task):
    env = GUITaskEnv(num_envs=50, image_size=SIZE, tasks=[task])
    result, total = _run_expert(env, seed=100)
    assert result.info["success"].all() and result.terminated.all() and not result.truncated.any()
    # Every expert step pays type + match (0.1 + 0.2), and the last one the success bonus too.
    steps = torch.tensor([float(s) for s in env._steps])
    torch.testing.assert_close(total, 0.3 * steps + 1.0)
    assert steps.max() <= 4 and steps.min() >= (1 if task == "scroll" else 2)


def test_form_typing_shows_in_the_state_and_in_the_picture():
    env, _ = _task_world("form", lambda app: app.check is not None)
    app = env.apps[0]
    field = app.spec.fields[app.field]
    before = env._images[0].clone()
    assert env.step(["type('zebra')"]).obs.image[0].equal(before)  # no field has focus: nothing happens
    box = app.screen.find("field", field).box
    first = env.step([f"click{app.screen.find('field', field).centre}"])
    assert app.focused == app.field and app.screen.find("field", field).focused
    typed = env.step(['type("zebra")'])
    assert app.texts[app.field] == "zebra" and app.screen.find("field", field).text == "zebra"
    changed = (typed.obs.image[0] != first.obs.image[0]).any(-1)  # [H, W]
    x1, y1, x2, y2 = box
    assert changed[y1:y2, x1:x2].sum() > 10 and not changed[:y1].any() and not changed[y2:].any()
    assert typed.info["reasons"] == [f'expected type("{app.word}")']  # the wrong word
    torch.testing.assert_close(typed.reward, torch.tensor([0.1]))  # the right kind of action, the wrong text
    torch.testing.assert_close(
        env.step([f'type("{app.word.upper()}")']).reward, torch.tensor([0.3])
    )  # compared after normalize_answer
    # Ticking pays, unticking is wrong, ticking again matches but was already paid for.
    tick = f"click{app.screen.find('checkbox', app.spec.checkboxes[app.check]).centre}"
    rewards = [env.step([tick]).reward.item() for _ in range(3)]
    assert rewards == pytest.approx([0.3, 0.1, 0.1])
    assert app.checked[app.check]
    last = env.step([env.expert_action()[0]])  # the submit button
    assert last.terminated.item() and last.info["success"].item()
    torch.testing.assert_close(last.reward, torch.tensor([1.3]))


def test_wrong_menu_item_ends_the_episode_and_the_world_stays_frozen():
    env, _ = _task_world("menu")
    app = env.apps[0]
    opened = env.step(env.expert_action())
    assert app.open == app.menu and opened.reward.item() == pytest.approx(0.3)
    items = [e for e in app.screen.elements if e.kind == "menu_item"]
    assert [e.label for e in items] == list(app.spec.menu_items[app.menu])
    wrong = next(e for e in items if e.label != app.goal)
    result = env.step([f"click{wrong.centre}"])
    assert result.terminated.item() and not result.info["success"].item()
    assert result.reward.item() == pytest.approx(0.1)  # a click was expected, just not this one
    frozen = env.step(["finish()"])
    assert frozen.reward.item() == 0.0 and frozen.terminated.item() and frozen.obs.image.equal(result.obs.image)
    assert env.expert_action() == ["finish()"]


def test_navigation_back_home_and_finish():
    env, _ = _task_world("navigate", lambda app: len(app.page) == 2 and len(app.goal) == 2)
    app = env.apps[0]
    start = app.page
    assert app.screen.elements == ()  # a sub-page has nothing to click
    image = env._images[0].clone()
    assert env.step(["click(50, 50)"]).obs.image[0].equal(image) and app.page == start
    assert env.expert_action() == ["press(back)"]
    env.step(["press(back)"])
    assert app.page == (start[0],) and app.screen.layout == "settings"
    env.step(["press(home)"])
    assert app.page == (0,)
    early = env.step(["finish()"])  # the wrong page: the episode ends without success
    assert early.terminated.item() and not early.info["success"].item() and early.reward.item() == 0.0


def test_scrolling_moves_the_list():
    env, _ = _task_world(
        "scroll", lambda app: app.offset == 0 and app.target >= app.shown and len(app.spec.items) >= 2 * app.shown
    )
    app = env.apps[0]
    first = [e.label for e in app.screen.elements if e.kind == "item"]
    assert app.goal not in first
    image = env._images[0].clone()
    sideways = env.step(["scroll(left)"])
    assert sideways.obs.image[0].equal(image) and sideways.info["reasons"] == ["expected scroll(down)"]
    env.step(["scroll(down)"])
    shown = [e.label for e in app.screen.elements if e.kind == "item"]
    assert shown[0] == first[-1] and shown != first  # one row of context is kept
    while env.expert_action()[0].startswith("scroll"):
        env.step(env.expert_action())
    assert env.step(env.expert_action()).info["success"].item()


def test_garbage_costs_a_step_and_truncates():
    env = GUITaskEnv(num_envs=2, image_size=SIZE, max_episode_steps=2)
    obs = env.reset(seed=0)
    first = env.step(["", "}{"])
    assert first.reward.tolist() == [0.0, 0.0] and all(first.info["reasons"])
    assert first.obs.image.equal(obs.image) and not (first.terminated | first.truncated).any()
    second = env.step(["I would click it", "[1, 2"])
    assert second.truncated.all() and not second.terminated.any() and not second.info["success"].any()


def test_partial_reset_leaves_a_running_episode_alone():
    env = GUITaskEnv(num_envs=2, image_size=SIZE, tasks=["form"])  # forms take 3 steps or more
    env.reset(seed=[3, 4])
    env.step(env.expert_action())
    image, app = env._images[0].clone(), env.apps[0]
    obs = env.reset(seed=[99], env_ids=[1])
    assert obs.image[0].equal(image) and env.apps[0] is app
    twin = GUITaskEnv(num_envs=1, image_size=SIZE, tasks=["form"])
    assert obs.instruction[1] == twin.reset(seed=[99]).instruction[0]
    assert obs.image[1].equal(twin._images[0])
    result = env.step(env.expert_action())
    while not env._ended[0]:  # world 0 still runs to success
        result = env.step(env.expert_action())
    assert result.info["success"][0]
