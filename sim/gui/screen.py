"""Procedurally generated GUI screens (no browser): the screen model, vocabularies, themes and metrics of `sim.gui`.

The layouts are in `sim.gui.layouts`, the painter in `sim.gui.paint`.

A `Screen` is a list of things to draw in order: `Element`s (the clickable widgets: buttons, text fields, checkboxes,
switches, list items, icons, menu headers and menu items, tabs, links) and `Decor` (backgrounds, title bars, field
labels, skeleton text lines, a dim veil under a dialog, shadows). Every element has a kind, a label that is unique on
its screen (case-insensitively), a pixel box `(x1, y1, x2, y2)` with x2/y2 exclusive, and its state (checked, typed
text, focus, an open menu, the selected tab). `draw(screen)` (`sim.gui.paint`) turns it into an `[H, W, 3]` uint8 picture.

**Layouts** (`LAYOUTS`): `form` (title bar, labelled fields, checkboxes, a button row), `toolbar` (menu bar with
menus and icons over a scrollable list; a menu may be open over the list), `dialog` (a modal dialog over a dimmed
page: title, message, optional checkbox and close icon, buttons), `settings` (tab bar, switch rows, links, buttons).
Each has a `*Spec` (the content: labels, counts, alignment), a `sample_*` function that draws a spec from a numpy
`Generator`, and a `*_screen` function that lays the spec out for a state. Layout is a pure function of (size, theme,
spec, state), so an env can redraw a screen after every action and a seed always gives the same picture.

**Themes** (`THEMES`): light, dark and four coloured palettes, each with enough contrast for text at 7-9 px.

**Legibility.** Sizes scale with the image: the font is `max(7, size / 14)` px (9 px at 128, DejaVu Sans via PIL's
FreeType when it is installed, else PIL's default font), rows are 1.8 fonts high, and samplers only put on a screen
what fits, so every layout works from `MIN_SIZE` (96 px) up. Element boxes never overlap, edges included (a gap of at
least one pixel keeps neighbours apart), so a click point names at most one element.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import ImageFont

MIN_SIZE = 96  # below this, 7 px text and 13 px rows no longer fit the layouts

KINDS = ("button", "field", "checkbox", "switch", "item", "icon", "menu", "menu_item", "tab", "link")
LAYOUTS = ("form", "toolbar", "dialog", "settings")

# How an instruction names an element of each kind. Labels are unique per screen, so each phrase names one element.
_PHRASES = {
    "button": "Click the {} button.",
    "field": "Click the {} field.",
    "checkbox": "Click the {} checkbox.",
    "switch": "Click the {} switch.",
    "item": "Click {} in the list.",
    "icon": "Click the {} icon.",
    "menu": "Click the {} menu.",
    "menu_item": "Click {} in the menu.",
    "tab": "Click the {} tab.",
    "link": "Click the {} link.",
}

# Label vocabularies. Those used together on one layout are disjoint (case-insensitively), which `Screen` checks.
FIELD_LABELS = ("Name", "Email", "Phone", "City", "Street", "Zip", "Company", "Age", "User", "Code", "Note", "Country")
CHECKBOX_LABELS = ("Remember me", "Subscribe", "I agree", "Notify me", "Send copy", "Public", "Newsletter", "Urgent")
SUBMIT_BUTTONS = ("Submit", "Send", "Sign up", "Continue", "Register", "Next", "Confirm", "Done")
RESET_BUTTONS = ("Reset", "Clear")
FORM_TITLES = ("New account", "Contact us", "Checkout", "Your details", "Booking", "Join us")
MENU_NAMES = ("File", "Edit", "View", "Tools", "Help", "Go", "Insert", "Format")
MENU_ITEMS = ("New", "Open", "Copy", "Paste", "Undo", "Redo", "Print", "Export", "Import", "Rename", "Zoom in", "Find",
              "Share", "Close all", "Select all", "Cut")  # fmt: skip
ICONS = ("search", "gear", "star", "trash", "plus", "home", "heart", "close")
LIST_ITEMS = ("Berlin", "Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Delhi", "Rome", "Seoul", "Quito", "Dakar", "Hanoi",
              "Perth", "Kyiv", "Madrid", "Boston", "Dublin", "Prague", "Vienna", "Sydney", "Nairobi", "Havana", "Lagos",
              "Milan")  # fmt: skip
DIALOG_TITLES = ("Delete file?", "Save changes?", "Log out?", "Update ready", "Discard draft?", "Exit app?")
DIALOG_MESSAGES = ("Are you sure?", "Can't be undone.", "Unsaved changes.", "Try again later.", "Please confirm.")
DIALOG_BUTTONS = ("OK", "Cancel", "Delete", "Save", "Discard", "Retry", "Yes", "No", "Keep", "Allow", "Deny", "Update")
DIALOG_CHECKBOXES = ("Don't ask again", "Remember", "Apply to all")
PAGE_TITLES = ("Documents", "Gallery", "Messages", "Dashboard", "Projects", "Calendar")
TAB_NAMES = ("Main", "Account", "Privacy", "Display", "Sound", "Photos", "Music", "Mail", "Shop", "News", "Maps",
             "Games")  # fmt: skip
SWITCH_LABELS = ("Wi-Fi", "Bluetooth", "Dark mode", "Sync", "Location", "Autoplay", "Vibrate", "Airplane", "Hotspot",
                 "Updates", "Backup", "Cookies")  # fmt: skip
LINK_LABELS = ("About", "Help center", "Licenses", "Terms", "Feedback", "Support", "Security", "Language", "Storage",
               "Battery", "Contacts", "History")  # fmt: skip
SETTINGS_BUTTONS = ("Save", "Apply")
SETTINGS_RESET = ("Defaults", "Revert")
# Short lower-case words typed into fields (in screens for grounding, and as the text a form task asks for).
WORDS = ("alice", "bob", "paris", "blue", "tiger", "mango", "owl", "river", "maple", "lemon", "nova", "delta", "echo",
         "kiwi", "ruby", "sage", "fox", "jade", "storm", "pixel")  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# Themes and metrics
# --------------------------------------------------------------------------------------------------------------------

RGB = tuple[int, int, int]


@dataclass(frozen=True)
class Theme:
    """A palette: every colour a screen is drawn with, by role."""

    name: str
    background: RGB  # the page
    surface: RGB  # panels: dialogs, dropdown menus, secondary buttons
    header: RGB  # title, menu and tab bars
    on_header: RGB  # text and icons on the header
    text: RGB
    muted: RGB  # secondary text, unselected tabs, scrollbar thumb
    border: RGB  # outlines; switches that are off
    primary: RGB  # primary buttons
    on_primary: RGB  # text on primary buttons, ticks
    accent: RGB  # focus rings, ticked boxes, switches that are on, links, the selected tab's underline
    field: RGB  # inside text fields
    shadow: RGB
    filler: RGB  # skeleton text lines, scrollbar tracks, list dividers


THEMES = {
    theme.name: theme
    for theme in (
        Theme("light", (245, 246, 248), (255, 255, 255), (222, 227, 235), (30, 34, 40), (25, 28, 33), (110, 116, 126),
              (160, 167, 178), (37, 99, 235), (255, 255, 255), (37, 99, 235), (255, 255, 255), (188, 192, 200),
              (214, 218, 225)),
        Theme("dark", (30, 32, 36), (48, 51, 58), (18, 19, 22), (235, 237, 240), (232, 234, 237), (160, 165, 174),
              (105, 110, 120), (96, 165, 250), (12, 16, 22), (96, 165, 250), (40, 43, 49), (8, 8, 10),
              (64, 68, 77)),
        Theme("ocean", (232, 240, 250), (250, 252, 255), (30, 80, 160), (255, 255, 255), (18, 32, 58), (90, 106, 132),
              (130, 152, 186), (30, 80, 160), (255, 255, 255), (0, 120, 200), (255, 255, 255), (176, 188, 206),
              (198, 211, 231)),
        Theme("forest", (236, 244, 236), (250, 253, 250), (36, 104, 56), (255, 255, 255), (22, 42, 28),
              (92, 118, 98), (132, 165, 138), (36, 126, 66), (255, 255, 255), (36, 126, 66), (255, 255, 255),
              (180, 198, 184), (204, 222, 207)),
        Theme("sunset", (253, 243, 232), (255, 251, 246), (196, 86, 38), (255, 255, 255), (58, 28, 18),
              (136, 100, 84), (198, 156, 134), (206, 82, 32), (255, 255, 255), (196, 66, 28), (255, 255, 255),
              (214, 190, 172), (240, 219, 198)),
        Theme("midnight", (16, 20, 40), (30, 36, 66), (8, 10, 24), (228, 233, 255), (226, 231, 250), (150, 160, 196),
              (84, 94, 136), (250, 180, 40), (20, 20, 20), (250, 180, 40), (22, 27, 52), (4, 4, 10), (46, 54, 88)),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Metrics:
    """Sizes of a layout at one image size, in pixels."""

    font: int  # text size
    row: int  # height of one row of widgets (a field, a list item, a button)
    margin: int  # space kept free along the screen's edges
    pad: int  # horizontal padding inside buttons, tabs and menus
    bar: int  # height of title, menu and tab bars


def metrics(size: int) -> Metrics:
    """The sizes a layout uses on a `size` x `size` screen (9 px text and 16 px rows at 128 px)."""
    font = max(7, round(size / 14))
    return Metrics(
        font=font, row=round(font * 1.8), margin=max(3, round(size / 32)), pad=max(3, round(font * 0.6)),
        bar=round(font * 1.8) + 2,
    )  # fmt: skip


@functools.lru_cache(maxsize=64)
def font(px: int, bold: bool = False) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """DejaVu Sans (Bold) at `px` pixels when FreeType finds it, else PIL's default font (cached per size)."""
    try:
        return ImageFont.truetype("DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf", px)
    except OSError:
        return ImageFont.load_default(size=px)


def text_width(text: str, px: int, bold: bool = False) -> int:
    """Width of `text` drawn at `px` pixels, rounded up."""
    return math.ceil(font(px, bold).getlength(text))


# --------------------------------------------------------------------------------------------------------------------
# Screens
# --------------------------------------------------------------------------------------------------------------------

Box = tuple[int, int, int, int]


@dataclass(frozen=True)
class Element:
    """One clickable widget of a screen.

    Attributes:
        kind: one of `KINDS`.
        label: its name, unique on the screen (case-insensitively): the button's text, a field's label, ...
        box: pixel box `(x1, y1, x2, y2)`, x2/y2 exclusive: the region a click must land in. A field's box is its
            input rectangle (its label is drawn left of it); a checkbox's and a switch's include their label.
        checked: a checkbox is ticked, a switch is on.
        text: what a text field holds.
        focused: a text field has the keyboard focus.
        selected: the current tab.
        open: a menu header whose menu is open.
        primary: a button drawn filled in the primary colour (the main action).
    """

    kind: str
    label: str
    box: Box
    checked: bool = False
    text: str = ""
    focused: bool = False
    selected: bool = False
    open: bool = False
    primary: bool = False

    @property
    def centre(self) -> tuple[int, int]:
        """An integer pixel inside the box, at its centre (rounded down)."""
        x1, y1, x2, y2 = self.box
        return (x1 + x2) // 2, (y1 + y2) // 2

    @property
    def instruction(self) -> str:
        """The sentence that names this element, such as "Click the Save button."."""
        return _PHRASES[self.kind].format(self.label)

    def contains(self, x: float, y: float) -> bool:
        """Whether `(x, y)` lies in the box, edges included (the rule of `rewards.point_in_box`)."""
        x1, y1, x2, y2 = self.box
        return x1 <= x <= x2 and y1 <= y <= y2


@dataclass(frozen=True)
class Decor:
    """Something drawn that cannot be clicked.

    Attributes:
        kind: "fill" (a rectangle), "bar" (a rounded bar: skeleton text lines, scrollbars), "panel" (a rounded
            surface with a border: dialogs, dropdowns), "shadow", "divider" (a one-pixel line along the box's top),
            "text" (left-aligned, vertically centred in the box), "dim" (darkens everything drawn so far).
        box: pixel box, x2/y2 exclusive.
        role: the `Theme` colour it is drawn in.
        text: for "text".
        bold: for "text".
    """

    kind: str
    box: Box
    role: str = "text"
    text: str = ""
    bold: bool = False


@dataclass(frozen=True)
class Screen:
    """A screen: what to draw, in order, and which of it can be clicked.

    Attributes:
        size: side of the square screen in pixels; every box is in these pixels.
        theme: its palette.
        layout: the layout that built it (one of `LAYOUTS`, or "detail" for a plain page).
        items: everything drawn, in drawing order.
        elements: the clickable elements, in drawing order (a subset of `items`: elements covered by an open menu
            are drawn but not clickable).
    """

    size: int
    theme: Theme
    layout: str
    items: tuple[Element | Decor, ...]
    elements: tuple[Element, ...]

    def __post_init__(self):
        seen: dict[str, str] = {}
        for item in self.items:
            x1, y1, x2, y2 = item.box
            if not (0 <= x1 < x2 <= self.size and 0 <= y1 < y2 <= self.size):
                raise ValueError(f"{self.layout} screen: box {item.box} of {item} leaves the {self.size} px screen")
            if isinstance(item, Element):
                key = item.label.casefold()
                if key in seen:
                    raise ValueError(f"{self.layout} screen: label {item.label!r} is used twice ({seen[key]})")
                seen[key] = item.kind
        drawn = {id(item) for item in self.items}
        if any(id(e) not in drawn for e in self.elements):
            raise ValueError(f"{self.layout} screen: every clickable element must also be drawn")

    def find(self, kind: str, label: str) -> Element:
        """The clickable element of that kind and label.

        Raises:
            KeyError: There is none.
        """
        for element in self.elements:
            if element.kind == kind and element.label == label:
                return element
        raise KeyError(f"no clickable {kind} {label!r} on this {self.layout} screen")

    def element_at(self, x: float, y: float) -> Element | None:
        """The clickable element under `(x, y)` (the one drawn last, though boxes never overlap), or None."""
        for element in reversed(self.elements):
            if element.contains(x, y):
                return element
        return None


class Builder:
    """Collects the items of one screen and measures text at the screen's font size."""

    def __init__(self, size: int, theme: Theme, layout: str):
        self.size, self.theme, self.layout = size, theme, layout
        self.m = metrics(size)
        self.items: list[Element | Decor] = [Decor("fill", (0, 0, size, size), "background")]
        self.hidden: list[Element] = []  # drawn, but covered by something drawn later

    def width(self, text: str, bold: bool = False) -> int:
        return text_width(text, self.m.font, bold)

    def decor(self, kind: str, box: Box, role: str = "text", text: str = "", bold: bool = False) -> None:
        self.items.append(Decor(kind, tuple(int(v) for v in box), role, text, bold))

    def element(self, kind: str, label: str, box: Box, **state) -> Element:
        element = Element(kind, label, tuple(int(v) for v in box), **state)
        self.items.append(element)
        return element

    def build(self) -> Screen:
        hidden = {id(e) for e in self.hidden}
        elements = tuple(i for i in self.items if isinstance(i, Element) and id(i) not in hidden)
        return Screen(self.size, self.theme, self.layout, tuple(self.items), elements)


def pick_words(rng: np.random.Generator, vocab: Sequence[str], count: int) -> tuple[str, ...]:
    """`count` distinct entries of `vocab`, in random order."""
    return tuple(vocab[int(i)] for i in rng.choice(len(vocab), size=count, replace=False))


def fillers(rng: np.random.Generator, count: int) -> tuple[float, ...]:
    """Widths, as shares of the available width, of `count` skeleton text lines."""
    return tuple(float(w) for w in rng.uniform(0.35, 0.95, size=count))
