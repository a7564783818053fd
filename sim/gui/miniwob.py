"""MiniWoB++ web tasks in headless Chromium (`miniwob`): real pages, real browser events, MiniWoB's own rewards.

Farama's `miniwob` package (https://miniwob.farama.org) holds the task pages; each world is one confined headless
Chromium (`sim.gui.browser`) driven by the package's own Selenium instance and action API (`create_action` with
`CLICK_COORDS`, `TYPE_TEXT`, `PRESS_KEY`, `SCROLL_*_COORDS`). Everything is imported lazily: `import sim` needs no
browser, and without one `sim.make("miniwob")` raises an error that says what is missing (`make setup-browser`).

**Task.** Each episode is one MiniWoB++ task instance, e.g. click-button "Click on the "no" button.", enter-text
"Enter "Myron" into the text field and press Submit.", login-user, click-checkboxes. The task of an episode is
`tasks[seed % len(tasks)]` (so world k of `reset(seed)` gets task `(seed + k) % len(tasks)`: the tasks spread over
the worlds, and G worlds reset with one seed share one task, as GRPO groups need); the page's own generator is
seeded with the seed (`Math.seedrandom`), so a seed gives the same utterance and the same page. A world whose next
task differs from its current one loads the new page first (about 0.1-0.3 s).

**Observation.** `image` `[N, S, S, 3]` uint8: the 160 x 210 task area's screenshot, resized (bilinear) so its
height is S = `image_size` and centred on a black square, as `dataset` letterboxes: a point (x, y) of the image is
the page point `((x - pad) / scale, y / scale)` with `scale = S / 210` and `pad = (S - round(160 * scale)) // 2`.
`instruction` is the task's utterance. Text carets are hidden, jQuery animations are off and Chromium repaints whole
tiles (no partial raster), so a screenshot depends on the state only (not on when it was taken); the pointer is
parked outside the task area at every reset.

**Actions** (text, in the grammar of `rewards.actions`, as `gui_task`), in pixels of the observed image:
`click(x, y)` clicks there (`CLICK_COORDS`; a click on the black padding does nothing); `type("text")` sends the
keystrokes to the focused element (`TYPE_TEXT`: it types, so it appends to what a field holds; at most
`TYPE_MAX_CHARS` characters); `press(key)` presses a key (`PRESS_KEY`: `enter`, `tab`, `space`, `backspace`,
`delete`, `up`/`down`/`left`/`right`, `pageup`/`pagedown`, `ctrl+a`/`ctrl+c`/`ctrl+v`/`ctrl+x`, or one
printable character MiniWoB allows); `scroll(up)` / `scroll(down)` turns the wheel over the task area's centre.
`finish()` gives up: the episode ends, not a success. Anything else (an unparsed answer, `long_press`, `scroll(left)`, `press(back)`,
an unknown key) changes nothing and costs a step, with the reason in `info["reasons"]`.

**Reward** (`reward`): `"raw"` (default): MiniWoB's raw reward on the step that ends the episode (1 on success,
-1 on a wrong submission, in between for partially-scored tasks), 0 on other steps and on truncation.
`"success"`: 1 on the step that ends it in success, else 0. `"decayed"`: MiniWoB's time-decayed reward
(`raw * max(0, 1 - elapsed / time limit)`), which depends on wall-clock time and needs `time_limit_s`.
**Success**: the episode ended with a raw reward > 0. Episodes end when MiniWoB says so (terminated), on `finish()`
(terminated), or after `max_episode_steps` steps (truncated). MiniWoB's own 10 s wall-clock limit is off unless
`time_limit_s` sets one (then an episode that runs past it ends with -1 at the next step): a slow policy must not
fail tasks because generation is slow.

**Finished worlds.** No autoreset. A world whose episode ended is frozen until reset (its action is ignored, its
reward 0, its last image, `terminated`, `truncated` and `success` repeated), as in `gui_task`.

**Expert** (`expert_action`; the plans are in `sim.gui.miniwob_expert`), for `EXPERT_TASKS`: the next action of a
plan computed from the current page (the DOM's elements, their boxes, texts, values and focus, and the utterance's
fields; for choose-list and use-autocomplete it also reads the page's option list), written in the grammar above
with clicks at element centres in image pixels: its episodes are the demonstrations of `sft`. With `noise > 0`,
clicks get Gaussian noise of std `noise` times the element's width and height. Success rates over 20 seeds per task
are in the tests and docs.

**Network.** None: pages load from `file://`, and the browser's flags send every request to a dead proxy and
resolve no host name (`sim.gui.browser`). N worlds are N browsers in this process (about 1 s and 150-200 MB each),
stepped concurrently by threads (the work is in the browsers).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import numpy as np
import torch
from PIL import Image

from rewards import Action, parse_actions
from rewards.coordinates import HINTS, check_coordinates, format_values, from_pixels
from sim.base import StepResult, TextEpisodeEnv
from sim.gui.browser import browser_unavailable, confine_environment, quit_chrome, start_chrome
from sim.gui.envs import action_in_pixels
from sim.gui.miniwob_expert import EXPERT_TASKS, expert_step
from sim.registry import ENVS

TASK_WIDTH, TASK_HEIGHT = 160, 210  # MiniWoB's task area, in page pixels
TYPE_MAX_CHARS = 64
REWARDS = ("raw", "success", "decayed")
# press(key) names -> MiniWoB's key names (`miniwob.constants.DEFAULT_ALLOWED_KEYS`); single characters map to
# themselves.
KEYS = {
    "enter": "<Enter>",
    "tab": "<Tab>",
    "space": "<Space>",
    "backspace": "<Backspace>",
    "delete": "<Delete>",
    "up": "<ArrowUp>",
    "down": "<ArrowDown>",
    "left": "<ArrowLeft>",
    "right": "<ArrowRight>",
    "arrowup": "<ArrowUp>",
    "arrowdown": "<ArrowDown>",
    "arrowleft": "<ArrowLeft>",
    "arrowright": "<ArrowRight>",
    "pageup": "<PageUp>",
    "pagedown": "<PageDown>",
    **{f"{mod}{sep}{c}": f"C-{c}" for mod in ("ctrl", "control") for sep in ("+", "-") for c in "acvx"},
}
# Run after every page load: hide the text caret (it blinks, so screenshots would depend on timing), turn off
# jQuery's animations (dialogs, menus and autocompletes appear at once) and set MiniWoB's episode time limit.
_STABILISE = """
var style = document.createElement('style');
style.textContent = '* { caret-color: transparent !important; transition: none !important;'
  + ' animation: none !important; }';
document.head.appendChild(style);
if (window.jQuery) { jQuery.fx.off = true; }
core.EPISODE_MAX_TIME = arguments[0];
"""
_NO_LIMIT_MS = 10**9  # MiniWoB's wall-clock limit, effectively off (11.6 days)


@cache
def _confined_env_class() -> type:
    """A `miniwob` gymnasium env whose Selenium instance runs our confined Chromium (`sim.gui.browser`).

    Built on first use, because `miniwob` is imported lazily.
    """
    from miniwob.environment import MiniWoBEnvironment
    from miniwob.fields import get_field_extractor
    from miniwob.selenium_instance import SeleniumInstance

    class ConfinedInstance(SeleniumInstance):
        """MiniWoB's Selenium instance with our browser: explicit binary and driver, no network."""

        time_limit_ms = _NO_LIMIT_MS

        def create_driver(self):
            # --disable-partial-raster: with partial raster on, the first paint after a page load anti-aliased the
            # click-tab panel's rounded corners one level apart from later paints (2 pixels, in 12 of 120 resets
            # under load), so the same seed gave two images; with it off, 0 of 440.
            self.driver = start_chrome(
                ("--window-size=500,400", "--force-device-scale-factor=1", "--disable-partial-raster")
            )
            self.load()

        def load(self):
            self.driver.get(self.url)
            if not self.driver.execute_script("return document.getElementById('sync-task-cover') !== null;"):
                raise RuntimeError(f"MiniWoB page {self.url} did not load")
            self.driver.execute_script(_STABILISE, self.time_limit_ms)
            self.inner_width, self.inner_height = self.driver.execute_script(
                "return [window.innerWidth, window.innerHeight];"
            )

        def close(self):
            if hasattr(self, "driver"):
                quit_chrome(self.driver)
            self.died = True

    class ConfinedMiniWoB(MiniWoBEnvironment):
        """One MiniWoB world that can switch task (page) between episodes."""

        def _hard_reset_instance(self):
            if getattr(self, "instance", None):
                self.instance.close()
            self.instance = ConfinedInstance(index=0, **self.instance_kwargs)
            self.instance.start()  # not threaded: `start` is `create_driver`

        def switch_task(self, task: str) -> None:
            self.subdomain = task
            self.instance_kwargs["subdomain"] = task
            instance = self.instance
            instance.url = instance.url.rsplit("/", 1)[0] + f"/{task}.html"
            instance.field_extractor = get_field_extractor(task)
            instance.load()

    return ConfinedMiniWoB


def _check_tasks(tasks: str | Sequence[str]) -> tuple[str, ...]:
    chosen = (tasks,) if isinstance(tasks, str) else tuple(tasks)
    if not chosen:
        raise ValueError("tasks must name at least one MiniWoB++ task")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"tasks has repeated entries: {list(chosen)}")
    bad = [t for t in chosen if not isinstance(t, str) or t.startswith("flight.")]
    if bad:
        raise ValueError(f"tasks {bad} are not supported (MiniWoB++ task names such as 'click-button'; no flight.*)")
    return chosen


# Resolves after the page's zero-delay timers queued before it have run (a widget may restyle itself in one, e.g.
# when it takes focus: under load click-dialog's image changed by 4 pixels after two frames had agreed) and the
# browser has then produced two more frames, so every change made before it has been painted.
_NEXT_PAINT = (
    "const done = arguments[0]; setTimeout(() => requestAnimationFrame(() => requestAnimationFrame(() => done())), 0);"
)


def _settled_screenshot(env: Any, first: np.ndarray, tries: int = 5) -> np.ndarray:
    """The page's screenshot once two in a row agree, each taken after the next paint: on a loaded machine the one
    taken right after a reset can show the page before its last paint, and two taken back to back can both show
    it (no frame came between them), so the same seed would not give the same image."""
    from miniwob.screenshot import get_screenshot, pil_to_numpy_array

    inst = env.unwrapped.instance
    shot = first
    for _ in range(tries):
        inst.driver.execute_async_script(_NEXT_PAINT)
        image = get_screenshot(inst.driver, inst.inner_width, inst.inner_height, inst.task_width, inst.task_height)
        again = pil_to_numpy_array(image)
        if np.array_equal(again, shot):
            break
        shot = again
    return shot


@ENVS.register("miniwob")
class MiniWoBEnv(TextEpisodeEnv):
    """N worlds of MiniWoB++ web tasks, one headless Chromium each (see the module docstring).

    >>> env = MiniWoBEnv(num_envs=2, tasks=["click-button"])  # doctest: +SKIP
    >>> obs = env.reset(seed=0)
    >>> env.step(env.expert_action()).info["success"]
    tensor([True, True])

    Args:
        num_envs: N, the number of worlds (browsers).
        image_size: Side S of the square images, in pixels (the 160 x 210 task area is letterboxed into it).
        tasks: MiniWoB++ task names (one or several); episodes draw `tasks[seed % len(tasks)]`.
        max_episode_steps: Steps after which an episode is truncated.
        reward: `"raw"`, `"success"` or `"decayed"` (see the module docstring).
        time_limit_s: MiniWoB's own wall-clock limit per episode; None turns it off (needed by `"decayed"`).
        coordinates: The units of click points (and of the expert's): "pixels" of the image, "0-1000" or "0-1"
            (`rewards.coordinates`; relative units are named in the instruction).
        input_size: With "pixels", the side of the image as the model sees it after its processor's resize; 0:
            `image_size`.
        device: Where the returned tensors live.
    """

    unavailable = staticmethod(lambda: browser_unavailable(("selenium", "miniwob")))

    def __init__(
        self,
        num_envs: int,
        image_size: int = 160,
        tasks: str | Sequence[str] = EXPERT_TASKS,
        max_episode_steps: int = 8,
        reward: str = "raw",
        time_limit_s: float | None = None,
        coordinates: str = "pixels",
        input_size: int = 0,
        device: str = "cpu",
    ):
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 32:
            raise ValueError(f"image_size must be an int >= 32, got {image_size!r}")
        if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int) or max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be an int >= 1, got {max_episode_steps!r}")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {reward!r}")
        if time_limit_s is not None and not (isinstance(time_limit_s, (int, float)) and time_limit_s > 0):
            raise ValueError(f"time_limit_s must be None or a number > 0, got {time_limit_s!r}")
        if reward == "decayed" and time_limit_s is None:
            raise ValueError("reward='decayed' decays over MiniWoB's time limit: set time_limit_s (e.g. 10)")
        check_coordinates(coordinates, input_size)
        self.coordinates, self.input_size = coordinates, input_size
        self.num_envs = num_envs
        self.image_size = image_size
        self.tasks = _check_tasks(tasks)
        self.max_episode_steps = max_episode_steps
        self.reward = reward
        self.time_limit_s = time_limit_s
        self.device = torch.device(device)
        reason = self.unavailable()
        if reason is not None:
            raise RuntimeError(f"the miniwob env cannot start: {reason}")
        confine_environment()
        import miniwob  # the task pages ship with the package

        pages = os.path.join(os.path.dirname(miniwob.__file__), "html", "miniwob")
        known = {name[: -len(".html")] for name in os.listdir(pages) if name.endswith(".html")}
        bad = [t for t in self.tasks if t not in known]
        if bad:
            raise ValueError(f"tasks {bad} are not MiniWoB++ tasks; valid ones include {', '.join(EXPERT_TASKS)}")

        # Letterbox geometry: page (x, y) -> image (x * scale + pad, y * scale).
        self.scale = image_size / TASK_HEIGHT
        self.pad = (image_size - round(TASK_WIDTH * self.scale)) // 2

        self._pool = ThreadPoolExecutor(max_workers=num_envs) if num_envs > 1 else None
        self.worlds: list[Any] = []
        try:
            self.worlds = self._map(self._start_world, [self.tasks[k % len(self.tasks)] for k in range(num_envs)])
        except Exception:
            self.close()
            raise
        size = image_size
        self._images = torch.zeros(num_envs, size, size, 3, dtype=torch.uint8)  # [N, S, S, 3]
        self._obs: list[dict | None] = [None] * num_envs  # MiniWoB's latest observation per world
        self._doms: list[Any] = [None] * num_envs  # its root DOMElement
        self._start_bookkeeping(num_envs)
        self._raw = [0.0] * num_envs  # MiniWoB's raw reward at the end of the episode
        self._expert_last = [""] * num_envs  # the expert's latest answer this episode

    # ------------------------------------------------------------------------------------------------ workers
    def _map(self, fn, *iterables) -> list:
        """`fn` over the iterables, concurrently over the browsers (Selenium waits on them, releasing the GIL)."""
        if self._pool is None:
            return [fn(*args) for args in zip(*iterables)]
        return list(self._pool.map(fn, *iterables))

    def _start_world(self, task: str) -> Any:
        env = _confined_env_class()(subdomain=task)
        limit = _NO_LIMIT_MS if self.time_limit_s is None else round(self.time_limit_s * 1000)
        env.instance.time_limit_ms = limit
        env.instance.driver.execute_script("core.EPISODE_MAX_TIME = arguments[0];", limit)
        env.action_space.seed(0)  # create_action samples the unused fields; keep even those reproducible
        return env

    def _reset_world(self, i: int, seed: int) -> tuple[dict, Any]:
        env = self.worlds[i]
        task = self.tasks[seed % len(self.tasks)]
        if env.subdomain != task:
            env.switch_task(task)
        _park_pointer(env.instance.driver)
        obs, info = env.reset(seed=seed)
        return {**obs, "screenshot": _settled_screenshot(env, obs["screenshot"])}, info["root_dom"]

    def _step_world(self, i: int, action: Action) -> tuple[dict | None, Any, dict | None, str]:
        """Apply one parsed action to world i: (MiniWoB observation or None, root DOM, metadata or None, reason)."""
        env = self.worlds[i]
        made, reason = self._miniwob_action(env, action)
        if made is None:
            return None, None, None, reason
        obs, _, _, _, info = env.step(made)
        return obs, info.get("root_dom"), info, reason

    def _miniwob_action(self, env: Any, action: Action) -> tuple[dict | None, str]:
        """MiniWoB's action for a parsed one, or (None, why it does nothing)."""
        kind, args = action.kind, action.args
        if kind is None:
            return None, action.reason
        if kind == "click":
            args = action_in_pixels(action, self.coordinates, self.image_size, self.input_size).args  # image pixels
            x, y = self.to_page(float(args["x"]), float(args["y"]))
            if not (0 <= x < TASK_WIDTH and 0 <= y < TASK_HEIGHT):
                return None, "the click is outside the page"
            coords = np.array([x, y], dtype=np.float32)
            return env.unwrapped.create_action("CLICK_COORDS", coords=coords), ""
        if kind == "type":
            text = str(args["text"])[:TYPE_MAX_CHARS]
            return env.unwrapped.create_action("TYPE_TEXT", text=text), ""
        if kind == "press":
            key = str(args["key"])
            name = KEYS.get(key, key if len(key) == 1 else None)
            allowed = env.unwrapped.action_space_config.allowed_keys
            if name is None or name not in allowed:
                return None, f"press({key}) is not a key MiniWoB presses"
            return env.unwrapped.create_action("PRESS_KEY", key=allowed.index(name)), ""
        if kind == "scroll" and args["direction"] in ("up", "down"):
            kind_name = "SCROLL_UP_COORDS" if args["direction"] == "up" else "SCROLL_DOWN_COORDS"
            centre = np.array([TASK_WIDTH / 2, TASK_HEIGHT / 2], dtype=np.float32)
            return env.unwrapped.create_action(kind_name, coords=centre), ""
        return None, f"{kind} does nothing here"

    # ------------------------------------------------------------------------------------------------ geometry
    def to_page(self, x: float, y: float) -> tuple[float, float]:
        """The page point under the image point (x, y)."""
        return (x - self.pad) / self.scale, y / self.scale

    def to_image(self, x: float, y: float) -> tuple[float, float]:
        """The image point over the page point (x, y)."""
        return x * self.scale + self.pad, y * self.scale

    def _letterbox(self, screenshot: np.ndarray) -> torch.Tensor:
        """`[S, S, 3]` uint8: the `[210, 160, 3]` screenshot resized to height S and centred on black."""
        size = self.image_size
        width = round(TASK_WIDTH * self.scale)
        canvas = np.zeros((size, size, 3), dtype=np.uint8)
        resized = Image.fromarray(np.ascontiguousarray(screenshot[:TASK_HEIGHT, :TASK_WIDTH])).resize(
            (width, size), Image.BILINEAR
        )
        canvas[:, self.pad : self.pad + width] = np.asarray(resized)
        return torch.from_numpy(canvas)

    # ------------------------------------------------------------------------------------------------ contract
    def start_worlds(self, ids: list[int], seeds: list[int]) -> None:
        """Loads each world's page: a seed picks the task (`tasks[seed % len(tasks)]`) and seeds the page's generator."""
        for i, (obs, dom) in zip(ids, self._map(self._reset_world, ids, seeds)):
            self._obs[i], self._doms[i] = obs, dom
            self._images[i] = self._letterbox(obs["screenshot"])
            self._instructions[i] = str(obs["utterance"]) + HINTS[self.coordinates]
            self.task_names[i] = self.worlds[i].subdomain
            self._raw[i], self._expert_last[i] = 0.0, ""

    def step(self, actions: list[str]) -> StepResult:
        """Apply one action per running world; ended worlds stay frozen.

        Args:
            actions: N action strings in the grammar of `rewards.actions` (ignored for worlds that ended).

        Returns:
            A StepResult with the new observation, reward `[N]` float32, terminated and truncated `[N]` bool, and
            info: `success` (`[N]` bool, the episode ended in success, repeated while frozen), `raw_reward` (`[N]`,
            MiniWoB's raw reward at the episode's end, 0 before), `reward_components` (`success` `[N]`),
            `reasons` (N strings: why an action did nothing, or MiniWoB's reason at the end; "" otherwise) and
            `task` (N task names).

        Raises:
            ValueError: `actions` is not a list of N strings.
            RuntimeError: Some worlds were never reset.
        """
        parsed = parse_actions(self._check_step(actions))
        live = [i for i in range(self.num_envs) if not self._ended[i]]
        reward = torch.zeros(self.num_envs)
        success_now = torch.zeros(self.num_envs)
        reasons = [""] * self.num_envs
        finishing = [i for i in live if parsed[i].kind == "finish"]
        acting = [i for i in live if parsed[i].kind != "finish"]
        for i, (obs, dom, info, reason) in zip(
            acting, self._map(self._step_world, acting, [parsed[i] for i in acting])
        ):
            reasons[i] = reason
            self._steps[i] += 1
            if info is not None and info["done"]:
                self._terminated[i] = True
                raw = float(info["raw_reward"])
                self._raw[i], self._success[i] = raw, raw > 0
                success_now[i] = float(raw > 0)
                reward[i] = {"raw": raw, "success": float(raw > 0), "decayed": float(info["env_reward"])}[self.reward]
                if raw <= 0:
                    reasons[i] = f"MiniWoB ended the episode with reward {raw:g} ({info.get('reason')})"
            elif obs is not None:
                self._obs[i], self._doms[i] = obs, dom
                self._images[i] = self._letterbox(obs["screenshot"])
            if not self._terminated[i] and self._steps[i] >= self.max_episode_steps:
                self._truncated[i] = True
        for i in finishing:
            self._steps[i] += 1
            self._terminated[i] = True
            reasons[i] = "finish() ends the episode without success"
        for i in live:
            self._ended[i] = self._terminated[i] or self._truncated[i]
        step_info = {
            "reward_components": {"success": success_now.to(self.device)},
            "raw_reward": torch.tensor(self._raw, dtype=torch.float32, device=self.device),
            "reasons": reasons,
        }
        return self._result(reward, step_info)

    def expert_answer(self, i: int, offset: np.ndarray) -> str:
        """World i's expert step (`expert_action`); a click lands `offset` element sizes off the element's centre.

        Raises:
            ValueError: The world's task has no expert (see `EXPERT_TASKS`).
        """
        obs = self._obs[i]
        assert obs is not None  # the world was reset: it has not ended
        fields = dict(obs["fields"])
        step = expert_step(self.task_names[i], self._doms[i], fields, self.worlds[i], self._expert_last[i])
        if isinstance(step, str):
            self._expert_last[i] = step
            return step
        x = step.left + step.width / 2 + offset[0] * step.width
        y = step.top + step.height / 2 + offset[1] * step.height
        ix, iy = self.to_image(x, y)
        ix = min(max(round(ix), 0), self.image_size - 1)
        iy = min(max(round(iy), 0), self.image_size - 1)
        point = from_pixels(torch.tensor([ix, iy], dtype=torch.float64), self.coordinates, self.image_size,
                            self.image_size, self.input_size)  # fmt: skip
        self._expert_last[i] = f"click({format_values(point.tolist(), self.coordinates)})"
        return self._expert_last[i]

    def close(self) -> None:
        """Quit every browser (and remove their profiles)."""
        for env in self.worlds:
            try:
                env.instance.close()
            except Exception:  # a browser that already died has nothing left to release
                pass
        self.worlds = []
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __del__(self):
        if getattr(self, "worlds", None):
            self.close()


def _park_pointer(driver: Any) -> None:
    """Move the mouse outside the task area, so that no hover style from the last episode shows."""
    from miniwob.selenium_actions import execute_move_coords

    execute_move_coords(TASK_WIDTH + 100, TASK_HEIGHT - 10, driver)
