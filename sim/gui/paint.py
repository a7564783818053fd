"""Drawing a `sim.gui.screen.Screen` with PIL: `draw(screen)` -> `[H, W, 3]` uint8, widgets, text and icons."""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw

from sim.gui.screen import (
    ICONS,
    RGB,
    Box,
    Decor,
    Element,
    Screen,
    Theme,
    font,
    metrics,
)

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
