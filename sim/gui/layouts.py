"""The four screen layouts of `sim.gui` (form, toolbar + list, dialog over a page, settings) and `random_screen`.

Each layout has a `*Spec` (the content: labels, counts, alignment), a `sample_*` function that draws a spec from a
numpy `Generator`, and a `*_screen` function that lays the spec out for a state (`sim.gui.screen` describes screens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.gui.screen import (
    CHECKBOX_LABELS,
    DIALOG_BUTTONS,
    DIALOG_CHECKBOXES,
    DIALOG_MESSAGES,
    DIALOG_TITLES,
    FIELD_LABELS,
    FORM_TITLES,
    ICONS,
    LAYOUTS,
    LINK_LABELS,
    LIST_ITEMS,
    MENU_ITEMS,
    MENU_NAMES,
    PAGE_TITLES,
    RESET_BUTTONS,
    SETTINGS_BUTTONS,
    SETTINGS_RESET,
    SUBMIT_BUTTONS,
    SWITCH_LABELS,
    TAB_NAMES,
    WORDS,
    Box,
    Builder,
    Screen,
    Theme,
    fillers,
    metrics,
    pick_words,
    text_width,
)

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
        fields=pick_words(rng, FIELD_LABELS, n_fields),
        checkboxes=pick_words(rng, CHECKBOX_LABELS, n_checks),
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
    b = Builder(size, theme, "form")
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
    menus = list(pick_words(rng, MENU_NAMES, int(rng.integers(2, 4))))
    icons = list(pick_words(rng, ICONS, int(rng.integers(0, 4))))
    side = m.bar - 4

    def bar_width() -> int:
        return sum(text_width(h, m.font) + 2 * m.pad + 2 for h in menus) + len(icons) * (side + 2) + m.margin

    while bar_width() > size - 2 * m.margin:
        (icons if icons else menus).pop()  # icons go first; the bar always fits two menus
    counts = [int(c) for c in rng.integers(3, 5, size=len(menus))]
    pool = pick_words(rng, MENU_ITEMS, sum(counts))
    menu_items, start = [], 0
    for count in counts:
        menu_items.append(pool[start : start + count])
        start += count
    top = min(len(LIST_ITEMS), max_items or 2 * visible_rows(size))
    return ToolbarSpec(
        menus=tuple(menus),
        menu_items=tuple(menu_items),
        icons=tuple(icons),
        items=pick_words(rng, LIST_ITEMS, int(rng.integers(min(min_items, top), top + 1))),
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
    b = Builder(size, theme, "toolbar")
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
    buttons = list(pick_words(rng, DIALOG_BUTTONS, int(rng.integers(2, 4))))
    while (
        len(buttons) > 1 and sum(text_width(t, m.font) + 2 * m.pad for t in buttons) + m.margin * len(buttons) > inner
    ):
        buttons.pop()
    close = bool(rng.random() < 0.5) or len(buttons) == 1  # at least two things to click
    return DialogSpec(
        page_title=PAGE_TITLES[int(rng.integers(len(PAGE_TITLES)))],
        filler=fillers(rng, (size - m.bar) // m.row),
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
    b = Builder(size, theme, "dialog")
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
        tabs=fit_tabs(pick_words(rng, TAB_NAMES, int(rng.integers(2, 5))), size),
        switches=pick_words(rng, SWITCH_LABELS, n_switches),
        links=pick_words(rng, LINK_LABELS, n_links),
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
    b = Builder(size, theme, "settings")
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
    b = Builder(size, theme, "detail")
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
