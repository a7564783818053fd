"""The apps of `gui_task`: one world's state machine each (a form to fill, a menu to use, pages to navigate, a list
to scroll), the screen drawn from its state, its goal, and the expert's next action (`sim.gui.envs` describes the
tasks and rewards).
"""

from __future__ import annotations

import numpy as np

from rewards import (
    Action,
    normalize_answer,
)
from sim.gui.layouts import (
    SettingsSpec,
    detail_screen,
    fit_tabs,
    form_screen,
    sample_form,
    sample_toolbar,
    settings_rows,
    settings_screen,
    toolbar_screen,
    visible_rows,
)
from sim.gui.screen import (
    LINK_LABELS,
    SWITCH_LABELS,
    TAB_NAMES,
    WORDS,
    Element,
    Screen,
    Theme,
)

TASKS = ("form", "menu", "navigate", "scroll")  # the apps `gui_task` plays


class App:
    """One world's app: its state, the screen drawn from it, the goal, and the expert's next action.

    Subclasses set `instruction` and `screen` in `__init__`, call `_redraw()` after every change of state, and define
    the hooks below. A hook that ends the episode returns whether it succeeded; None means the episode goes on.
    """

    instruction: str
    screen: Screen

    def act(self, action: Action) -> bool | None:
        """Apply a parsed action; return None while the episode goes on, else whether it ended in success."""
        if action.kind == "click":
            return self.click(self.screen.element_at(float(action.args["x"]), float(action.args["y"])))
        if action.kind == "type":
            return self.type(str(action.args["text"]))
        if action.kind == "scroll":
            return self.scroll(str(action.args["direction"]))
        if action.kind == "press":
            return self.press(str(action.args["key"]))
        if action.kind == "finish":
            return self.reached()
        return None  # unparsed, long_press: nothing happens

    def click(self, element: Element | None) -> bool | None:
        return None

    def type(self, text: str) -> bool | None:
        return None

    def scroll(self, direction: str) -> bool | None:
        return None

    def press(self, key: str) -> bool | None:
        return None

    def reached(self) -> bool:
        """Whether `finish()` now ends the episode in success."""
        return False

    def expert(self) -> tuple[str, Element | None]:
        """The expert's next action from the current state (text, "" for a click) and the element it clicks, if any."""
        raise NotImplementedError

    def remaining(self) -> int:
        """How many expert actions the goal is away (the last one is the action that ends the episode)."""
        raise NotImplementedError


def _same_text(a: str, b: str) -> bool:
    return normalize_answer(a) == normalize_answer(b)


class _FormApp(App):
    """Fill one field, maybe tick one checkbox, submit."""

    def __init__(self, rng: np.random.Generator, size: int, theme: Theme):
        self.size, self.theme = size, theme
        spec = self.spec = sample_form(rng, size)
        self.field = int(rng.integers(len(spec.fields)))
        self.word = WORDS[int(rng.integers(len(WORDS)))]
        self.check = int(rng.integers(len(spec.checkboxes))) if rng.random() < 0.7 else None
        others = [w for w in WORDS if w != self.word]
        texts = [others[int(rng.integers(len(others)))] if rng.random() < 0.3 else "" for _ in spec.fields]
        checked = [bool(rng.random() < 0.4) for _ in spec.checkboxes]
        if self.check is not None:
            checked[self.check] = False
        self.start = (tuple(texts), tuple(checked))
        self.texts, self.checked = texts, checked
        self.focused: int | None = None
        tick = f", tick {spec.checkboxes[self.check]}" if self.check is not None else ""
        self.instruction = f"Type {self.word} in {spec.fields[self.field]}{tick}, then click {spec.submit}."
        self._redraw()

    def _redraw(self) -> None:
        self.screen = form_screen(self.size, self.theme, self.spec, self.texts, self.checked, self.focused)

    def _done(self) -> bool:
        ticked = self.check is None or self.checked[self.check]
        return ticked and _same_text(self.texts[self.field], self.word)

    def click(self, element):
        self.focused = None  # anything but a field takes the focus away
        if element is not None and element.kind == "field":
            self.focused = self.spec.fields.index(element.label)
        elif element is not None and element.kind == "checkbox":
            k = self.spec.checkboxes.index(element.label)
            self.checked[k] = not self.checked[k]
        elif element is not None and element.kind == "button":
            if element.label == self.spec.submit:
                return self._done()
            self.texts, self.checked = list(self.start[0]), list(self.start[1])  # the reset button
        self._redraw()
        return None

    def type(self, text):
        if self.focused is not None:
            self.texts[self.focused] = text
            self._redraw()
        return None

    def expert(self):
        screen, spec = self.screen, self.spec
        if not _same_text(self.texts[self.field], self.word):
            if self.focused == self.field:
                return f'type("{self.word}")', None
            return "", screen.find("field", spec.fields[self.field])
        if self.check is not None and not self.checked[self.check]:
            return "", screen.find("checkbox", spec.checkboxes[self.check])
        return "", screen.find("button", spec.submit)

    def remaining(self):
        steps = 1  # the submit click
        if self.check is not None and not self.checked[self.check]:
            steps += 1
        if not _same_text(self.texts[self.field], self.word):
            steps += 1 if self.focused == self.field else 2
        return steps


class _ToolbarApp(App):
    """A menu bar over a scrollable list: pick a menu item (`menu`) or open a list item (`scroll`)."""

    def __init__(self, rng: np.random.Generator, size: int, theme: Theme, task: str):
        self.size, self.theme, self.task = size, theme, task
        self.shown = visible_rows(size)
        if task == "menu":
            spec = self.spec = sample_toolbar(rng, size)
            self.menu = int(rng.integers(len(spec.menus)))
            self.goal = spec.menu_items[self.menu][int(rng.integers(len(spec.menu_items[self.menu])))]
            self.instruction = f"Choose {self.goal} from the {spec.menus[self.menu]} menu."
        else:
            spec = self.spec = sample_toolbar(rng, size, min_items=self.shown + 2, max_items=3 * self.shown)
        last = len(spec.items) - min(self.shown, len(spec.items))  # the largest scroll offset
        self.offset = int(rng.integers(0, last + 1))
        if task == "scroll":
            hidden = [k for k in range(len(spec.items)) if not self.offset <= k < self.offset + self.shown]
            # Mostly an item off screen, so that scrolling is needed; sometimes one in view.
            pool = hidden if hidden and rng.random() < 0.75 else list(range(len(spec.items)))
            self.target = pool[int(rng.integers(len(pool)))]
            self.goal = spec.items[self.target]
            self.instruction = f"Open {self.goal} in the list."
        self.last = last
        self.step_rows = max(1, self.shown - 1)  # a scroll keeps one row of context
        self.open: int | None = None
        self._redraw()

    def _redraw(self) -> None:
        self.screen = toolbar_screen(self.size, self.theme, self.spec, self.open, self.offset)

    def click(self, element):
        if element is not None and element.kind == "menu_item":
            return self.task == "menu" and self.open == self.menu and element.label == self.goal
        if element is not None and element.kind == "item":
            return self.task == "scroll" and element.label == self.goal
        if element is not None and element.kind == "menu":
            k = self.spec.menus.index(element.label)
            self.open = None if self.open == k else k
        else:
            self.open = None
        self._redraw()
        return None

    def scroll(self, direction):
        if direction in ("up", "down"):
            move = self.step_rows if direction == "down" else -self.step_rows
            self.offset = min(max(self.offset + move, 0), self.last)
            self.open = None
            self._redraw()
        return None

    def press(self, key):
        if key == "back" and self.open is not None:
            self.open = None
            self._redraw()
        return None

    def _scrolls(self) -> tuple[int, str]:
        """How many scrolls bring the target into view, and their direction."""
        offset, count = self.offset, 0
        direction = "down" if self.target >= offset + self.shown else "up"
        while not offset <= self.target < offset + self.shown:
            move = self.step_rows if direction == "down" else -self.step_rows
            offset, count = min(max(offset + move, 0), self.last), count + 1
        return count, direction

    def expert(self):
        if self.task == "menu":
            if self.open != self.menu:
                return "", self.screen.find("menu", self.spec.menus[self.menu])
            return "", self.screen.find("menu_item", self.goal)
        if self.open is not None:
            return "press(back)", None  # the open menu may cover the target
        count, direction = self._scrolls()
        if count:
            return f"scroll({direction})", None
        return "", self.screen.find("item", self.goal)

    def remaining(self):
        if self.task == "menu":
            return 1 if self.open == self.menu else 2
        return 1 + (self.open is not None) + self._scrolls()[0]


class _NavApp(App):
    """Tabs with links to sub-pages: reach the named page, then finish."""

    def __init__(self, rng: np.random.Generator, size: int, theme: Theme):
        self.size, self.theme = size, theme
        tabs = fit_tabs([TAB_NAMES[int(i)] for i in rng.permutation(len(TAB_NAMES))[: int(rng.integers(2, 5))]], size)
        rows = settings_rows(size)
        link_pool = [LINK_LABELS[int(i)] for i in rng.permutation(len(LINK_LABELS))]
        self.specs: list[SettingsSpec] = []
        self.on: list[list[bool]] = []
        for _ in tabs:
            n_links = int(rng.integers(1, 4))
            links = tuple(link_pool[:n_links])
            del link_pool[:n_links]
            n_switches = min(int(rng.integers(0, 3)), rows - n_links)
            switches = tuple(SWITCH_LABELS[int(i)] for i in rng.permutation(len(SWITCH_LABELS))[:n_switches])
            self.specs.append(SettingsSpec(tabs=tabs, switches=switches, links=links, buttons=()))
            self.on.append([bool(rng.random() < 0.5) for _ in switches])
        self.filler = tuple(float(w) for w in rng.uniform(0.35, 0.95, size=8))
        pages = [(t,) for t in range(len(tabs))] + [
            (t, j) for t, s in enumerate(self.specs) for j in range(len(s.links))
        ]
        self.goal = pages[int(rng.integers(len(pages)))]
        starts = [p for p in pages if p != self.goal]
        self.page = starts[int(rng.integers(len(starts)))]
        self.history: list[tuple[int, ...]] = [(self.page[0],)] if len(self.page) == 2 else []
        if len(self.goal) == 1:
            self.instruction = f"Go to the {tabs[self.goal[0]]} tab, then finish."
        else:
            link = self.specs[self.goal[0]].links[self.goal[1]]
            self.instruction = f"Open {link} in the {tabs[self.goal[0]]} tab, then finish."
        self._redraw()

    def _redraw(self) -> None:
        t = self.page[0]
        if len(self.page) == 1:
            self.screen = settings_screen(self.size, self.theme, self.specs[t], t, self.on[t])
        else:
            self.screen = detail_screen(self.size, self.theme, self.specs[t].links[self.page[1]], self.filler)

    def _go(self, page: tuple[int, ...]) -> None:
        self.history.append(self.page)
        self.page = page

    def click(self, element):
        if element is None or len(self.page) == 2:
            return None  # sub-pages have nothing to click
        t = self.page[0]
        if element.kind == "tab":
            k = self.specs[t].tabs.index(element.label)
            if k != t:
                self._go((k,))
        elif element.kind == "link":
            self._go((t, self.specs[t].links.index(element.label)))
        elif element.kind == "switch":
            k = self.specs[t].switches.index(element.label)
            self.on[t][k] = not self.on[t][k]
        self._redraw()
        return None

    def press(self, key):
        if key == "back" and self.history:
            self.page = self.history.pop()
        elif key == "home":
            self.page, self.history = (0,), []
        self._redraw()
        return None

    def reached(self):
        return self.page == self.goal

    def expert(self):
        if self.page == self.goal:
            return "finish()", None
        if len(self.page) == 2:
            return "press(back)", None  # back from a sub-page always lands on its tab
        t, g = self.page[0], self.goal[0]
        if t == g:
            return "", self.screen.find("link", self.specs[t].links[self.goal[1]])
        return "", self.screen.find("tab", self.specs[t].tabs[g])

    def remaining(self):
        def hops(page: tuple[int, ...]) -> int:
            if page == self.goal:
                return 0
            if len(page) == 2:
                return 1 + hops((page[0],))
            return 1 if len(self.goal) == 1 or self.goal[0] == page[0] else 2

        return hops(self.page) + 1  # + finish


def make_app(task: str, rng: np.random.Generator, size: int, theme: Theme) -> App:
    if task == "form":
        return _FormApp(rng, size, theme)
    if task in ("menu", "scroll"):
        return _ToolbarApp(rng, size, theme, task)
    if task == "navigate":
        return _NavApp(rng, size, theme)
    raise ValueError(f"unknown task {task!r}; valid: {', '.join(TASKS)}")
