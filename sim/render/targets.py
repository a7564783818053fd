"""Procedural targets for the rendering envs: an SVG scene, a matplotlib chart or a build123d part, from a seed.

Each generator returns a `Target`: the short source that draws the target (what the scripted expert writes) as a
`Program`, a source with its numbers kept as `Slot`s so that a sloppy demonstrator can perturb them, and, for charts,
the words the chart shows (the OCR reference). Everything depends on the seed and the complexity only; nothing here
renders (the envs render through the sandbox, so a perfect answer reproduces the target's pixels exactly).

The sources are kept as short as the renderers allow, because a tiny model with a 2048-token BPE tokenizer
(`assets/tokenizer`) learns to write them. Typical lengths in those tokens (mean over seeds, by complexity):

* SVG: 85 at complexity 1, e.g. `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64"><rect x="10" y="12"
  width="30" height="20" fill="#d21e1e"/></svg>` (87 tokens); 125 at 2; then about 55 more per element (a
  gradient costs about 60 by itself);
* chart: 58 at complexity 1, e.g. `import matplotlib.pyplot as plt` / `plt.bar(["Mon","Tue","Wed"],[3,5,2],
  color="#d21e1e")`; 73 at 2, 95 at 3, 150 at 4;
* CAD: 27 at complexity 1, e.g. `from build123d import *` / `result = Box(40, 30, 12)`; 54, 82, 109 and 130 at
  complexity 2 to 5.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

SVG_CANVAS = 64
"""Side of the SVG viewBox, in user units; the renderer scales it to the image size, so sources do not depend on it."""

SVG_MAX_COMPLEXITY = 12
CHART_MAX_COMPLEXITY = 4
CAD_MAX_COMPLEXITY = 5

PALETTE = (
    (210, 30, 30),  # red
    (30, 80, 210),  # blue
    (30, 160, 60),  # green
    (230, 190, 10),  # yellow
    (140, 40, 180),  # purple
    (240, 120, 20),  # orange
    (20, 170, 190),  # cyan
    (40, 40, 40),  # near black
)
"""Saturated, well separated fill colours: every one differs clearly from the white background and the others."""

SVG_WORDS = ("cat", "sun", "map", "box", "red", "go", "hi", "ok", "sky", "art")
"""Short words for `<text>` elements (one or two BPE tokens each)."""

CHART_CATEGORIES = (
    ("Day", ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat")),
    ("Month", ("Jan", "Feb", "Mar", "Apr", "May", "Jun")),
    ("Region", ("north", "south", "east", "west", "centre", "coast")),
    ("Fruit", ("apple", "pear", "plum", "fig", "lime", "kiwi")),
)
"""(x-axis label, categories): short words that OCR reads reliably at about 11 px."""

CHART_TITLES = ("Sales", "Rainfall", "Visitors", "Profit", "Traffic", "Scores", "Budget", "Energy")
CHART_Y_LABELS = ("Units", "Count", "Value", "Total", "Amount")
CHART_SCATTER_X_LABELS = ("Hour", "Size", "Age", "Speed")
CHART_LEGENDS = (("old", "new"), ("plan", "real"), ("low", "high"), ("home", "away"))
CHART_KINDS = ("bar", "line", "scatter", "pie")

CAD_FAMILIES = ("box", "plate", "stepped", "bracket")
"""Part families from complexity 2 on: a box with through holes, a plate with rounded corners (and holes), a
stepped cylinder (with an axial bore at complexity 5), an L-bracket (with holes in its base)."""


# ====================================================================================================== PROGRAMS


@dataclass(frozen=True)
class Slot:
    """One number of a program: its value, how far noise may move it, where it is clamped, how it is written."""

    value: float
    scale: float  # Gaussian noise std per unit of `noise`
    low: float
    high: float
    fmt: Literal["int", "hex"] = "int"  # "int": rounded decimal; "hex": two hex digits (a colour channel)

    def text(self, value: float) -> str:
        value = min(max(value, self.low), self.high)
        return f"{round(value):02x}" if self.fmt == "hex" else str(round(value))


@dataclass(frozen=True)
class Program:
    """A source with numbered holes: `parts` are literal strings and indices into `slots`."""

    parts: tuple[str | int, ...]
    slots: tuple[Slot, ...]

    def source(self, noise: float = 0.0, generator: torch.Generator | None = None) -> str:
        """The source, its numbers moved by Gaussian noise of std `noise * slot.scale` (rounded, clamped).

        Args:
            noise: relative noise level; 0 writes the exact numbers and draws nothing from `generator`.
            generator: where the noise comes from (the global torch generator when None).

        Returns:
            The source code.
        """
        values = [s.value for s in self.slots]
        if noise > 0 and self.slots:
            z = torch.randn(len(self.slots), generator=generator, dtype=torch.float64).tolist()
            values = [v + noise * s.scale * dz for v, s, dz in zip(values, self.slots, z)]
        return "".join(p if isinstance(p, str) else self.slots[p].text(values[p]) for p in self.parts)


class Builder:
    """Assembles a `Program`: `emit(template, *slots)` fills the `{}`s of a template with slots, in order."""

    def __init__(self) -> None:
        self.parts: list[str | int] = []
        self.slots: list[Slot] = []

    def emit(self, template: str, *slots: Slot) -> None:
        pieces = template.split("{}")
        if len(pieces) != len(slots) + 1:
            raise ValueError(f"template has {len(pieces) - 1} holes for {len(slots)} slots: {template!r}")
        for k, piece in enumerate(pieces):
            if piece:
                self.parts.append(piece)
            if k < len(slots):
                self.parts.append(len(self.slots))
                self.slots.append(slots[k])

    def program(self) -> Program:
        return Program(tuple(self.parts), tuple(self.slots))


def _colour(rgb: Sequence[int]) -> tuple[Slot, Slot, Slot]:
    """The three channel slots of a `#rrggbb` colour (noise in units of 255)."""
    r, g, b = (Slot(float(c), 255.0, 0.0, 255.0, "hex") for c in rgb)
    return r, g, b


@dataclass(frozen=True)
class Target:
    """What a world asks the policy to reproduce.

    Attributes:
        program: the expert's source with its numbers as slots; `program.source()` draws the target exactly.
        description: what was drawn, for logs and tests, e.g. `"rect+circle"`, `"bar chart"`, `"plate"`.
        text: the words the target shows (chart: title, axis and category labels, legend), "" elsewhere.
    """

    program: Program
    description: str
    text: str = ""

    @property
    def source(self) -> str:
        """The exact source that draws the target."""
        return self.program.source()


def _rng(seed: int) -> np.random.Generator:
    # Any int, negative ones included, maps to a valid seed.
    return np.random.default_rng(int(seed) % (1 << 64))


def _check_complexity(complexity: int, most: int, what: str) -> None:
    if isinstance(complexity, bool) or not isinstance(complexity, int) or not 1 <= complexity <= most:
        raise ValueError(f"complexity must be an int in [1, {most}] for {what} targets, got {complexity!r}")


# =========================================================================================================== SVG

_SVG_HEAD = f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {SVG_CANVAS} {SVG_CANVAS}">'


def _xy(value: int) -> Slot:
    """A coordinate or size on the SVG canvas: noise in canvas units."""
    return Slot(float(value), float(SVG_CANVAS), 0.0, float(SVG_CANVAS))


def _size(value: int) -> Slot:
    return Slot(float(value), float(SVG_CANVAS), 1.0, float(SVG_CANVAS))


def svg_target(seed: int, complexity: int = 1) -> Target:
    """A scene of `complexity` SVG elements on a white 64 x 64 canvas.

    Kinds: rect, circle, ellipse and triangle (`<polygon>`) always; from complexity 2 also a curved `<path>` and a
    short `<text>` in DejaVu Sans; from complexity 3 a shape may be filled with a two-stop `<linearGradient>`.
    Positions and sizes are integers that keep every element inside the canvas; later elements may cover earlier
    ones. Noise (expert demonstrations) is in canvas units for coordinates and sizes, in 0-255 for colours.

    Args:
        seed: the world's seed.
        complexity: number of elements, in [1, SVG_MAX_COMPLEXITY].

    Returns:
        The target; its source is one line of SVG.
    """
    _check_complexity(complexity, SVG_MAX_COMPLEXITY, "svg")
    rng = _rng(seed)
    kinds = ["rect", "circle", "ellipse", "polygon"]
    if complexity >= 2:
        kinds += ["path", "text"]
    b = Builder()
    b.emit(_SVG_HEAD)
    drawn = []
    for index in range(complexity):
        kind = kinds[int(rng.integers(len(kinds)))]
        fill = _fill(rng, b, index, gradient=complexity >= 3 and kind != "text" and rng.random() < 0.3)
        if kind == "rect":
            w, h = (int(v) for v in rng.integers(8, 41, size=2))
            x, y = int(rng.integers(2, 63 - w)), int(rng.integers(2, 63 - h))
            b.emit('<rect x="{}" y="{}" width="{}" height="{}" fill="', _xy(x), _xy(y), _size(w), _size(h))
        elif kind == "circle":
            r = int(rng.integers(5, 21))
            cx, cy = (int(v) for v in rng.integers(r + 2, 63 - r, size=2))
            b.emit('<circle cx="{}" cy="{}" r="{}" fill="', _xy(cx), _xy(cy), _size(r))
        elif kind == "ellipse":
            while True:
                rx, ry = int(rng.integers(6, 27)), int(rng.integers(4, 21))
                if abs(rx - ry) >= 4:  # visibly not a circle
                    break
            cx, cy = int(rng.integers(rx + 2, 63 - rx)), int(rng.integers(ry + 2, 63 - ry))
            b.emit('<ellipse cx="{}" cy="{}" rx="{}" ry="{}" fill="', _xy(cx), _xy(cy), _size(rx), _size(ry))
        elif kind == "polygon":
            while True:
                p = rng.integers(2, 63, size=(3, 2))
                twice_area = abs((p[1, 0] - p[0, 0]) * (p[2, 1] - p[0, 1]) - (p[2, 0] - p[0, 0]) * (p[1, 1] - p[0, 1]))
                if twice_area >= 300:  # no slivers: at least 150 square units
                    break
            b.emit('<polygon points="{},{} {},{} {},{}" fill="', *(_xy(int(v)) for v in p.flatten()))
        elif kind == "path":  # a dome: a base line closed by a quadratic curve through a peak above it
            w = int(rng.integers(16, 49))
            x1 = int(rng.integers(2, 63 - w))
            y = int(rng.integers(22, 63))
            peak = int(rng.integers(2, y - 9))
            control = 2 * peak - y  # the curve's apex (t = 1/2) is the mean of base and control point
            cx = x1 + w // 2 + int(rng.integers(-4, 5))
            cy = Slot(float(control), float(SVG_CANVAS), -float(SVG_CANVAS), float(SVG_CANVAS))
            b.emit('<path d="M{} {}Q{} {} {} {}Z" fill="', _xy(x1), _xy(y), _xy(cx), cy, _xy(x1 + w), _xy(y))
        else:  # text
            word = SVG_WORDS[int(rng.integers(len(SVG_WORDS)))]
            size = int(rng.integers(10, 19))
            width = int(0.65 * size * len(word)) + 1  # DejaVu Sans advances are about 0.6-0.7 em
            x = int(rng.integers(2, max(3, 63 - width)))
            y = int(rng.integers(size + 2, 63))
            b.emit('<text x="{}" y="{}" font-size="{}" font-family="DejaVu Sans" fill="', _xy(x), _xy(y), _size(size))
        b.emit(*fill)
        b.emit(f">{word}</text>" if kind == "text" else "/>")
        drawn.append(kind)
    b.emit("</svg>")
    return Target(b.program(), "+".join(drawn))


def _fill(rng: np.random.Generator, b: Builder, index: int, *, gradient: bool) -> tuple:
    """The rest of a `fill="` attribute: a `#rrggbb` colour, or a gradient defined right here, before the shape."""
    first = int(rng.integers(len(PALETTE)))
    if not gradient:
        return ('#{}{}{}"', *_colour(PALETTE[first]))
    second = (first + 1 + int(rng.integers(len(PALETTE) - 1))) % len(PALETTE)
    b.emit(
        f'<linearGradient id="g{index}"><stop stop-color="#{{}}{{}}{{}}"/><stop offset="1" '
        'stop-color="#{}{}{}"/></linearGradient>',
        *_colour(PALETTE[first]),
        *_colour(PALETTE[second]),
    )
    return (f'url(#g{index})"',)


# ========================================================================================================= CHART


def chart_target(seed: int, complexity: int = 1) -> Target:
    """A matplotlib chart with known data and labels.

    * complexity 1: a bar chart of 3 categories, one colour;
    * 2: a bar, line, scatter or pie chart of 3-4 categories (scatter: 3-4 points), with a title;
    * 3: 3-5 categories, plus x and y axis labels (not on pies);
    * 4: 4-6 categories; line and scatter charts draw two labelled series and a legend.

    Values are integers 1-9 (scatter x values distinct integers 1-9). Noise moves values in units of 10 and
    colours in 0-255; words are never perturbed.

    Args:
        seed: the world's seed.
        complexity: in [1, CHART_MAX_COMPLEXITY].

    Returns:
        The target; `text` holds the chart's words (category labels except on scatter charts, title, axis labels,
        legend labels), the reference its OCR term reads against.
    """
    _check_complexity(complexity, CHART_MAX_COMPLEXITY, "chart")
    rng = _rng(seed)
    kind = "bar" if complexity == 1 else CHART_KINDS[int(rng.integers(len(CHART_KINDS)))]
    low_n, high_n = {1: (3, 3), 2: (3, 4), 3: (3, 5), 4: (4, 6)}[complexity]
    n = int(rng.integers(low_n, high_n + 1))
    x_label, vocabulary = CHART_CATEGORIES[int(rng.integers(len(CHART_CATEGORIES)))]
    categories = [vocabulary[int(j)] for j in sorted(rng.choice(len(vocabulary), size=n, replace=False))]
    series = 2 if complexity >= 4 and kind in ("line", "scatter") else 1
    legend = CHART_LEGENDS[int(rng.integers(len(CHART_LEGENDS)))] if series == 2 else ()
    colours = [int(c) for c in rng.choice(len(PALETTE), size=2, replace=False)]
    xs = sorted(int(v) for v in rng.choice(np.arange(1, 10), size=n, replace=False))
    words = [] if kind == "scatter" else list(categories)

    b = Builder()
    b.emit("import matplotlib.pyplot as plt\n")
    cats = "[" + ",".join(f'"{c}"' for c in categories) + "]"
    for k in range(series):
        values = [Slot(float(v), 10.0, 1.0 if kind == "pie" else 0.0, 20.0) for v in rng.integers(1, 10, size=n)]
        value_list = "[" + ",".join("{}" for _ in values) + "]"
        label = f',label="{legend[k]}"' if series == 2 else ""
        if kind == "pie":
            b.emit(f"plt.pie({value_list},labels={cats})\n", *values)
        elif kind == "scatter":
            x_slots = [Slot(float(x), 10.0, 0.0, 20.0) for x in xs]
            b.emit(
                f'plt.scatter({value_list},{value_list},color="#{{}}{{}}{{}}"{label})\n',
                *x_slots,
                *values,
                *_colour(PALETTE[colours[k]]),
            )
        else:
            call = "bar" if kind == "bar" else "plot"
            b.emit(
                f'plt.{call}({cats},{value_list},color="#{{}}{{}}{{}}"{label})\n',
                *values,
                *_colour(PALETTE[colours[k]]),
            )
    if complexity >= 2:
        title = CHART_TITLES[int(rng.integers(len(CHART_TITLES)))]
        b.emit(f'plt.title("{title}")\n')
        words.append(title)
    if complexity >= 3 and kind != "pie":
        if kind == "scatter":
            x_label = CHART_SCATTER_X_LABELS[int(rng.integers(len(CHART_SCATTER_X_LABELS)))]
        y_label = CHART_Y_LABELS[int(rng.integers(len(CHART_Y_LABELS)))]
        b.emit(f'plt.xlabel("{x_label}")\nplt.ylabel("{y_label}")\n')
        words += [x_label, y_label]
    if series == 2:
        b.emit("plt.legend()\n")
        words += list(legend)
    return Target(b.program(), f"{kind} chart", " ".join(words))


# =========================================================================================================== CAD


def _dim(value: int) -> Slot:
    """A CAD size: noise relative to the value itself."""
    return Slot(float(value), float(value), 1.0, 500.0)


def _at(value: int, part_size: int) -> Slot:
    """A CAD position: noise relative to the part's largest dimension."""
    return Slot(float(value), float(part_size), -500.0, 500.0)


def _even(rng: np.random.Generator, low: int, high: int) -> int:
    """An even integer in [low, high] (so that halves, e.g. stacking offsets, stay integers)."""
    return 2 * int(rng.integers((low + 1) // 2, high // 2 + 1))


def cad_target(seed: int, complexity: int = 1) -> Target:
    """A parametric build123d part, centred near the origin, at most about 50 units across.

    * complexity 1: one primitive, `Box(l, w, h)` or `Cylinder(r, h)`;
    * from 2 on, a family from `CAD_FAMILIES`: a box with `complexity - 1` through holes (at most 4); a plate with
      filleted vertical edges and `complexity - 2` holes (at most 4); a stepped cylinder of `min(complexity, 4)`
      stacked cylinders, narrowing upwards, bored through along its axis at complexity 5; an L-bracket with
      `complexity - 2` holes in its base (at most 2).

    Dimensions are integers (even where they are halved). Noise moves sizes relative to their own value and
    positions relative to the part's largest dimension.

    Args:
        seed: the world's seed.
        complexity: in [1, CAD_MAX_COMPLEXITY].

    Returns:
        The target; its source is `from build123d import *` and an algebra-mode `result = ...` (a few lines).
    """
    _check_complexity(complexity, CAD_MAX_COMPLEXITY, "cad")
    rng = _rng(seed)
    b = Builder()
    b.emit("from build123d import *\n")
    if complexity == 1:
        if rng.random() < 0.5:
            length, width, height = int(rng.integers(16, 49)), int(rng.integers(12, 37)), int(rng.integers(6, 25))
            b.emit("result = Box({}, {}, {})\n", _dim(length), _dim(width), _dim(height))
            return Target(b.program(), "box")
        radius, height = int(rng.integers(6, 21)), int(rng.integers(6, 41))
        b.emit("result = Cylinder({}, {})\n", _dim(radius), _dim(height))
        return Target(b.program(), "cylinder")

    family = CAD_FAMILIES[int(rng.integers(len(CAD_FAMILIES)))]
    if family == "box":
        length, width, height = _even(rng, 24, 48), _even(rng, 16, 36), int(rng.integers(8, 21))
        size = max(length, width, height)
        b.emit("result = Box({}, {}, {})", _dim(length), _dim(width), _dim(height))
        for x, y, r in _holes(rng, length, width, min(complexity - 1, 4)):
            b.emit(" - Pos({}, {}, 0) * Cylinder({}, {})", _at(x, size), _at(y, size), _dim(r), _dim(height))
        b.emit("\n")
        return Target(b.program(), f"box with {min(complexity - 1, 4)} holes")
    if family == "plate":
        length, width, thick = _even(rng, 30, 48), _even(rng, 20, 36), int(rng.integers(4, 9))
        size = max(length, width)
        fillet = int(rng.integers(2, min(length, width) // 4 + 1))
        b.emit(
            "result = fillet(Box({}, {}, {}).edges().filter_by(Axis.Z), {})\n",
            _dim(length),
            _dim(width),
            _dim(thick),
            _dim(fillet),
        )
        holes = _holes(rng, length, width, min(complexity - 2, 4))
        for x, y, r in holes:
            b.emit("result -= Pos({}, {}, 0) * Cylinder({}, {})\n", _at(x, size), _at(y, size), _dim(r), _dim(thick))
        return Target(b.program(), f"plate with {len(holes)} holes")
    if family == "stepped":
        steps = min(complexity, 4)
        radii = [int(rng.integers(14, 23))]
        for _ in range(steps - 1):
            radii.append(max(3, radii[-1] - int(rng.integers(3, 6))))
        heights = [_even(rng, 6, 10) for _ in range(steps)]
        size = max(2 * radii[0], sum(heights))
        b.emit("result = Cylinder({}, {})", _dim(radii[0]), _dim(heights[0]))
        z = 0
        for k in range(1, steps):
            z += (heights[k - 1] + heights[k]) // 2  # Cylinder is centred on its origin: stack centre to centre
            b.emit(" + Pos(0, 0, {}) * Cylinder({}, {})", _at(z, size), _dim(radii[k]), _dim(heights[k]))
        b.emit("\n")
        bored = complexity >= 5
        if bored:  # centred at z = 0, twice the stack's height: it runs through every step
            bore = int(rng.integers(2, max(3, radii[-1] - 1)))
            b.emit("result -= Cylinder({}, {})\n", _dim(bore), _dim(2 * (z + heights[-1])))
        return Target(b.program(), f"stepped cylinder of {steps}" + (" with a bore" if bored else ""))
    # bracket: a base plate and an upright plate on its -x end, both `thick` thick
    length, width, thick, rise = _even(rng, 30, 48), _even(rng, 16, 30), _even(rng, 4, 8), _even(rng, 14, 30)
    size = max(length, rise + thick)
    b.emit(
        "result = Box({}, {}, {}) + Pos({}, 0, {}) * Box({}, {}, {})",
        _dim(length),
        _dim(width),
        _dim(thick),
        _at(-(length - thick) // 2, size),
        _at((thick + rise) // 2, size),
        _dim(thick),
        _dim(width),
        _dim(rise),
    )
    count = min(complexity - 2, 2)
    radius = int(rng.integers(2, max(3, width // 6 + 1)))
    spots = [(length // 4, 0)] if count == 1 else [(length // 4, -width // 4), (length // 4, width // 4)][:count]
    for x, y in spots:
        b.emit(" - Pos({}, {}, 0) * Cylinder({}, {})", _at(x, size), _at(y, size), _dim(radius), _dim(thick))
    b.emit("\n")
    return Target(b.program(), f"L-bracket with {count} holes")


def _holes(rng: np.random.Generator, length: int, width: int, count: int) -> list[tuple[int, int, int]]:
    """`count` (x, y, radius) holes at distinct quadrant centres of a `length` x `width` face, never touching."""
    spots = [
        (length // 4, width // 4),
        (-length // 4, -width // 4),
        (length // 4, -width // 4),
        (-length // 4, width // 4),
    ]
    order = rng.permutation(len(spots))[:count]
    most = max(2, min(length, width) // 6)  # quadrant centres are length/4 and width/4 from the edges
    return [(spots[int(k)][0], spots[int(k)][1], int(rng.integers(2, most + 1))) for k in order]


# ========================================================================================================== HTML

HTML_CANVAS = 64
"""Side of the page, in CSS pixels; the env zooms it to the image size, so sources do not depend on it."""

HTML_MAX_COMPLEXITY = 8

HTML_PREAMBLE = "<style>body{margin:0}body>*{position:absolute;margin:0}</style>"
"""Put before every html source (target and answer) by the env: no page margin, and every top-level element is
placed by its own `left`/`top`, so a source is a list of boxes and nothing else."""


def html_target(seed: int, complexity: int = 1) -> Target:
    """A page of `complexity` absolutely placed boxes on a white 64 x 64 CSS-pixel page.

    Kinds: a box, a disc and an oval (`border-radius:50%`) always; from complexity 2 also a word of text (DejaVu
    Sans) and a rounded box; from complexity 3 a ring (a box with a thick border and no fill). Positions and sizes
    are integers that keep every box inside the page; later boxes may cover earlier ones. The source is meant to go
    after `HTML_PREAMBLE` (the env puts it there). Noise (expert demonstrations) is in CSS pixels for positions
    and sizes, in 0-255 for colours.

    Args:
        seed: the world's seed.
        complexity: number of boxes, in [1, HTML_MAX_COMPLEXITY].

    Returns:
        The target; its source is one line of HTML, e.g. `<div style="left:10px;top:12px;width:30px;height:20px;
        background:#d21e1e"></div>` (about 40 tokens of the tiny tokenizer).
    """
    _check_complexity(complexity, HTML_MAX_COMPLEXITY, "html")
    rng = _rng(seed)
    kinds = ["box", "disc", "oval"]
    if complexity >= 2:
        kinds += ["text", "rounded"]
    if complexity >= 3:
        kinds += ["ring"]
    b = Builder()
    drawn = []
    for _ in range(complexity):
        kind = kinds[int(rng.integers(len(kinds)))]
        colour = _colour(PALETTE[int(rng.integers(len(PALETTE)))])
        if kind == "text":
            word = SVG_WORDS[int(rng.integers(len(SVG_WORDS)))]
            size = int(rng.integers(10, 19))
            width = int(0.65 * size * len(word)) + 1
            x, y = int(rng.integers(1, max(2, 62 - width))), int(rng.integers(1, 62 - int(1.2 * size)))
            b.emit(
                '<p style="left:{}px;top:{}px;font:{}px DejaVu Sans;color:#{}{}{}">',
                _xy(x),
                _xy(y),
                _size(size),
                *colour,
            )
            b.emit(f"{word}</p>")
        else:
            if kind == "disc":
                w = h = int(rng.integers(10, 41))
            elif kind == "oval":
                while True:
                    w, h = (int(v) for v in rng.integers(10, 49, size=2))
                    if abs(w - h) >= 8:  # visibly not a disc
                        break
            else:
                w, h = (int(v) for v in rng.integers(12, 41, size=2))
            x, y = int(rng.integers(2, 63 - w)), int(rng.integers(2, 63 - h))
            b.emit('<div style="left:{}px;top:{}px;width:{}px;height:{}px;', _xy(x), _xy(y), _size(w), _size(h))
            if kind in ("disc", "oval"):
                b.emit("border-radius:50%;")
            elif kind == "rounded":
                b.emit("border-radius:{}px;", Slot(float(rng.integers(3, 9)), float(HTML_CANVAS), 0.0, 32.0))
            if kind == "ring":
                b.emit(
                    "box-sizing:border-box;border:{}px solid #{}{}{}",
                    Slot(float(rng.integers(3, 7)), float(HTML_CANVAS), 1.0, 16.0),
                    *colour,
                )
            else:
                b.emit("background:#{}{}{}", *colour)
            b.emit('"></div>')
        drawn.append(kind)
    return Target(b.program(), "+".join(drawn))
