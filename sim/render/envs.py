"""Rendering-feedback envs: the policy writes code (SVG, matplotlib, build123d, HTML) that should reproduce a target
image.

Four text-action envs share one loop: `svg`, `chart`, `cad` and `html` (which needs headless Chromium). Each world
shows a target rendered from a seed; the policy answers with code; the code is rendered in the sandbox of
`rewards.render` (all N answers of a step in one `render_batch` call, spread over the warm worker pool) and scored
against the target.

**Task.** The first observation is the target image `[H, W, 3]` and an instruction such as `"Write SVG code that
draws this image."`. Answers may be bare code, fenced (```` ```svg ````, ```` ```python ````), and/or inside
`<answer>` tags; `<think>` blocks are ignored (`rewards.parse.answer_code`). SVG answers must hold an
`<svg ...>...</svg>` element; chart answers are Python that draws with `matplotlib.pyplot` and leaves the figure open;
CAD answers are build123d scripts whose part is `result` (see `rewards.render.cad` for which object is drawn).

**Randomizations** (per world, from its seed only; `sim.render.targets` documents each generator):

* `svg`: `complexity` elements (rect, circle, ellipse, triangle; from 2: curved path, text in DejaVu Sans; from 3:
  linear gradients) with random integer geometry on a 64 x 64 viewBox and colours from a fixed palette.
* `chart`: kind (bar, line, scatter, pie), categories, integer values, colours, title, axis labels, legend
  (which of these appear grows with `complexity`).
* `html`: `complexity` absolutely placed boxes (box, disc, oval; from 2: a word of text, a rounded box; from 3: a
  ring) with integer geometry on a 64 x 64 CSS-pixel page, after a fixed preamble (`HTML_PREAMBLE`: no margins,
  every top-level element placed by its `left`/`top`), zoomed to the image size.
* `cad`: a primitive (complexity 1), then a box with holes, a filleted plate, a stepped cylinder or an L-bracket
  with random integer dimensions, drawn from `views` (default front, right, top, iso) at a fixed scale
  (`normalize=False`, `CAD_EXTENT` units across a view), so a part of the wrong size looks wrong.

**Reward.** Every attempt t gets a score in [0, max]:

    similarity_t = sum_m w_m * clamp((m(render, target) - m(white, target)) / (1 - m(white, target)), 0, 1) / sum_m w_m
    score_t      = similarity_weight * similarity_t + length_weight * similarity_t * length_t    (svg)
                   + ocr_weight * ocr_t                                                            (chart)
                   + executable_weight * executable_t                                              (cad)

Each image metric `m` (`rewards.image`: `ssim`, `pixel`, `edge`, `color_histogram`; default ssim and pixel, half
each) is rescaled so that an empty (all-white) canvas scores 0 and the target itself 1: without it, a blank answer
gets most of the raw SSIM or pixel similarity of a target that is mostly background. SSIM alone is blind to hue
(it compares luma), which the pixel term is not. `length_t` is `rewards.image.code_length_reward(code,
len(expert code), free_fraction=1)` (1 up to the expert's length, 0 from twice it); it is multiplied by the
similarity so that short code only pays when it draws the right picture. `ocr_t` is the word F1
(`rewards.ocr.text_f1`) between what RapidOCR reads in the render, numbers left out, and the chart's words (title,
axis, category and legend labels); tick numbers are left out on both sides because the data, not the code's text,
decides them (the similarity term scores the data). `executable_t` is 1 when the script built a drawable solid.
A missing, unrenderable or refused answer scores 0 on every term, with its reason in `info["reasons"]`.

**Multi-turn self-correction** (`turns=K > 1`, after RRVF, https://arxiv.org/abs/2507.20766): after attempt t the
observation shows the target on the left half and the attempt's render on the right half (each scaled to fit,
centred on grey; a failed render is a black square), and the instruction gives the similarity, or the reason the
code did not render, and the code, asking for a fix. The reward of turn t is

    r_t = (score_t - score_{t-1}) + improvement_bonus * max(score_t - score_{t-1}, 0) * [t >= 2],   score_0 = 0

so the return `sum_t r_t = score_K + improvement_bonus * (sum of the corrections' gains)` credits the final result
and each improvement, and a turn that breaks a working answer is penalised by what it lost. With `turns=1` the
reward is just `score_1`. Reward components are reported the same way, as each term's change since the previous
turn (unweighted), so that summed over an episode (what `mmrl.stages.rollout` does) they are the final values.

**Episode end and success.** An episode ends when `similarity_t >= success_threshold` or after K attempts;
`terminated` is True then (the last attempt is the final answer, not a cut-off: there is nothing to bootstrap) and
`truncated` is always False. `info["success"]` is `similarity >= success_threshold` of the latest attempt. A finished
world is frozen until reset: `step` ignores its action, renders nothing, returns its last observation, reward 0 and
components 0, and repeats its final `terminated` and `success`.

**Expert.** `expert_action(noise, generator)` returns each world's target source (the short program that drew it),
its numbers perturbed by Gaussian noise for `noise > 0`. Unperturbed, it reproduces the target pixel for pixel and
scores the maximum.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import torch

from rewards.ocr import ocr_text, text_f1
from rewards.render.cad import VIEWS
from rewards.render.html import unavailable as html_unavailable
from sim.registry import ENVS
from sim.render.base import (
    CAD_EXTENT,
    CHART_LAYOUT_PX,
    CHART_LINE,
    CHART_PREAMBLE,
    DEFAULT_METRICS,
    IMAGE_METRICS,
    RenderEnv,
    drop_numbers,
    image_similarity,
    side_by_side,
)
from sim.render.targets import (
    CAD_MAX_COMPLEXITY,
    CHART_MAX_COMPLEXITY,
    HTML_CANVAS,
    HTML_MAX_COMPLEXITY,
    HTML_PREAMBLE,
    SVG_MAX_COMPLEXITY,
    cad_target,
    chart_target,
    html_target,
    svg_target,
)

__all__ = [
    "CadEnv",
    "ChartEnv",
    "DEFAULT_METRICS",
    "IMAGE_METRICS",
    "HtmlEnv",
    "SvgEnv",
    "image_similarity",
    "side_by_side",
]


# ============================================================================================================ SVG


@ENVS.register("svg")
class SvgEnv(RenderEnv):
    """Image to SVG: reproduce a procedural SVG scene (see the module docstring for task, reward and turns).

    >>> env = SvgEnv(num_envs=2)  # doctest: +SKIP
    >>> obs = env.reset(seed=0)  # doctest: +SKIP
    >>> env.step(env.expert_action()).reward  # doctest: +SKIP
    tensor([1.1000, 1.1000])

    Args:
        num_envs: N, the number of worlds.
        image_size: Side of the square images, in pixels (the SVG viewBox is always 64 x 64 units).
        complexity: Elements per scene, 1 (one flat shape) to 12.
        turns: Attempts per episode, K; more than 1 turns on self-correction.
        success_threshold: Similarity at which an attempt succeeds and the episode ends.
        improvement_bonus: Extra reward per unit of score a correction (turn >= 2) gains.
        similarity_weight: Weight of the similarity term.
        length_weight: Weight of the length term (similarity times code-length efficiency).
        metrics: Image metrics for the similarity: a name in `IMAGE_METRICS` or a mapping name -> weight.
        render_timeout: Seconds (wall clock and CPU) one answer may take to render.
        device: Where the returned tensors live. Rendering and state stay on the CPU.
    """

    kind = "svg"
    language = "svg"
    max_complexity = SVG_MAX_COMPLEXITY
    task = "Write SVG code that draws this image."
    make_target = staticmethod(svg_target)
    missing_reason = "no <svg>...</svg> element in the answer"
    image_size = 64
    render_timeout = 5.0


# ========================================================================================================== CHART


@ENVS.register("chart")
class ChartEnv(RenderEnv):
    """Chart to matplotlib code: reproduce a generated chart, words included (see the module docstring).

    The chart is laid out as a `CHART_LAYOUT_PX`-pixel figure and drawn at `image_size`; the OCR term reads
    reliably from about 160 px (the default 192 gives 11 px text).

    Args:
        num_envs: N, the number of worlds.
        image_size: Side of the square images, in pixels.
        complexity: 1 (three bars) to 4 (any kind, titles, axis labels, legends).
        turns: Attempts per episode, K; more than 1 turns on self-correction.
        success_threshold: Similarity at which an attempt succeeds and the episode ends.
        improvement_bonus: Extra reward per unit of score a correction (turn >= 2) gains.
        similarity_weight: Weight of the similarity term.
        ocr_weight: Weight of the OCR word-F1 term (0 turns OCR off: it costs about 0.3 s per rendered answer).
        length_weight: Weight of the length term (similarity times code-length efficiency).
        metrics: Image metrics for the similarity: a name in `IMAGE_METRICS` or a mapping name -> weight.
        render_timeout: Seconds (wall clock and CPU) one answer may take to render.
        device: Where the returned tensors live. Rendering and state stay on the CPU.
    """

    kind = "chart"
    language = "python"
    max_complexity = CHART_MAX_COMPLEXITY
    task = "Write matplotlib code that draws this chart."
    make_target = staticmethod(chart_target)
    image_size = 192
    render_timeout = 10.0

    def __init__(self, num_envs: int, ocr_weight: float = 0.5, **options: Any):
        """See the class docstring for `options`; `sim.make` checks their names against `RenderEnv.__init__`."""
        super().__init__(num_envs, **options, _weights={"ocr_weight": ocr_weight})
        if self.weights["ocr"] > 0 and importlib.util.find_spec("rapidocr_onnxruntime") is None:
            raise ValueError(
                "ocr_weight > 0 needs rapidocr-onnxruntime (the `ocr` extra); install it or set ocr_weight=0"
            )

    def wrap(self, code: str) -> str:
        return CHART_PREAMBLE + code

    def render_options(self) -> dict[str, Any]:
        return {"dpi": 100.0 * self.image_size / CHART_LAYOUT_PX}

    def clean_reason(self, reason: str) -> str:
        # Line numbers count from the policy's first line, not the preamble's.
        return CHART_LINE.sub(lambda m: f"{m.group(1)}{max(int(m.group(2)) - 1, 1)}", reason)

    def extra_terms(
        self, terms: dict[str, torch.Tensor], rows: torch.Tensor, images: torch.Tensor, rendered: torch.Tensor
    ) -> None:
        if self.weights["ocr"] == 0:
            return  # no OCR engine, no cost
        read = [drop_numbers(text) for text in ocr_text(images[rows])]
        expected = [self.targets[i].text for i in rows.tolist()]  # type: ignore[union-attr]
        terms["ocr"][rows] = text_f1(read, expected)


# ============================================================================================================ CAD


@ENVS.register("cad")
class CadEnv(RenderEnv):
    """Views to a build123d script: reproduce a parametric part (see the module docstring).

    Args:
        num_envs: N, the number of worlds.
        image_size: Side of the square images, in pixels; the views tile it (2 x 2 for four views).
        complexity: 1 (a box or cylinder) to 5 (parts with several holes, steps or a bore).
        turns: Attempts per episode, K; more than 1 turns on self-correction.
        success_threshold: Similarity at which an attempt succeeds and the episode ends.
        improvement_bonus: Extra reward per unit of score a correction (turn >= 2) gains.
        executable_weight: Weight of the executability term (the script built a drawable solid).
        similarity_weight: Weight of the similarity term.
        length_weight: Weight of the length term (similarity times code-length efficiency).
        views: The views drawn (names of `rewards.render.cad.VIEWS`), tiled left to right, top to bottom.
        metrics: Image metrics for the similarity: a name in `IMAGE_METRICS` or a mapping name -> weight.
        render_timeout: Seconds (wall clock and CPU) one answer may take to render.
        device: Where the returned tensors live. Rendering and state stay on the CPU.
    """

    kind = "cad"
    language = "python"
    max_complexity = CAD_MAX_COMPLEXITY
    task = "Write a build123d script that builds this part."
    make_target = staticmethod(cad_target)
    image_size = 128
    render_timeout = 10.0

    def __init__(
        self,
        num_envs: int,
        executable_weight: float = 0.2,
        views: Sequence[str] = ("front", "right", "top", "iso"),
        **options: Any,
    ):
        """See the class docstring for `options`; `sim.make` checks their names against `RenderEnv.__init__`."""
        names = [views] if isinstance(views, str) else list(views)
        if not names or any(v not in VIEWS for v in names):
            raise ValueError(f"views must be a non-empty list of {sorted(VIEWS)}, got {views!r}")
        self.views = tuple(names)
        super().__init__(num_envs, **options, _weights={"executable_weight": executable_weight})

    def instruction(self) -> str:
        return f"Write a build123d script that builds this part (views: {', '.join(self.views)})."

    def render_options(self) -> dict[str, Any]:
        return {"views": list(self.views), "normalize": False, "extent": CAD_EXTENT}

    def extra_terms(
        self, terms: dict[str, torch.Tensor], rows: torch.Tensor, images: torch.Tensor, rendered: torch.Tensor
    ) -> None:
        terms["executable"][rows] = 1.0


# =========================================================================================================== HTML


@ENVS.register("html")
class HtmlEnv(RenderEnv):
    """Screenshot to HTML: reproduce a page of placed boxes and words (see the module docstring; needs Chromium).

    The page is rendered by headless Chromium in the sandbox (`rewards.render.html`); without a browser, building
    the env raises with what to install, and the all-envs contract test skips it (`unavailable`).

    Args:
        num_envs: N, the number of worlds.
        image_size: Side of the square images, in pixels (the page is always 64 x 64 CSS pixels, zoomed to it).
        complexity: Boxes per page, 1 (one box, disc or oval) to 8.
        turns: Attempts per episode, K; more than 1 turns on self-correction.
        success_threshold: Similarity at which an attempt succeeds and the episode ends.
        improvement_bonus: Extra reward per unit of score a correction (turn >= 2) gains.
        similarity_weight: Weight of the similarity term.
        length_weight: Weight of the length term (similarity times code-length efficiency).
        metrics: Image metrics for the similarity: a name in `IMAGE_METRICS` or a mapping name -> weight.
        render_timeout: Seconds (wall clock) one answer may take to render.
        device: Where the returned tensors live. Rendering and state stay on the CPU.
    """

    kind = "html"
    language = "html"
    max_complexity = HTML_MAX_COMPLEXITY
    task = "Write HTML that draws this image."
    make_target = staticmethod(html_target)
    missing_reason = "no HTML in the answer"
    image_size = 64
    render_timeout = 10.0  # a fresh browser context per answer: far slower than the other kinds (BENCHMARKS.md)
    unavailable = staticmethod(html_unavailable)

    def __init__(self, num_envs: int, **options: Any):
        """See the class docstring for `options`; `sim.make` checks their names against `RenderEnv.__init__`."""
        reason = self.unavailable()
        if reason is not None:
            raise RuntimeError(f"the html env cannot start: {reason}")
        super().__init__(num_envs, **options)

    def wrap(self, code: str) -> str:
        # Every page is laid out at 64 CSS px and zoomed to the image, so sources do not depend on the image size.
        zoom = self.image_size / HTML_CANVAS
        return (f"<style>html{{zoom:{zoom:g}}}</style>" if zoom != 1 else "") + HTML_PREAMBLE + code
