"""GUI agent envs on procedurally drawn screens: single-step grounding (`gui_click`) and multi-step tasks (`gui_task`).

Screens: `sim.gui.screen` (the model), `sim.gui.layouts`, `sim.gui.paint`; the tasks' apps: `sim.gui.apps`.

Both envs take text actions in the action grammar of `rewards.actions` (`click(57, 83)`, `type("alice")`,
`scroll(down)`, `press(back)`, `finish()`, UI-R1's JSON `[{"action": "click", "coordinate": [57, 83]}]`, ...) with
coordinates in the model family's units (`coordinates`, chosen from the model by the config: pixels of the image as
the model saw it, `input_size` on a side, or 0-1000 / 0-1 relative, which the instructions then name; see
`rewards.coordinates`), and carry a scripted expert (`expert_action`) whose answers are short strings in that grammar
and those units, for supervised cold starts and as the reference the step rewards compare with.

`gui_click`
-----------
**Task.** Each world is one screen and an instruction naming one of its elements: `"Click the Save button."`,
`"Click Berlin in the list."`, `"Click the gear icon."`. Episodes last one step. With `answer="point"` (default)
the policy answers a click (`click(x, y)`, or any click form `parse_action` reads; a bare `(x, y)` is read too but
earns no format term). With `answer="box"` it answers the element's box `[x1, y1, x2, y2]`.

**Randomizations** (per world, from that world's seed only): layout (of `layouts`), theme (of `themes`), the
screen's content and state (see `random_screen`: labels, counts, alignment, typed text, ticks, focus, an open menu,
the list's scroll position, the selected tab), and the target: a kind drawn uniformly among the kinds on the
screen, then one element of that kind. Labels are unique per screen, so the instruction names exactly one element.

**Reward.** `answer="point"`: `hit_weight * [click point in the target box] + format_weight * [a click action]`.
`answer="box"`: `hit_weight * [box centre in the target box] * box_size_factor + format_weight * [a box parsed]
+ size_weight * box_size_similarity`, where `box_size_factor` (1 up to `max_area_ratio` times the target's area,
then `max_area_ratio / ratio`) takes the hit away from huge boxes and `box_size_similarity` pulls the box's size
to the target's (GUI-G1, https://arxiv.org/abs/2505.15810). The target box has x2/y2 exclusive and the hit test
includes edges, so the test is one pixel lenient on the right and bottom. **Success**: the point (box centre) hits.

`gui_task`
----------
**Task.** Multi-step tasks on small apps whose screen is redrawn after every action. The episode ends on
`finish`, on an action that completes the task (or irrevocably fails it), or after `max_episode_steps` steps
(truncated).

* `form`: "Type fox in City, tick Subscribe, then click Submit." (the tick part in 70% of episodes). The expert
  clicks the field, types, clicks the checkbox, clicks the submit button. Clicking a field focuses it; `type(text)`
  replaces the focused field's text (Android's `input text` into a cleared field) and does nothing when no field
  has focus; clicking anything else blurs the field; a checkbox toggles; the reset button restores the form as it
  was at the start; the submit button ends the episode, a success iff the named field holds the text (compared
  after `normalize_answer`) and the named box is ticked. `press(enter)` does not submit.
* `menu`: "Choose Paste from the Edit menu." Clicking a menu header opens its menu (clicking it again, clicking
  anything but a menu header or item, `press(back)` or scrolling closes it; clicking another header switches
  menus; the list scrolls as in `scroll`). Clicking a menu item or a list item runs it and ends the episode, a
  success iff it is the named menu item.
* `navigate`: "Go to the Photos tab, then finish." or "Open Battery in the Sound tab, then finish." Pages are tabs
  (a tab bar, switches, links to sub-pages) and sub-pages (a title and text, no tab bar). Clicking a tab or a link
  opens its page; `press(back)` returns to the previous page, `press(home)` to the first tab; switches toggle and
  change nothing else. `finish()` ends the episode, a success iff the named page is open. Episodes start on a random
  page other than the goal, a sub-page in some of them (whose way out is `press(back)` or `press(home)`).
* `scroll`: "Open Lima in the list." The list is longer than the screen; `scroll(down)` shows the items further
  down (it moves by one screen less one row, closing any open menu) and `scroll(up)` those above. Clicking a list
  item opens it and ends the episode, a success iff it is the named item; menus behave as in `menu`.

In every task, an action that does not parse, and any action the description above does not mention (a click on
nothing in particular, `long_press`, `scroll(left)`, an unknown key), changes nothing and still costs a step.
`finish()` ends the episode in every task, and is a success only in `navigate` on the goal page.

**Randomizations** (per world, from that world's seed only): the task (of `tasks`), the theme (of `themes`), the
app's content (labels, counts, layout choices), the goal, and the start state (prefilled fields and ticks, the
list's scroll position, the start page).

**Reward** per step: `type_weight * action_type + match_weight * action_match + success_weight * success`, where
`action_type` and `action_match` are the rewards library's `action_type_reward` and `action_match_reward` of the
action against the expert's action for the state the world was in (a click matches when it lands in the box of the
element the expert clicks; typed text after `normalize_answer`), and `success` is 1 on the step that ends the
episode successfully. The match term is paid only when the step brings the world closer to the goal than it has
ever been in the episode (counted in expert steps), so undoing and redoing a step (ticking a box off and on) does
not pay twice. The type term, though, is paid on every step whose action has the expert's type, so under RL a
policy can farm it by making episodes long (seen with configs/gui_task_tiny.yaml at type_weight 0.1: training
reward 0.36 -> 0.84 while episodes grew from 3.7 to 7.5 steps and success fell); RL runs set `type_weight: 0`.
Unparsed actions score 0 with the parser's reason in `info["reasons"]`.

**Finished worlds** (`gui_task`). There is no autoreset. A world whose episode ended is frozen until it is reset:
`step` ignores its action, reward and every component are 0, and its final `terminated`, `truncated` and `success`
are repeated. (`gui_click` instead refuses a second step before a reset, as `grounding` does.)

**Expert** (`expert_action`). For each world's current state, the next action of a fixed plan that solves the task
from any state (shortest from the start; after a detour it may take a safe extra step, e.g. closing an open menu
before scrolling), as text:
`click(x, y)` at the element's centre, `type("fox")`, `scroll(down)`, `press(back)`, `finish()` (`[x1, y1, x2,
y2]`, the element's box, for `gui_click` with `answer="box"`). With `noise > 0`, every click coordinate (every box
coordinate) gets Gaussian noise of std `noise` times the element's width or height: a sloppy demonstrator. Without
noise it succeeds in every episode (the tests run 50 seeds per task).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import torch

from rewards import (
    action_match_reward,
    action_type_reward,
    box_size_factor,
    box_size_similarity,
    parse_actions,
    parse_boxes,
    parse_point,
    point_in_box,
)
from rewards.actions import Action
from rewards.coordinates import HINTS, check_coordinates, format_values, from_pixels, to_pixels
from sim.base import SingleStepImageEnv, StepResult, TextEpisodeEnv, noise_draws
from sim.gui.apps import TASKS, App, make_app
from sim.gui.layouts import (
    random_screen,
)
from sim.gui.paint import draw
from sim.gui.screen import (
    KINDS,
    LAYOUTS,
    MIN_SIZE,
    THEMES,
    Element,
    Screen,
)
from sim.registry import ENVS

THEME_NAMES = tuple(THEMES)


# --------------------------------------------------------------------------------------------------------------------
# Option checks and the expert's noise
# --------------------------------------------------------------------------------------------------------------------


def _check_size(image_size: int) -> int:
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)) or image_size < MIN_SIZE:
        raise ValueError(f"image_size must be an int >= {MIN_SIZE} (smaller screens cannot hold legible text), "
                         f"got {image_size!r}")  # fmt: skip
    return int(image_size)


def _check_choices(name: str, value: str | Sequence[str], valid: Sequence[str]) -> tuple[str, ...]:
    """A non-empty tuple of distinct entries of `valid` from a sequence (or one name)."""
    chosen = (value,) if isinstance(value, str) else tuple(value)
    if not chosen:
        raise ValueError(f"{name} must name at least one of: {', '.join(valid)}")
    bad = [v for v in chosen if v not in valid]
    if bad:
        raise ValueError(f"{name} has unknown entries {bad}; valid: {', '.join(valid)}")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"{name} has repeated entries: {list(chosen)}")
    return chosen


def _check_weight(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _check_num_envs(num_envs: int) -> int:
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    return num_envs


def _click(element: Element, z: np.ndarray, noise: float, size: int, coordinates: str = "pixels", input_size: int = 0
           ) -> str:  # fmt: skip
    """`click(x, y)` at the element's centre, moved by `noise * z * (width, height)` and kept in the image, written in
    `coordinates` units (`rewards.coordinates`)."""
    x, y = element.centre
    x1, y1, x2, y2 = element.box
    x = min(max(round(x + noise * z[0] * (x2 - x1)), 0), size - 1)
    y = min(max(round(y + noise * z[1] * (y2 - y1)), 0), size - 1)
    point = from_pixels(torch.tensor([x, y], dtype=torch.float64), coordinates, size, size, input_size)
    return f"click({format_values(point.tolist(), coordinates)})"


def action_in_pixels(action: Action, coordinates: str, size: int, input_size: int) -> Action:
    """A parsed click (or long press) with its point brought from `coordinates` units to pixels of the screen."""
    if action.kind not in ("click", "long_press"):
        return action
    point = torch.tensor([float(action.args["x"]), float(action.args["y"])], dtype=torch.float64)
    x, y = to_pixels(point, coordinates, size, size, input_size).tolist()
    return dataclasses.replace(action, args={**action.args, "x": x, "y": y})


def _draw_rows(screens: list[Screen]) -> torch.Tensor:
    """`[K, H, W, 3]` uint8 pictures of K screens."""
    return torch.from_numpy(np.stack([draw(s) for s in screens]))


# --------------------------------------------------------------------------------------------------------------------
# gui_click
# --------------------------------------------------------------------------------------------------------------------


@ENVS.register("gui_click")
class GUIClickEnv(SingleStepImageEnv):
    """N worlds of single-step GUI grounding: click the element the instruction names (see the module docstring).

    >>> env = GUIClickEnv(num_envs=2)
    >>> obs = env.reset(seed=0)
    >>> env.step(env.expert_action()).reward  # hit_weight + format_weight
    tensor([1.1000, 1.1000])

    Args:
        num_envs: N, the number of worlds.
        image_size: Side of the square screens in pixels, at least `MIN_SIZE` (96).
        layouts: The layouts worlds draw from (a subset of `LAYOUTS`).
        themes: The themes worlds draw from (a subset of `THEMES`).
        answer: `"point"`: the policy answers a click; `"box"`: the element's box.
        hit_weight: Weight of the hit term.
        format_weight: Weight of the format term (a click action; a parsed box).
        size_weight: Weight of the box-size similarity term (box answers only).
        max_area_ratio: Box answers keep the full hit up to this many times the target's area (>= 1).
        coordinates: The units of answers (and of the expert's): "pixels", "0-1000" or "0-1" (`rewards.coordinates`).
        input_size: With "pixels", the side of the screen as the model sees it after its processor's resize; 0:
            `image_size`.
        device: Where the returned tensors live. Screens are always drawn on the CPU.
    """

    def __init__(
        self,
        num_envs: int,
        image_size: int = 128,
        layouts: Sequence[str] = LAYOUTS,
        themes: Sequence[str] = THEME_NAMES,
        answer: str = "point",
        hit_weight: float = 1.0,
        format_weight: float = 0.1,
        size_weight: float = 0.1,
        max_area_ratio: float = 4.0,
        coordinates: str = "pixels",
        input_size: int = 0,
        device: str = "cpu",
    ):
        check_coordinates(coordinates, input_size)
        self.coordinates, self.input_size = coordinates, input_size
        super().__init__(_check_num_envs(num_envs), _check_size(image_size), device)
        self.layouts = _check_choices("layouts", layouts, LAYOUTS)
        self.themes = _check_choices("themes", themes, THEME_NAMES)
        if answer not in ("point", "box"):
            raise ValueError(f"answer must be 'point' or 'box', got {answer!r}")
        self.answer = answer
        self.hit_weight = _check_weight("hit_weight", hit_weight)
        self.format_weight = _check_weight("format_weight", format_weight)
        self.size_weight = _check_weight("size_weight", size_weight)
        if _check_weight("max_area_ratio", max_area_ratio) < 1:
            raise ValueError(f"max_area_ratio must be >= 1, got {max_area_ratio!r}")
        self.max_area_ratio = float(max_area_ratio)
        self.screens: list[Screen | None] = [None] * num_envs
        self.targets: list[Element | None] = [None] * num_envs

    def draw_worlds(self, ids: list[int], seeds: list[int]) -> tuple[torch.Tensor, list[str], torch.Tensor]:
        """Draw new screens and targets for the worlds `ids`, each from its own seed (the `SingleStepImageEnv` hook)."""
        for i, world_seed in zip(ids, seeds):
            rng = np.random.default_rng(world_seed)
            layout = self.layouts[int(rng.integers(len(self.layouts)))]
            theme = THEMES[self.themes[int(rng.integers(len(self.themes)))]]
            screen = random_screen(rng, self.image_size, layout, theme)
            # A kind first, then an element of it: lists would otherwise supply most targets.
            kinds = [k for k in KINDS if any(e.kind == k for e in screen.elements)]
            kind = kinds[int(rng.integers(len(kinds)))]
            candidates = [e for e in screen.elements if e.kind == kind]
            self.screens[i], self.targets[i] = screen, candidates[int(rng.integers(len(candidates)))]
        images = _draw_rows([self.screens[i] for i in ids])  # [K, H, W, 3]
        boxes = torch.tensor([self.targets[i].box for i in ids], dtype=torch.float32)  # [K, 4]
        return images, [self.targets[i].instruction + HINTS[self.coordinates] for i in ids], boxes

    def score(self, texts: list[str]) -> tuple[torch.Tensor, dict]:
        """Score one answer per world (the `SingleStepImageEnv` hook; `step` ends every episode after it).

        Args:
            texts: N answer strings: a click (`answer="point"`) or a box (`answer="box"`).

        Returns:
            Reward `[N]` and info: `reward_components` (`hit`, `format`, and `size` for box answers: `[N]`), `reasons`
            (N strings, "" where an answer parsed), `target_box` `[N, 4]`, `pred_point` `[N, 2]` (the click point or
            box centre, NaN rows where nothing parsed), `pred_box` `[N, 4]` (box answers; NaN rows otherwise) and
            `success` (`[N]` bool: a hit).
        """
        target = self._target_boxes.detach().to("cpu", torch.float32).clone()  # [N, 4], never the buffer itself
        nan2 = (math.nan, math.nan)
        if self.answer == "point":
            points, fmt, reasons = [], [], []
            for text, action in zip(texts, parse_actions(texts)):
                if action.kind == "click":
                    points.append((float(action.args["x"]), float(action.args["y"])))
                    fmt.append(1.0)
                    reasons.append("")
                    continue
                fmt.append(0.0)
                # A bare point still hits (without the format term); another action kind is a miss.
                point = parse_point(text).point if action.kind is None else None
                points.append(point if point is not None else nan2)
                if point is not None:
                    reasons.append("")
                elif action.kind is not None:
                    reasons.append(f"answer is a {action.kind} action, not a click")
                else:
                    reasons.append(action.reason)
            pred_point = torch.tensor(points, dtype=torch.float32).reshape(-1, 2)  # [N, 2] in the answers' units
            pred_point = self._pixels(pred_point)  # [N, 2] pixels
            pred_box = torch.full((self.num_envs, 4), math.nan)  # [N, 4]
            hit = point_in_box(pred_point, target)  # [N]
            components = {"hit": hit, "format": torch.tensor(fmt, dtype=torch.float32)}
            reward = self.hit_weight * hit + self.format_weight * components["format"]
            success = hit > 0
        else:
            pred_box, reasons = parse_boxes(texts)
            pred_box = self._pixels(pred_box.to(torch.float32))  # [N, 4] pixels, NaN rows where nothing parsed
            pred_point = (pred_box[:, :2] + pred_box[:, 2:]) / 2  # [N, 2]
            centre_hit = point_in_box(pred_point, target)  # [N]
            hit = centre_hit * box_size_factor(pred_box, target, self.max_area_ratio).to(torch.float32)  # [N]
            size = box_size_similarity(pred_box, target).to(torch.float32)  # [N]
            fmt = torch.isfinite(pred_box).all(-1).to(torch.float32)  # [N]
            components = {"hit": hit, "format": fmt, "size": size}
            reward = self.hit_weight * hit + self.format_weight * fmt + self.size_weight * size
            success = centre_hit > 0
        info = {
            "reward_components": components,
            "reasons": list(reasons),
            "task": [t.kind if t is not None else "" for t in self.targets],  # the kind of element to click
            "target_box": target,
            "pred_point": pred_point,
            "pred_box": pred_box,
            "success": success,
        }
        return reward, info

    def _pixels(self, values: torch.Tensor) -> torch.Tensor:
        """`[N, 2k]` points or boxes written in the env's `coordinates` as pixels of the screen."""
        return to_pixels(values, self.coordinates, self.image_size, self.image_size, self.input_size)

    def expert_action(self, noise: float = 0.0, generator: torch.Generator | None = None) -> list[str]:
        """The scripted answer for every world: the target's centre (`click(x, y)`) or its box (`[x1, y1, x2, y2]`),
        in the env's `coordinates`.

        Args:
            noise: Std of the Gaussian noise on every coordinate, in units of the target's width (x) or height (y).
            generator: Source of the noise; required when `noise > 0`.

        Returns:
            N answer strings.
        """
        z = noise_draws(self.num_envs, 4, noise, generator)  # [N, 4]
        answers = []
        for i, target in enumerate(self.targets):
            if target is None:
                answers.append("")
                continue
            if self.answer == "point":
                answers.append(_click(target, z[i], noise, self.image_size, self.coordinates, self.input_size))
                continue
            x1, y1, x2, y2 = target.box
            w, h = x2 - x1, y2 - y1
            xs = sorted(round(v + noise * d * w) for v, d in ((x1, z[i, 0]), (x2, z[i, 2])))
            ys = sorted(round(v + noise * d * h) for v, d in ((y1, z[i, 1]), (y2, z[i, 3])))
            xs = [min(max(v, 0), self.image_size) for v in xs]
            ys = [min(max(v, 0), self.image_size) for v in ys]
            size = self.image_size
            box = from_pixels(torch.tensor([xs[0], ys[0], xs[1], ys[1]], dtype=torch.float64), self.coordinates, size,
                              size, self.input_size)  # fmt: skip
            answers.append(f"[{format_values(box.tolist(), self.coordinates)}]")
        return answers


# --------------------------------------------------------------------------------------------------------------------
# gui_task: the env
# --------------------------------------------------------------------------------------------------------------------


@ENVS.register("gui_task")
class GUITaskEnv(TextEpisodeEnv):
    """N worlds of multi-step GUI tasks with text actions (see the module docstring for the tasks and rewards).

    >>> env = GUITaskEnv(num_envs=2, tasks=["menu"])
    >>> obs = env.reset(seed=0)
    >>> first = env.step(env.expert_action())  # opens the menu
    >>> last = env.step(env.expert_action())  # picks the item: the episode ends in success
    >>> bool(last.info["success"].all()), bool(last.terminated.all())
    (True, True)

    Args:
        num_envs: N, the number of worlds.
        image_size: Side of the square screens in pixels, at least `MIN_SIZE` (96).
        tasks: The tasks worlds draw from (a subset of `TASKS`).
        themes: The themes worlds draw from (a subset of `THEMES`).
        max_episode_steps: Steps after which an episode is truncated.
        type_weight: Weight of the per-step action-type term.
        match_weight: Weight of the per-step action-match term (paid once per step of progress).
        success_weight: Weight of the success term, paid on the step that ends the episode in success.
        coordinates: The units of click points (and of the expert's): "pixels", "0-1000" or "0-1"
            (`rewards.coordinates`).
        input_size: With "pixels", the side of the screen as the model sees it after its processor's resize; 0:
            `image_size`.
        device: Where the returned tensors live. Screens are always drawn on the CPU.
    """

    def __init__(
        self,
        num_envs: int,
        image_size: int = 128,
        tasks: Sequence[str] = TASKS,
        themes: Sequence[str] = THEME_NAMES,
        max_episode_steps: int = 8,
        type_weight: float = 0.1,
        match_weight: float = 0.2,
        success_weight: float = 1.0,
        coordinates: str = "pixels",
        input_size: int = 0,
        device: str = "cpu",
    ):
        check_coordinates(coordinates, input_size)
        self.coordinates, self.input_size = coordinates, input_size
        self.num_envs = _check_num_envs(num_envs)
        self.image_size = _check_size(image_size)
        self.tasks = _check_choices("tasks", tasks, TASKS)
        self.themes = _check_choices("themes", themes, THEME_NAMES)
        if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int) or max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be an int >= 1, got {max_episode_steps!r}")
        self.max_episode_steps = max_episode_steps
        self.type_weight = _check_weight("type_weight", type_weight)
        self.match_weight = _check_weight("match_weight", match_weight)
        self.success_weight = _check_weight("success_weight", success_weight)
        self.device = torch.device(device)

        size = self.image_size
        self._images = torch.zeros(num_envs, size, size, 3, dtype=torch.uint8, device=self.device)
        self.apps: list[App | None] = [None] * num_envs
        self._best = [0] * num_envs  # fewest expert steps to the goal seen this episode (the match term's bar)
        self._start_bookkeeping(num_envs)

    def start_worlds(self, ids: list[int], seeds: list[int]) -> None:
        """Draws each world's task, theme and app from its seed, and its first screen."""
        for i, world_seed in zip(ids, seeds):
            rng = np.random.default_rng(world_seed)
            task = self.tasks[int(rng.integers(len(self.tasks)))]
            theme = THEMES[self.themes[int(rng.integers(len(self.themes)))]]
            app = self.apps[i] = make_app(task, rng, self.image_size, theme)
            self.task_names[i] = task
            self._instructions[i] = app.instruction + HINTS[self.coordinates]
            self._best[i] = app.remaining()
        index = torch.tensor(ids, dtype=torch.long, device=self.device)
        self._images[index] = _draw_rows([self._app(i).screen for i in ids]).to(self.device)

    def step(self, actions: list[str]) -> StepResult:
        """Apply one action per running world and score it; ended worlds stay frozen.

        Args:
            actions: N action strings in the grammar of `rewards.actions` (ignored for worlds that ended).

        Returns:
            A StepResult with the new observation, reward `[N]` float32, terminated and truncated `[N]` bool, and
            info: `reward_components` (`action_type`, `action_match`, `success`: `[N]`, what each term paid this
            step before weighting), `reasons` (N strings: the parser's reason, or the action that was expected;
            "" where the action was the expected one or the world is frozen), `expected_action` (N strings: the
            expert's action the step was scored against, "" for frozen worlds) and `success` (`[N]` bool: the
            episode ended in success, repeated while frozen).

        Raises:
            ValueError: `actions` is not a list of N strings.
            RuntimeError: Some worlds were never reset.
        """
        texts = self._check_step(actions)
        live = [not ended for ended in self._ended]
        n = self.num_envs
        expected: list[str | None] = [None] * n
        boxes = torch.full((n, 4), math.nan, dtype=torch.float64)  # [N, 4] the box a click must hit, in answer units
        size, units = self.image_size, (self.coordinates, self.input_size)
        for i in range(n):
            if live[i]:
                text, element = self._app(i).expert()
                expected[i] = text if element is None else _click(element, np.zeros(2), 0.0, size, *units)
                if element is not None:
                    box = torch.tensor(element.box, dtype=torch.float64)
                    boxes[i] = from_pixels(box, self.coordinates, size, size, self.input_size)
        # NaN rows are frozen worlds: nothing to score.
        type_ok = action_type_reward(texts, expected).nan_to_num(0.0)  # [N]
        match_ok = action_match_reward(texts, expected, target_box=boxes).nan_to_num(0.0)  # [N]

        paid = torch.zeros(n)
        success_now = torch.zeros(n)
        reasons = [""] * n
        redraw = []
        for i, action in enumerate(parse_actions(texts)):
            if not live[i]:
                continue
            app = self._app(i)
            before = app.screen
            outcome = app.act(action_in_pixels(action, self.coordinates, size, self.input_size))
            self._steps[i] += 1
            remaining = 0 if outcome else app.remaining()
            if match_ok[i] > 0 and remaining < self._best[i]:
                paid[i] = 1.0
            self._best[i] = min(self._best[i], remaining)
            if action.kind is None:
                reasons[i] = action.reason
            elif match_ok[i] == 0:
                reasons[i] = f"expected {expected[i]}"
            elif paid[i] == 0:
                reasons[i] = "this step was already rewarded earlier in the episode"
            if outcome is not None:
                self._terminated[i], self._success[i] = True, outcome
                success_now[i] = float(outcome)
            elif self._steps[i] >= self.max_episode_steps:
                self._truncated[i] = True
            self._ended[i] = self._terminated[i] or self._truncated[i]
            if app.screen is not before:
                redraw.append(i)
        if redraw:
            index = torch.tensor(redraw, dtype=torch.long, device=self.device)
            self._images[index] = _draw_rows([self._app(i).screen for i in redraw]).to(self.device)

        live_t = torch.tensor(live)
        components = {
            "action_type": torch.where(live_t, type_ok, 0.0).to(torch.float32),
            "action_match": paid.to(torch.float32),
            "success": success_now.to(torch.float32),
        }
        reward = (
            self.type_weight * components["action_type"]
            + self.match_weight * components["action_match"]
            + self.success_weight * components["success"]
        )
        info = {
            "reward_components": {k: v.to(self.device) for k, v in components.items()},
            "reasons": reasons,
            "expected_action": [e or "" for e in expected],
        }
        return self._result(reward, info)

    def expert_answer(self, i: int, offset: np.ndarray) -> str:
        """World i's expert step (`expert_action`); a click lands `offset` element sizes off the element's centre."""
        text, element = self._app(i).expert()
        if element is None:
            return text
        return _click(element, offset, 1.0, self.image_size, self.coordinates, self.input_size)

    def close(self) -> None:
        """Nothing to release: screens are drawn in-process."""

    def _app(self, i: int) -> App:
        app = self.apps[i]
        assert app is not None  # worlds are reset before they are stepped or asked (TextEpisodeEnv._check_step)
        return app
