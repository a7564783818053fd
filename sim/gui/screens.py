"""Procedurally generated GUI screens, drawn with PIL (no browser): the pictures and element lists of `sim.gui`.

A `Screen` is a list of things to draw in order: `Element`s (the clickable widgets: buttons, text fields, checkboxes,
switches, list items, icons, menu headers and menu items, tabs, links) and `Decor` (backgrounds, title bars, field
labels, skeleton text lines, a dim veil under a dialog, shadows). Every element has a kind, a label that is unique on
its screen (case-insensitively), a pixel box `(x1, y1, x2, y2)` with x2/y2 exclusive, and its state (checked, typed
text, focus, an open menu, the selected tab). `draw(screen)` turns it into an `[H, W, 3]` uint8 picture.

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
from PIL import Image, ImageDraw, ImageFont

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


class _Builder:
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


def _pick(rng: np.random.Generator, vocab: Sequence[str], count: int) -> tuple[str, ...]:
    """`count` distinct entries of `vocab`, in random order."""
    return tuple(vocab[int(i)] for i in rng.choice(len(vocab), size=count, replace=False))


def _fillers(rng: np.random.Generator, count: int) -> tuple[float, ...]:
    """Widths, as shares of the available width, of `count` skeleton text lines."""
    return tuple(float(w) for w in rng.uniform(0.35, 0.95, size=count))


# --------------------------------------------------------------------------------------------------------------------
# form
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FormSpec:
    """The content of a form: a title bar, labelled fields, checkboxes and a row of buttons."""

    title: str
    fields: tuple[str, ...]
    checkboxes: tuple[str, ...]
    buttons: tuple[str, ...]  # left to right
    submit: str  # the primary button, one of `buttons`
    align: str  # "left", "center" or "right": where the button row sits
    spread: float  # share in [0, 1] of the spare height spent as gaps between rows


def sample_form(rng: np.random.Generator, size: int) -> FormSpec:
    """A random form that fits a `size` px screen: 2-3 fields, 1-2 checkboxes, a submit and maybe a reset button."""
    m = metrics(size)
    rows = (size - m.bar - 2 * m.margin) // m.row  # rows below the title bar; one goes to the buttons
    n_fields = min(int(rng.integers(2, 4)), rows - 2)
    n_checks = min(int(rng.integers(1, 3)), rows - 1 - n_fields)
    submit = SUBMIT_BUTTONS[int(rng.integers(len(SUBMIT_BUTTONS)))]
    buttons = (submit,)
    if rng.random() < 0.6:
        other = RESET_BUTTONS[int(rng.integers(len(RESET_BUTTONS)))]
        buttons = (other, submit) if rng.random() < 0.7 else (submit, other)
    return FormSpec(
        title=FORM_TITLES[int(rng.integers(len(FORM_TITLES)))],
        fields=_pick(rng, FIELD_LABELS, n_fields),
        checkboxes=_pick(rng, CHECKBOX_LABELS, n_checks),
        buttons=buttons,
        submit=submit,
        align=("left", "center", "right")[int(rng.integers(3))],
        spread=float(rng.uniform(0.0, 1.0)),
    )


def form_screen(
    size: int,
    theme: Theme,
    spec: FormSpec,
    texts: Sequence[str] | None = None,
    checked: Sequence[bool] | None = None,
    focused: int | None = None,
) -> Screen:
    """Lay out a form.

    Args:
        size: screen side in pixels.
        theme: the palette.
        spec: the content.
        texts: what each field holds (default: all empty).
        checked: which checkboxes are ticked (default: none).
        focused: index of the field with the keyboard focus, or None.

    Returns:
        The screen.
    """
    texts = [""] * len(spec.fields) if texts is None else list(texts)
    checked = [False] * len(spec.checkboxes) if checked is None else list(checked)
    b = _Builder(size, theme, "form")
    m = b.m
    b.decor("fill", (0, 0, size, m.bar), "header")
    b.decor("text", (m.margin, 0, size - m.margin, m.bar), "on_header", spec.title, bold=True)
    rows = len(spec.fields) + len(spec.checkboxes) + 1
    spare = max(0, size - m.bar - 2 * m.margin - rows * m.row)
    gap = int(spare * spec.spread / rows)
    y = m.bar + m.margin + gap // 2
    label_w = max(b.width(name) for name in spec.fields) + m.pad
    for i, name in enumerate(spec.fields):
        b.decor("text", (m.margin, y, m.margin + label_w, y + m.row), "text", name)
        b.element("field", name, (m.margin + label_w, y + 1, size - m.margin, y + m.row - 1), text=texts[i],
                  focused=focused == i)  # fmt: skip
        y += m.row + gap
    for i, name in enumerate(spec.checkboxes):
        right = min(size - m.margin, m.margin + (m.row - 4) + m.pad + b.width(name) + 2)
        b.element("checkbox", name, (m.margin, y + 1, right, y + m.row - 1), checked=checked[i])
        y += m.row + gap
    widths = [b.width(name) + 2 * m.pad for name in spec.buttons]
    total = sum(widths) + m.margin * (len(widths) - 1)
    x = {"left": m.margin, "center": (size - total) // 2, "right": size - m.margin - total}[spec.align]
    for name, w in zip(spec.buttons, widths):
        b.element("button", name, (x, y + 1, x + w, y + m.row - 1), primary=name == spec.submit)
        x += w + m.margin
    return b.build()


# --------------------------------------------------------------------------------------------------------------------
# toolbar + list
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolbarSpec:
    """A menu bar (menus on the left, icons on the right) over a list that may be longer than what fits."""

    menus: tuple[str, ...]  # menu headers, left to right
    menu_items: tuple[tuple[str, ...], ...]  # the items of each menu, top to bottom
    icons: tuple[str, ...]  # toolbar icons, left to right
    items: tuple[str, ...]  # the list, top to bottom


def visible_rows(size: int) -> int:
    """How many list items a toolbar screen shows at once."""
    m = metrics(size)
    return (size - m.bar - m.margin) // m.row


def sample_toolbar(
    rng: np.random.Generator, size: int, min_items: int = 3, max_items: int | None = None
) -> ToolbarSpec:
    """A random toolbar screen: 2-3 menus of 3-4 items, 0-3 icons (what fits the bar), `min_items`-`max_items` items.

    Args:
        rng: the source of randomness.
        size: screen side in pixels.
        min_items: fewest list items.
        max_items: most list items (default: twice what fits on screen, at most `len(LIST_ITEMS)`).

    Returns:
        The spec.
    """
    m = metrics(size)
    menus = list(_pick(rng, MENU_NAMES, int(rng.integers(2, 4))))
    icons = list(_pick(rng, ICONS, int(rng.integers(0, 4))))
    side = m.bar - 4

    def bar_width() -> int:
        return sum(text_width(h, m.font) + 2 * m.pad + 2 for h in menus) + len(icons) * (side + 2) + m.margin

    while bar_width() > size - 2 * m.margin:
        (icons if icons else menus).pop()  # icons go first; the bar always fits two menus
    counts = [int(c) for c in rng.integers(3, 5, size=len(menus))]
    pool = _pick(rng, MENU_ITEMS, sum(counts))
    menu_items, start = [], 0
    for count in counts:
        menu_items.append(pool[start : start + count])
        start += count
    top = min(len(LIST_ITEMS), max_items or 2 * visible_rows(size))
    return ToolbarSpec(
        menus=tuple(menus),
        menu_items=tuple(menu_items),
        icons=tuple(icons),
        items=_pick(rng, LIST_ITEMS, int(rng.integers(min(min_items, top), top + 1))),
    )


def toolbar_screen(
    size: int, theme: Theme, spec: ToolbarSpec, open_menu: int | None = None, offset: int = 0
) -> Screen:
    """Lay out a toolbar screen.

    Args:
        size: screen side in pixels.
        theme: the palette.
        spec: the content.
        open_menu: index of the menu that is open (its items drop down over the list), or None.
        offset: index of the first list item shown (the list's scroll position).

    Returns:
        The screen. List items under an open menu are drawn but not clickable.
    """
    b = _Builder(size, theme, "toolbar")
    m = b.m
    b.decor("fill", (0, 0, size, m.bar), "header")
    headers = []
    x = m.margin
    for i, name in enumerate(spec.menus):
        w = b.width(name) + 2 * m.pad
        headers.append(b.element("menu", name, (x, 2, x + w, m.bar - 2), open=open_menu == i))
        x += w + 2
    side = m.bar - 4
    x = size - m.margin - len(spec.icons) * (side + 2) + 2
    for name in spec.icons:
        b.element("icon", name, (x, 2, x + side, 2 + side))
        x += side + 2

    shown = visible_rows(size)
    top = m.bar + m.margin // 2
    scrolls = len(spec.items) > shown
    right = size - m.margin
    if scrolls:
        track_w = max(3, m.margin - 1)
        track = (size - m.margin - track_w, top, size - m.margin, top + shown * m.row)
        b.decor("bar", track, "filler")
        span = track[3] - track[1]
        thumb_h = max(4, span * shown // len(spec.items))
        thumb_y = track[1] + (span - thumb_h) * offset // max(1, len(spec.items) - shown)
        b.decor("bar", (track[0], thumb_y, track[2], thumb_y + thumb_h), "muted")
        right = track[0] - 2
    rows = []
    for r, name in enumerate(spec.items[offset : offset + shown]):
        y = top + r * m.row
        rows.append(b.element("item", name, (m.margin, y, right, y + m.row - 1)))
        b.decor("divider", (m.margin, y + m.row - 1, right, y + m.row), "filler")

    if open_menu is not None:
        header, entries = headers[open_menu], spec.menu_items[open_menu]
        w = max(b.width(e) for e in entries) + 2 * m.pad + 2
        x1 = min(header.box[0], size - m.margin - w - 2)
        y1 = m.bar + 1
        panel = (x1, y1, x1 + w, y1 + len(entries) * m.row + 2)
        b.decor("shadow", (panel[0] + 2, panel[1] + 2, panel[2] + 2, panel[3] + 2), "shadow")
        b.decor("panel", panel, "surface")
        for k, name in enumerate(entries):
            y = y1 + 1 + k * m.row
            b.element("menu_item", name, (x1 + 1, y, x1 + w - 1, y + m.row - 1))
        covered = (panel[0], panel[1], panel[2] + 2, panel[3] + 2)
        b.hidden += [row for row in rows if _overlap(row.box, covered)]
    return b.build()


def _overlap(a: Box, c: Box) -> bool:
    """Whether two boxes share a pixel, edges included (the rule clicks are tested with)."""
    return a[0] <= c[2] and c[0] <= a[2] and a[1] <= c[3] and c[1] <= a[3]


# --------------------------------------------------------------------------------------------------------------------
# dialog over a page
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DialogSpec:
    """A modal dialog over a dimmed page (the page is decor: only the dialog can be clicked)."""

    page_title: str
    filler: tuple[float, ...]  # widths (shares of the page width) of the page's skeleton lines
    title: str
    message: str
    checkbox: str | None
    buttons: tuple[str, ...]  # left to right; the last one is the primary
    close: bool  # a close icon in the dialog's corner


def sample_dialog(rng: np.random.Generator, size: int) -> DialogSpec:
    """A random dialog that fits a `size` px screen: 2-3 buttons (what fits), maybe a checkbox and a close icon.

    A dialog whose second button does not fit gets the close icon, so there are always two elements or more.
    """
    m = metrics(size)
    inner = size - 2 * _dialog_inset(size) - 2 * m.pad
    buttons = list(_pick(rng, DIALOG_BUTTONS, int(rng.integers(2, 4))))
    while (
        len(buttons) > 1 and sum(text_width(t, m.font) + 2 * m.pad for t in buttons) + m.margin * len(buttons) > inner
    ):
        buttons.pop()
    close = bool(rng.random() < 0.5) or len(buttons) == 1  # at least two things to click
    return DialogSpec(
        page_title=PAGE_TITLES[int(rng.integers(len(PAGE_TITLES)))],
        filler=_fillers(rng, (size - m.bar) // m.row),
        title=DIALOG_TITLES[int(rng.integers(len(DIALOG_TITLES)))],
        message=DIALOG_MESSAGES[int(rng.integers(len(DIALOG_MESSAGES)))],
        checkbox=DIALOG_CHECKBOXES[int(rng.integers(len(DIALOG_CHECKBOXES)))] if rng.random() < 0.5 else None,
        buttons=tuple(buttons),
        close=close,
    )


def _dialog_inset(size: int) -> int:
    return round(size * 0.07)


def dialog_screen(size: int, theme: Theme, spec: DialogSpec, checked: bool = False) -> Screen:
    """Lay out a dialog over a dimmed page.

    Args:
        size: screen side in pixels.
        theme: the palette.
        spec: the content.
        checked: whether the dialog's checkbox (if any) is ticked.

    Returns:
        The screen.
    """
    b = _Builder(size, theme, "dialog")
    m = b.m
    b.decor("fill", (0, 0, size, m.bar), "header")
    b.decor("text", (m.margin, 0, size - m.margin, m.bar), "on_header", spec.page_title, bold=True)
    for r, share in enumerate(spec.filler):
        y = m.bar + m.margin + r * m.row + m.row // 3
        b.decor("bar", (m.margin, y, m.margin + max(4, int(share * (size - 2 * m.margin))), y + m.row // 3), "filler")
    b.decor("dim", (0, 0, size, size))  # the page under a modal dialog is darkened

    inset = _dialog_inset(size)
    rows = 3 + (spec.checkbox is not None)
    height = rows * m.row + 2 * m.pad
    x1, y1 = inset, (size - height) // 2
    x2, y2 = size - inset, y1 + height
    b.decor("shadow", (x1 + 2, y1 + 2, x2 + 2, y2 + 2), "shadow")
    b.decor("panel", (x1, y1, x2, y2), "surface")
    y = y1 + m.pad
    side = m.row - 4
    title_right = x2 - m.pad - (side + 2 if spec.close else 0)
    b.decor("text", (x1 + m.pad, y, title_right, y + m.row), "text", spec.title, bold=True)
    if spec.close:
        b.element("icon", "close", (x2 - m.pad - side, y + 2, x2 - m.pad, y + 2 + side))
    y += m.row
    b.decor("text", (x1 + m.pad, y, x2 - m.pad, y + m.row), "muted", spec.message)
    y += m.row
    if spec.checkbox is not None:
        right = min(x2 - m.pad, x1 + m.pad + side + m.pad + b.width(spec.checkbox) + 2)
        b.element("checkbox", spec.checkbox, (x1 + m.pad, y + 1, right, y + m.row - 1), checked=checked)
        y += m.row
    x = x2 - m.pad
    boxes = []
    for name in reversed(spec.buttons):
        w = b.width(name) + 2 * m.pad
        boxes.append((name, (x - w, y + 1, x, y + m.row - 1)))
        x -= w + m.margin
    for name, box in reversed(boxes):
        b.element("button", name, box, primary=name == spec.buttons[-1])
    return b.build()


# --------------------------------------------------------------------------------------------------------------------
# settings page (also the pages of the navigation task)
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SettingsSpec:
    """A settings page: a tab bar, switch rows, links and an optional button row."""

    tabs: tuple[str, ...]
    switches: tuple[str, ...]
    links: tuple[str, ...]
    buttons: tuple[str, ...]  # left to right, may be empty; the first one is the primary


def fit_tabs(names: Sequence[str], size: int) -> tuple[str, ...]:
    """The longest prefix of `names` (at least two) whose tabs fit side by side on a `size` px tab bar."""
    m = metrics(size)
    kept, used = [], m.margin
    for name in names:
        used += text_width(name, m.font) + 2 * m.pad + 2
        if used > size - m.margin and len(kept) >= 2:
            break
        kept.append(name)
    return tuple(kept)


def settings_rows(size: int) -> int:
    """How many rows fit below the tab bar of a settings page."""
    m = metrics(size)
    return (size - m.bar - 2 * m.margin) // m.row


def sample_settings(rng: np.random.Generator, size: int) -> SettingsSpec:
    """A random settings page that fits a `size` px screen: 2-4 tabs, 1-3 switches, 1-2 links, 0-2 buttons."""
    rows = settings_rows(size)
    n_buttons = int(rng.integers(0, 3))
    n_links = min(int(rng.integers(1, 3)), rows - 1 - (n_buttons > 0))
    n_switches = min(int(rng.integers(1, 4)), rows - n_links - (n_buttons > 0))
    buttons: tuple[str, ...] = ()
    if n_buttons:
        buttons = (SETTINGS_BUTTONS[int(rng.integers(2))],)
        if n_buttons > 1:
            buttons += (SETTINGS_RESET[int(rng.integers(2))],)
    return SettingsSpec(
        tabs=fit_tabs(_pick(rng, TAB_NAMES, int(rng.integers(2, 5))), size),
        switches=_pick(rng, SWITCH_LABELS, n_switches),
        links=_pick(rng, LINK_LABELS, n_links),
        buttons=buttons,
    )


def settings_screen(
    size: int, theme: Theme, spec: SettingsSpec, tab: int = 0, on: Sequence[bool] | None = None
) -> Screen:
    """Lay out a settings page.

    Args:
        size: screen side in pixels.
        theme: the palette.
        spec: the content.
        tab: index of the selected tab.
        on: which switches are on (default: none).

    Returns:
        The screen.
    """
    on = [False] * len(spec.switches) if on is None else list(on)
    b = _Builder(size, theme, "settings")
    m = b.m
    b.decor("fill", (0, 0, size, m.bar), "header")
    x = m.margin
    for i, name in enumerate(spec.tabs):
        w = b.width(name) + 2 * m.pad
        b.element("tab", name, (x, 2, x + w, m.bar), selected=i == tab)
        x += w + 2
    y = m.bar + m.margin
    for i, name in enumerate(spec.switches):
        b.element("switch", name, (m.margin, y + 1, size - m.margin, y + m.row - 1), checked=on[i])
        y += m.row
    for name in spec.links:
        b.element("link", name, (m.margin, y + 2, m.margin + b.width(name) + 4, y + m.row - 2))
        y += m.row
    x = m.margin
    for name in spec.buttons:
        w = b.width(name) + 2 * m.pad
        b.element("button", name, (x, y + 1, x + w, y + m.row - 1), primary=name == spec.buttons[0])
        x += w + m.margin
    return b.build()


def detail_screen(size: int, theme: Theme, title: str, filler: Sequence[float]) -> Screen:
    """A page with only a title bar and skeleton text: the sub-pages of the navigation task (nothing to click).

    Args:
        size: screen side in pixels.
        theme: the palette.
        title: the page's title.
        filler: widths (shares of the page width) of the skeleton lines; those that do not fit are left out.

    Returns:
        The screen.
    """
    b = _Builder(size, theme, "detail")
    m = b.m
    b.decor("fill", (0, 0, size, m.bar), "header")
    b.decor("text", (m.margin, 0, size - m.margin, m.bar), "on_header", title, bold=True)
    for r, share in enumerate(filler):
        y = m.bar + m.margin + r * m.row + m.row // 3
        if y + m.row // 3 > size - m.margin:
            break
        b.decor("bar", (m.margin, y, m.margin + max(4, int(share * (size - 2 * m.margin))), y + m.row // 3), "filler")
    return b.build()


# --------------------------------------------------------------------------------------------------------------------
# Random screens (single-step grounding)
# --------------------------------------------------------------------------------------------------------------------


def random_screen(rng: np.random.Generator, size: int, layout: str, theme: Theme) -> Screen:
    """A random screen of `layout` in a random state (typed text, ticks, focus, an open menu, scroll, tab).

    Args:
        rng: the source of randomness; the screen depends on nothing else.
        size: screen side in pixels, at least `MIN_SIZE`.
        layout: one of `LAYOUTS`.
        theme: the palette.

    Returns:
        The screen.
    """
    if layout == "form":
        spec = sample_form(rng, size)
        texts = [WORDS[int(rng.integers(len(WORDS)))] if rng.random() < 0.4 else "" for _ in spec.fields]
        checked = [bool(rng.random() < 0.5) for _ in spec.checkboxes]
        focused = int(rng.integers(len(spec.fields))) if rng.random() < 0.3 else None
        return form_screen(size, theme, spec, texts, checked, focused)
    if layout == "toolbar":
        spec = sample_toolbar(rng, size)
        offset = int(rng.integers(0, max(0, len(spec.items) - visible_rows(size)) + 1))
        open_menu = int(rng.integers(len(spec.menus))) if rng.random() < 0.5 else None
        return toolbar_screen(size, theme, spec, open_menu, offset)
    if layout == "dialog":
        return dialog_screen(size, theme, sample_dialog(rng, size), checked=bool(rng.random() < 0.5))
    if layout == "settings":
        spec = sample_settings(rng, size)
        on = [bool(rng.random() < 0.5) for _ in spec.switches]
        return settings_screen(size, theme, spec, int(rng.integers(len(spec.tabs))), on)
    raise ValueError(f"unknown layout {layout!r}; valid: {', '.join(LAYOUTS)}")


# --------------------------------------------------------------------------------------------------------------------
# Drawing
# --------------------------------------------------------------------------------------------------------------------


def draw(screen: Screen, size: int | None = None) -> np.ndarray:
    """Draw a screen.

    Args:
        screen: what to draw.
        size: side of the picture; default `screen.size`, where every pixel box of the screen is exact. Another size
            draws everything scaled by `size / screen.size` (text re-rendered at the scaled size, not resampled):
            a sharp preview for people, whose pixels the boxes no longer address.

    Returns:
        `[H, W, 3]` uint8 with H = W = `size`.
    """
    size = screen.size if size is None else int(size)
    if size < 1:
        raise ValueError(f"size must be positive, got {size}")
    scale = size / screen.size
    base = metrics(screen.size)
    painter = _Painter(screen.theme, scale, max(1, round(base.font * scale)), base.pad * scale, base.bar)
    image = Image.new("RGB", (size, size), screen.theme.background)
    canvas = ImageDraw.Draw(image)
    for item in screen.items:
        if isinstance(item, Decor) and item.kind == "dim":
            # Darken everything drawn so far, as a modal dialog's veil does.
            image = Image.blend(image, Image.new("RGB", image.size, (0, 0, 0)), 0.45)
            canvas = ImageDraw.Draw(image)
        elif isinstance(item, Decor):
            painter.decor(canvas, item)
        else:
            painter.element(canvas, item)
    return np.asarray(image).copy()


class _Painter:
    """Draws decor and elements at a scale, in a theme's colours."""

    def __init__(self, theme: Theme, scale: float, px: int, pad: float, bar: int):
        self.theme, self.scale, self.px, self.pad = theme, scale, px, pad
        self.bar = bar  # height of the header bar in screen pixels: icons there are drawn in header colours

    def box(self, box: Box) -> tuple[int, int, int, int]:
        """The box in drawing pixels, as PIL's inclusive corners."""
        x1, y1, x2, y2 = (round(v * self.scale) for v in box)
        return x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)

    def colour(self, role: str) -> RGB:
        return getattr(self.theme, role)

    def text(self, canvas, box, text: str, fill: RGB, *, bold=False, align="left", pad=0.0, clip=False) -> None:
        """Draw `text` in `box` (inclusive corners), vertically centred, cut with an ellipsis where it is too wide.

        Typed text is untrusted: it is drawn on one line, and `clip` keeps glyphs that stack or overhang (combining
        marks, tall scripts) inside the box.
        """
        face = font(self.px, bold)
        x1, y1, x2, y2 = box
        text = " ".join(text.split())  # one line: typed text may hold newlines and tabs
        room = x2 - x1 + 1 - 2 * pad
        if face.getlength(text) > room:
            # No visible glyph is under 2 px wide, so cutting first keeps the ellipsis loop short on huge inputs.
            text = text[: max(0, int(room)) // 2 + 1]
            while text and face.getlength(text + "…") > room:
                text = text[:-1]
            text = text + "…" if text else ""
        _, top, _, bottom = face.getbbox("Hg")
        y = (y1 + y2 + 1) / 2 - (top + bottom) / 2
        x = x1 + pad if align == "left" else (x1 + x2 + 1 - face.getlength(text)) / 2
        if not clip:
            canvas.text((round(x), round(y)), text, fill=fill, font=face)
            return
        layer = Image.new("L", (x2 - x1 + 1, y2 - y1 + 1), 0)  # a mask the size of the box: nothing spills out
        ImageDraw.Draw(layer).text((round(x) - x1, round(y) - y1), text, fill=255, font=face)
        canvas.bitmap((x1, y1), layer, fill=fill)

    def decor(self, canvas: ImageDraw.ImageDraw, item: Decor) -> None:
        box = self.box(item.box)
        fill = self.colour(item.role)
        radius = max(1, round(3 * self.scale))
        if item.kind == "fill":
            canvas.rectangle(box, fill=fill)
        elif item.kind == "bar":
            canvas.rounded_rectangle(box, radius=min(box[2] - box[0], box[3] - box[1]) // 2, fill=fill)
        elif item.kind in ("panel", "shadow"):
            outline = self.theme.border if item.kind == "panel" else None
            canvas.rounded_rectangle(box, radius=radius, fill=fill, outline=outline)
        elif item.kind == "divider":
            canvas.line((box[0], box[1], box[2], box[1]), fill=fill)
        elif item.kind == "text":
            self.text(canvas, box, item.text, fill, bold=item.bold)
        else:
            raise ValueError(f"unknown decor kind {item.kind!r}")

    def element(self, canvas: ImageDraw.ImageDraw, e: Element) -> None:
        t = self.theme
        box = self.box(e.box)
        x1, y1, x2, y2 = box
        h = y2 - y1 + 1
        radius = max(1, round(3 * self.scale))
        line = max(1, round(self.scale))
        if e.kind == "button":
            if e.primary:
                canvas.rounded_rectangle(box, radius=radius, fill=t.primary)
                self.text(canvas, box, e.label, t.on_primary, align="center")
            else:
                canvas.rounded_rectangle(box, radius=radius, fill=t.surface, outline=t.border, width=line)
                self.text(canvas, box, e.label, t.text, align="center")
        elif e.kind == "field":
            ring = t.accent if e.focused else t.border
            canvas.rectangle(box, fill=t.field, outline=ring, width=2 * line if e.focused else line)
            inner = (x1 + line, y1 + line, x2 - line, y2 - line)  # inside the outline
            self.text(canvas, inner, e.text, t.text, pad=self.pad * 0.6 - line, clip=True)
            if e.focused:  # the caret, after the text
                x = x1 + self.pad * 0.6 + font(self.px).getlength(" ".join(e.text.split())) + line
                if x < x2 - 2 * line:
                    canvas.line((round(x), y1 + 3 * line, round(x), y2 - 3 * line), fill=t.text, width=line)
        elif e.kind == "checkbox":
            side = h - 2 * line
            square = (x1, y1 + line, x1 + side - 1, y1 + line + side - 1)
            if e.checked:
                canvas.rectangle(square, fill=t.accent)
                s = side
                tick = [(x1 + 0.2 * s, y1 + line + 0.5 * s), (x1 + 0.42 * s, y1 + line + 0.74 * s),
                        (x1 + 0.8 * s, y1 + line + 0.26 * s)]  # fmt: skip
                canvas.line(tick, fill=t.on_primary, width=max(1, round(s / 7)))
            else:
                canvas.rectangle(square, fill=t.field, outline=t.muted, width=line)
            self.text(canvas, (x1 + side, y1, x2, y2), e.label, t.text, pad=self.pad * 0.6)
        elif e.kind == "switch":
            pill_w = round(h * 1.7)
            pill = (x2 - pill_w + 1, y1 + h // 6, x2, y2 - h // 6)
            canvas.rounded_rectangle(pill, radius=(pill[3] - pill[1]) // 2, fill=t.accent if e.checked else t.border)
            knob = pill[3] - pill[1] - 2 * line
            kx = pill[2] - line - knob if e.checked else pill[0] + line
            canvas.ellipse((kx, pill[1] + line, kx + knob, pill[1] + line + knob), fill=t.surface)
            self.text(canvas, (x1, y1, pill[0] - 2, y2), e.label, t.text)
        elif e.kind == "item":
            self.text(canvas, box, e.label, t.text, pad=self.pad)
        elif e.kind == "menu":
            if e.open:
                canvas.rounded_rectangle(box, radius=radius, fill=t.surface)
            self.text(canvas, box, e.label, t.text if e.open else t.on_header, align="center")
        elif e.kind == "menu_item":
            self.text(canvas, box, e.label, t.text, pad=self.pad)
        elif e.kind == "tab":
            if e.selected:
                canvas.rectangle(box, fill=t.background)
                canvas.rectangle((x1, y2 - 2 * line + 1, x2, y2), fill=t.accent)
                self.text(canvas, (x1, y1, x2, y2 - 2 * line), e.label, t.text, bold=True, align="center")
            else:
                self.text(canvas, (x1, y1, x2, y2 - 2 * line), e.label, t.on_header, align="center")
        elif e.kind == "link":
            self.text(canvas, box, e.label, t.accent, pad=2 * line)
            face = font(self.px)
            width = min(x2 - x1 - 2 * line, round(face.getlength(e.label)))
            canvas.line((x1 + 2 * line, y2, x1 + 2 * line + width, y2), fill=t.accent, width=line)
        elif e.kind == "icon":
            on_bar = e.box[3] <= self.bar
            _icon(canvas, e.label, box, t.on_header if on_bar else t.text, t.header if on_bar else t.surface, line)
        else:
            raise ValueError(f"unknown element kind {e.kind!r}")


def _icon(canvas: ImageDraw.ImageDraw, name: str, box: tuple[int, int, int, int], colour: RGB, under: RGB, line: int):
    """A glyph in `colour` filling `box` (inclusive corners) on a ground of colour `under` (for its holes).

    Each glyph is a plain shape that stays recognisable at 12 px.
    """
    x1, y1, x2, y2 = box
    s = min(x2 - x1, y2 - y1)
    w = max(line, round(s / 7))
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2

    def p(u: float, v: float) -> tuple[float, float]:  # a point in the glyph's unit square
        return x1 + u * s, y1 + v * s

    if name == "search":
        canvas.ellipse((*p(0.1, 0.1), *p(0.62, 0.62)), outline=colour, width=w)
        canvas.line((*p(0.55, 0.55), *p(0.92, 0.92)), fill=colour, width=w + 1)
    elif name == "gear":
        for k in range(8):  # teeth
            a = k * math.pi / 4
            canvas.line((cx + 0.2 * s * math.cos(a), cy + 0.2 * s * math.sin(a),
                         cx + 0.47 * s * math.cos(a), cy + 0.47 * s * math.sin(a)), fill=colour, width=w + 1)  # fmt: skip
        canvas.ellipse((cx - 0.3 * s, cy - 0.3 * s, cx + 0.3 * s, cy + 0.3 * s), fill=colour)
        canvas.ellipse((cx - 0.11 * s, cy - 0.11 * s, cx + 0.11 * s, cy + 0.11 * s), fill=under)
    elif name == "star":
        points = []
        for k in range(10):
            r = 0.48 * s if k % 2 == 0 else 0.2 * s
            a = -math.pi / 2 + k * math.pi / 5
            points.append((cx + r * math.cos(a), cy + 0.05 * s + r * math.sin(a)))
        canvas.polygon(points, fill=colour)
    elif name == "trash":
        canvas.line((*p(0.12, 0.22), *p(0.88, 0.22)), fill=colour, width=w)
        canvas.rectangle((*p(0.38, 0.06), *p(0.62, 0.2)), fill=colour)
        canvas.polygon([p(0.2, 0.3), p(0.8, 0.3), p(0.72, 0.95), p(0.28, 0.95)], fill=colour)
    elif name == "plus":
        canvas.line((*p(0.5, 0.1), *p(0.5, 0.9)), fill=colour, width=w + 1)
        canvas.line((*p(0.1, 0.5), *p(0.9, 0.5)), fill=colour, width=w + 1)
    elif name == "home":
        canvas.polygon([p(0.5, 0.06), p(0.95, 0.5), p(0.05, 0.5)], fill=colour)
        canvas.rectangle((*p(0.18, 0.48), *p(0.82, 0.94)), fill=colour)
        canvas.rectangle((*p(0.42, 0.64), *p(0.58, 0.94)), fill=under)
    elif name == "heart":
        canvas.ellipse((*p(0.06, 0.12), *p(0.52, 0.58)), fill=colour)
        canvas.ellipse((*p(0.48, 0.12), *p(0.94, 0.58)), fill=colour)
        canvas.polygon([p(0.08, 0.42), p(0.92, 0.42), p(0.5, 0.94)], fill=colour)
    elif name == "close":
        canvas.line((*p(0.15, 0.15), *p(0.85, 0.85)), fill=colour, width=w + 1)
        canvas.line((*p(0.15, 0.85), *p(0.85, 0.15)), fill=colour, width=w + 1)
    else:
        raise ValueError(f"unknown icon {name!r}; valid: {', '.join(ICONS)}")
