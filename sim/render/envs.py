"""Rendering-feedback envs: the policy writes code (SVG, matplotlib, build123d) that should reproduce a target image.

Three text-action envs share one loop: `svg`, `chart` and `cad`. Each world shows a target rendered from a seed;
the policy answers with code; the code is rendered in the sandbox of `rewards.render` (all N answers of a step in
one `render_batch` call, spread over the warm worker pool) and scored against the target.

**Task.** The first observation is the target image `[H, W, 3]` and an instruction such as `"Write SVG code that
draws this image."`. Answers may be bare code, fenced (```` ```svg ````, ```` ```python ````), and/or inside
`<answer>` tags; `<think>` blocks are ignored (`rewards.parse.extract_code`). SVG answers must hold an
`<svg ...>...</svg>` element; chart answers are Python that draws with `matplotlib.pyplot` and leaves the figure open;
CAD answers are build123d scripts whose part is `result` (see `rewards.render.cad` for which object is drawn).

**Randomizations** (per world, from its seed only; `sim.render.targets` documents each generator):

* `svg`: `complexity` elements (rect, circle, ellipse, triangle; from 2: curved path, text in DejaVu Sans; from 3:
  linear gradients) with random integer geometry on a 64 x 64 viewBox and colours from a fixed palette.
* `chart`: kind (bar, line, scatter, pie), categories, integer values, colours, title, axis labels, legend
  (which of these appear grows with `complexity`).
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
turn (unweighted), so that summed over an episode (what `mmrl.rollout` does) they are the final values.

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
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

import rewards.image  # noqa: F401  (registers the image metrics in REWARDS)
from rewards.catalog import REWARDS
from rewards.image import code_length_reward
from rewards.ocr import ocr_text, text_f1, words
from rewards.parse import answer_region, extract_code
from rewards.render import render_batch
from rewards.render.cad import VIEWS
from sim.base import SingleStepImageEnv, StepResult, check_text_actions
from sim.registry import ENVS
from sim.render.targets import (
    CAD_MAX_COMPLEXITY,
    CHART_MAX_COMPLEXITY,
    SVG_MAX_COMPLEXITY,
    Target,
    cad_target,
    chart_target,
    svg_target,
)

IMAGE_METRICS = ("ssim", "pixel", "edge", "color_histogram")
"""Image metrics of `rewards.image` (registered in `rewards.REWARDS`) that `metrics` may name."""

DEFAULT_METRICS = {"ssim": 0.5, "pixel": 0.5}

CAD_EXTENT = 72.0
"""Model units across the shorter side of each CAD view (`rewards.render.cad`, `normalize=False`): the largest
target parts (about 50 units) fill most of a view, and size errors show."""

CHART_LAYOUT_PX = 192
"""Charts are laid out as a figure of this many pixels at 100 dpi (8 pt text, about 11 px) and drawn at the env's
`image_size` by scaling the dpi, so the picture is the same at every size, only sharper or blurrier."""

_CHART_PREAMBLE = 'import matplotlib as _m; _m.rcParams.update({"figure.autolayout": True, "font.size": 8})\n'
# Put before every chart source (target and answer): the renderer resizes the figure after the code ran, so the
# layout must be computed at draw time (autolayout), or titles and tick labels of a small figure are cut off.

_CACHE_SIZE = 512  # rendered targets kept per env, keyed by seed (resets with repeated seeds, eval sets, GRPO groups)
_TARGET_TIMEOUT = 60.0  # seconds for rendering our own targets (the first call also waits for the worker to start)
_MAX_SHOWN_CODE = 4000  # characters of the previous attempt quoted in a correction instruction
_MAX_SHOWN_REASON = 200
_BLANK_VALUE = 255  # every renderer draws on white: an empty answer renders all 255
_PAD_VALUE = 128  # grey around the two halves of a correction observation
_CHART_LINE = re.compile(r"(<chart>, line )(\d+)")
_NUMBER_WORD = re.compile(r"^\d+$")


class _RenderEnv(SingleStepImageEnv):
    """The shared loop of the rendering envs; subclasses set the kind, targets, instructions and extra terms.

    Buffers and `reset` come from `SingleStepImageEnv` (`draw_worlds` renders the targets); `step` is this env's own:
    with `turns > 1` an episode is several attempts (module docstring).
    """

    has_boxes = False
    kind: ClassVar[str]  # render kind of rewards.render
    language: ClassVar[str]  # extract_code language
    max_complexity: ClassVar[int]
    task: ClassVar[str]  # first-turn instruction
    make_target: ClassVar[Callable[[int, int], Target]]

    # Per-kind defaults of the options below (a subclass sets its own), read where an option is left as None.
    image_size: int = 64
    render_timeout: float = 5.0

    def __init__(
        self,
        num_envs: int,
        image_size: int | None = None,
        complexity: int = 1,
        turns: int = 1,
        success_threshold: float = 0.9,
        improvement_bonus: float = 0.5,
        similarity_weight: float = 1.0,
        length_weight: float = 0.1,
        metrics: Mapping[str, float] | str | None = None,
        render_timeout: float | None = None,
        device: str = "cpu",
        _weights: Mapping[str, float] | None = None,
    ):
        """The options every render env takes (each kind's docstring lists them); `_weights` holds a subclass's
        extra score terms (`{"ocr_weight": 0.5}`), which `sim.make` does not offer as options."""
        image_size = type(self).image_size if image_size is None else image_size
        render_timeout = type(self).render_timeout if render_timeout is None else render_timeout
        weights = _weights
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        if isinstance(image_size, bool) or not isinstance(image_size, int) or not 16 <= image_size <= 1024:
            raise ValueError(f"image_size must be an int in [16, 1024], got {image_size!r}")
        if (
            isinstance(complexity, bool)
            or not isinstance(complexity, int)
            or not 1 <= complexity <= self.max_complexity
        ):
            raise ValueError(f"complexity must be an int in [1, {self.max_complexity}], got {complexity!r}")
        if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            raise ValueError(f"turns must be an int >= 1, got {turns!r}")
        if not _is_number(success_threshold) or not 0 < success_threshold <= 1:
            raise ValueError(f"success_threshold must be in (0, 1], got {success_threshold!r}")
        if not _is_number(render_timeout) or render_timeout <= 0:
            raise ValueError(f"render_timeout must be a positive number of seconds, got {render_timeout!r}")
        all_weights = {
            "improvement_bonus": improvement_bonus,
            "similarity_weight": similarity_weight,
            "length_weight": length_weight,
            **(weights or {}),
        }
        for name, value in all_weights.items():
            if not _is_number(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        super().__init__(num_envs, image_size, device)
        self.complexity = complexity
        self.turns = turns
        self.max_episode_steps = turns
        self.success_threshold = float(success_threshold)
        self.improvement_bonus = float(improvement_bonus)
        self.render_timeout = float(render_timeout)
        self.metrics = _check_metrics(metrics)
        # Term name -> weight in the score; subclasses add theirs (ocr, executable) through `weights`.
        self.weights = {"similarity": float(similarity_weight), "length": float(length_weight)}
        self.weights.update({name.removesuffix("_weight"): float(w) for name, w in (weights or {}).items()})

        size = (num_envs, image_size, image_size, 3)
        self._target_images = torch.zeros(size, dtype=torch.uint8)  # [N, H, W, 3], CPU like all state
        self.targets: list[Target | None] = [None] * num_envs
        self._reference_lengths = torch.ones(num_envs)  # [N] characters of each world's expert source
        self._turn = torch.zeros(num_envs, dtype=torch.long)  # [N] attempts made since reset
        self._terms = {name: torch.zeros(num_envs) for name in self.weights}  # name -> [N], latest attempt
        self._score = torch.zeros(num_envs)  # [N] latest attempt's score
        self._similarity = torch.zeros(num_envs)  # [N]
        self._success = torch.zeros(num_envs, dtype=torch.bool)  # [N]
        self._cache: OrderedDict[int, tuple[Target, torch.Tensor]] = OrderedDict()

    # ------------------------------------------------------------------------------------------------ the contract

    def draw_worlds(self, ids: list[int], seeds: list[int]) -> tuple[torch.Tensor, list[str], None]:
        """Draw new targets for the worlds `ids` and start their episodes (the `SingleStepImageEnv` hook); all their
        targets render in one batch.

        Raises:
            RuntimeError: A target failed to render (a bug or a broken renderer install, never the policy's doing).
        """
        images = torch.zeros(len(ids), self.image_size, self.image_size, 3, dtype=torch.uint8)  # [K, H, W, 3]
        for row, (i, (target, image)) in enumerate(zip(ids, self._render_targets(seeds))):
            self.targets[i] = target
            self._target_images[i] = image
            images[row] = image
            self._reference_lengths[i] = max(len(target.source), 1)
        index = torch.tensor(ids, dtype=torch.long)
        self._turn[index] = 0
        self._score[index] = 0.0
        self._similarity[index] = 0.0
        for value in self._terms.values():
            value[index] = 0.0
        self._success[index] = False
        return images, [self.instruction() for _ in ids], None

    def step(self, actions: list[str]) -> StepResult:
        """Render and score one answer per running world; finished worlds are left as they are.

        Args:
            actions: N strings (code, fenced code, or `<answer>` tags around it). Entries of finished worlds are
                ignored.

        Returns:
            A StepResult: the observation of all N worlds (target | render for the worlds that just attempted),
            reward `[N]` float32 (module docstring), terminated `[N]` (the episode is over), truncated all False,
            and info: `reward_components` (each term's change, `[N]`), `reasons` (N strings, "" where the answer
            rendered), `success` `[N]` bool, `similarity` and `score` `[N]` of the latest attempt, `rendered`
            `[N]` bool (this step's answer rendered).

        Raises:
            ValueError: `actions` is not a list of N strings.
            RuntimeError: Some worlds were never reset.
        """
        actions = check_text_actions(actions, self.num_envs, type(self).__name__)
        never = (~self._was_reset).nonzero().flatten().tolist()
        if never:
            raise RuntimeError(f"worlds {never} were never reset; reset them first")

        n = self.num_envs
        live = ~self._ended  # [N]
        live_ids = live.nonzero().flatten().tolist()
        codes: list[str | None] = [None] * n
        reasons = [""] * n
        for i in live_ids:
            codes[i] = self.extract(actions[i])
            if codes[i] is None:
                reasons[i] = self.missing_reason
        images, rendered = self._render_answers(codes, reasons)  # [N, H, W, 3], [N]

        terms = {key: torch.zeros(n) for key in self.weights}  # name -> [N]
        rows = rendered.nonzero().flatten()
        if len(rows):
            similarity = image_similarity(images[rows], self._target_images[rows], self.metrics)  # [K]
            terms["similarity"][rows] = similarity
            lengths = torch.tensor([len(codes[i] or "") for i in rows.tolist()], dtype=torch.float32)
            efficiency = _code_length_reward(lengths, self._reference_lengths[rows])  # [K]
            terms["length"][rows] = similarity * efficiency
            self.extra_terms(terms, rows, images, rendered)
        score = sum(self.weights[key] * terms[key] for key in self.weights)  # [N]

        gain = score - self._score  # [N]
        bonus = self.improvement_bonus * gain.clamp(min=0) * (self._turn >= 1)  # [N], corrections only
        zero = torch.zeros(n)
        reward = torch.where(live, gain + bonus, zero)  # [N]
        components = {key: torch.where(live, terms[key] - self._terms[key], zero) for key in self.weights}
        if self.turns > 1:
            components["improvement_bonus"] = torch.where(live, bonus, zero)

        # Only the worlds that attempted move on; finished ones keep their state (module docstring).
        index = live.nonzero().flatten()
        for key in self.weights:
            self._terms[key][index] = terms[key][index]
        self._score[index] = score[index]
        self._similarity[index] = terms["similarity"][index]
        self._turn[index] += 1
        self._success[index] = terms["similarity"][index] >= self.success_threshold
        self._ended[index] = self._success[index] | (self._turn[index] >= self.turns)
        if len(index):
            self._images[index] = side_by_side(self._target_images[index], images[index], rendered[index])
            for i in live_ids:
                self._instructions[i] = self._feedback(i, codes[i], reasons[i], bool(self._ended[i]))

        return StepResult(
            obs=self._observation(),
            reward=self._out(reward.to(torch.float32)),
            terminated=self._out(self._ended),
            truncated=torch.zeros(n, dtype=torch.bool, device=self.device),
            info={
                "reward_components": {key: self._out(value) for key, value in components.items()},
                "reasons": reasons,
                "success": self._out(self._success),
                "similarity": self._out(self._similarity),
                "score": self._out(self._score),
                "rendered": self._out(rendered),
            },
        )

    def close(self) -> None:
        """Nothing to release: the render pools are process-wide (`rewards.render.shutdown_pools` stops them)."""

    # ------------------------------------------------------------------------------------------------ the expert

    def expert_action(self, noise: float = 0.0, generator: torch.Generator | None = None) -> list[str]:
        """A scripted demonstration per world: the source that drew its target, optionally made sloppy.

        At complexity 1 a demonstration is about 85 tokens of the tiny 2048-token tokenizer for SVG, 58 for a chart
        and 27 for CAD (`sim.render.targets` lists more).

        Args:
            noise: relative std of the Gaussian noise added to every number of the source (positions, sizes,
                colours, data; `sim.render.targets` says relative to what); 0 gives the exact source.
            generator: the noise's random source, drawn world by world (the global generator when None).

        Returns:
            N sources ("" for worlds never reset). Unperturbed, each reproduces its target pixel for pixel.
        """
        if not _is_number(noise) or noise < 0:
            raise ValueError(f"noise must be a finite number >= 0, got {noise!r}")
        return ["" if t is None else t.program.source(noise, generator) for t in self.targets]

    # ------------------------------------------------------------------------------------------- subclass hooks

    missing_reason: ClassVar[str] = "no code found in the answer"

    def instruction(self) -> str:
        """The first-turn instruction."""
        return self.task

    def extract(self, text: str) -> str | None:
        """The code of an answer: a fenced block in the env's language, else the `<answer>` content or bare text."""
        region = answer_region(text)
        code = extract_code(region, self.language)
        if code is None:
            code = region.strip()
        return code or None

    def wrap(self, code: str) -> str:
        """The source sent to the renderer for a piece of code (the chart env adds its layout preamble)."""
        return code

    def render_options(self) -> dict[str, Any]:
        """Renderer options for `rewards.render.render_batch`."""
        return {}

    def clean_reason(self, reason: str) -> str:
        """A render failure's reason as the policy should read it."""
        return reason

    def extra_terms(
        self, terms: dict[str, torch.Tensor], rows: torch.Tensor, images: torch.Tensor, rendered: torch.Tensor
    ) -> None:
        """Fill the env's own score terms (beyond similarity and length) in `terms` for the rendered `rows`."""

    # ------------------------------------------------------------------------------------------------ internals

    def _render_targets(self, seeds: list[int]) -> list[tuple[Target, torch.Tensor]]:
        """Targets of `seeds`, from the cache or rendered (the missing ones in one batch)."""
        found = {s: self._cache[s] for s in seeds if s in self._cache}
        missing = list(dict.fromkeys(s for s in seeds if s not in found))
        if missing:
            targets = [self.make_target(s, self.complexity) for s in missing]
            sources = [self.wrap(t.source) for t in targets]
            options = self.render_options()
            results = _render_batch(self.kind, sources, self.image_size, _TARGET_TIMEOUT, options)
            for seed, target, source, result in zip(missing, targets, sources, results):
                if result.image is None:  # a loaded machine can time out once: try again before giving up
                    result = _render_batch(self.kind, [source], self.image_size, _TARGET_TIMEOUT, options)[0]
                if result.image is None:
                    raise RuntimeError(f"the {self.kind} target of seed {seed} did not render: {result.reason}")
                found[seed] = (target, result.image)
        for s in dict.fromkeys(seeds):
            self._cache[s] = found[s]
            self._cache.move_to_end(s)
        while len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return [found[s] for s in seeds]

    def _render_answers(self, codes: list[str | None], reasons: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Render every extracted code in one batch; fill `reasons` of the failures.

        Returns:
            images: `[N, H, W, 3]` uint8, black where nothing rendered.
            rendered: `[N]` bool.
        """
        n, size = self.num_envs, self.image_size
        images = torch.zeros(n, size, size, 3, dtype=torch.uint8)
        rendered = torch.zeros(n, dtype=torch.bool)
        ids = [i for i, code in enumerate(codes) if code is not None]
        if not ids:
            return images, rendered
        sources = [self.wrap(codes[i]) for i in ids]  # type: ignore[arg-type]
        for i, result in zip(ids, _render_batch(self.kind, sources, size, self.render_timeout, self.render_options())):
            if result.image is None:
                reasons[i] = self.clean_reason(result.reason) or "render failed"
            else:
                images[i] = result.image
                rendered[i] = True
        return images, rendered

    def _feedback(self, world: int, code: str | None, reason: str, ended: bool) -> str:
        """The instruction after world `world`'s attempt: what happened, and (if it goes on) the code to fix."""
        ask = "" if ended else " Fix the code."
        if code is None:
            return f"Left: target. Right: nothing ({reason})." + ("" if ended else f" {self.instruction()}")
        if reason:
            short = reason if len(reason) <= _MAX_SHOWN_REASON else reason[: _MAX_SHOWN_REASON - 3] + "..."
            head = f"Left: target. Right: your code did not render ({short}).{ask}"
        else:
            head = f"Left: target. Right: your render (similarity {float(self._similarity[world]):.2f}).{ask}"
        if ended:
            return head
        shown = code if len(code) <= _MAX_SHOWN_CODE else code[:_MAX_SHOWN_CODE] + "\n..."
        return f"{head}\nYour code:\n{shown}"


# ============================================================================================================ SVG


@ENVS.register("svg")
class SvgEnv(_RenderEnv):
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

    def extract(self, text: str) -> str | None:
        """The `<svg>...</svg>` of an answer: fenced, inside `<answer>` tags, or bare."""
        return extract_code(answer_region(text), "svg")


# ========================================================================================================== CHART


@ENVS.register("chart")
class ChartEnv(_RenderEnv):
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
        """See the class docstring for `options`; `sim.make` checks their names against `_RenderEnv.__init__`."""
        super().__init__(num_envs, **options, _weights={"ocr_weight": ocr_weight})
        if self.weights["ocr"] > 0 and importlib.util.find_spec("rapidocr_onnxruntime") is None:
            raise ValueError(
                "ocr_weight > 0 needs rapidocr-onnxruntime (the `ocr` extra); install it or set ocr_weight=0"
            )

    def wrap(self, code: str) -> str:
        return _CHART_PREAMBLE + code

    def render_options(self) -> dict[str, Any]:
        return {"dpi": 100.0 * self.image_size / CHART_LAYOUT_PX}

    def clean_reason(self, reason: str) -> str:
        # Line numbers count from the policy's first line, not the preamble's.
        return _CHART_LINE.sub(lambda m: f"{m.group(1)}{max(int(m.group(2)) - 1, 1)}", reason)

    def extra_terms(
        self, terms: dict[str, torch.Tensor], rows: torch.Tensor, images: torch.Tensor, rendered: torch.Tensor
    ) -> None:
        if self.weights["ocr"] == 0:
            return  # no OCR engine, no cost
        read = [_drop_numbers(text) for text in ocr_text(images[rows])]
        expected = [self.targets[i].text for i in rows.tolist()]  # type: ignore[union-attr]
        terms["ocr"][rows] = text_f1(read, expected)


# ============================================================================================================ CAD


@ENVS.register("cad")
class CadEnv(_RenderEnv):
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
        """See the class docstring for `options`; `sim.make` checks their names against `_RenderEnv.__init__`."""
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


# ======================================================================================================== KERNELS


def image_similarity(images: torch.Tensor, targets: torch.Tensor, metrics: Mapping[str, float]) -> torch.Tensor:
    """Weighted mean of image metrics, each rescaled so that a white canvas scores 0 and the target itself 1.

    Args:
        images: `[R, H, W, 3]` uint8 renders.
        targets: `[R, H, W, 3]` uint8 targets.
        metrics: name in `IMAGE_METRICS` -> weight (>= 0, not all 0).

    Returns:
        `[R]` float32 in [0, 1].
    """
    blank = torch.full_like(targets, _BLANK_VALUE)
    total = torch.zeros(images.shape[0])
    for name, weight in metrics.items():
        if weight == 0:
            continue
        metric = REWARDS.get(name)
        raw, floor = metric(images, targets).float(), metric(blank, targets).float()  # [R], [R]
        room = 1.0 - floor
        # A target that is itself (nearly) blank leaves no room to rescale: keep the raw score there.
        scaled = torch.where(room > 1e-6, (raw - floor) / room.clamp(min=1e-6), raw)
        total += weight * scaled.clamp(0.0, 1.0)
    return (total / sum(metrics.values())).to(torch.float32)


def side_by_side(left: torch.Tensor, right: torch.Tensor, right_ok: torch.Tensor) -> torch.Tensor:
    """Target | render in one image of the same size: each scaled to fit its half, centred on grey.

    Args:
        left: `[R, H, W, 3]` uint8 targets.
        right: `[R, H, W, 3]` uint8 renders.
        right_ok: `[R]` bool; False draws the right image black (a failed render).

    Returns:
        `[R, H, W, 3]` uint8.
    """
    r, height, width, _ = left.shape
    half = width // 2
    scaled_h = max(1, min(height, round(height * half / width)))
    pair = torch.cat([left, right]).permute(0, 3, 1, 2).float()  # [2R, 3, H, W]
    small = F.interpolate(pair, size=(scaled_h, half), mode="bilinear", antialias=True, align_corners=False)
    small = small.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)  # [2R, h, w, 3]
    right_small = torch.where(right_ok.view(-1, 1, 1, 1), small[r:], torch.zeros_like(small[r:]))
    out = torch.full_like(left, _PAD_VALUE)
    top = (height - scaled_h) // 2
    out[:, top : top + scaled_h, :half] = small[:r]
    out[:, top : top + scaled_h, half : 2 * half] = right_small
    return out


def _code_length_reward(lengths: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    return code_length_reward(lengths, reference, free_fraction=1.0)


def _render_batch(kind: str, sources: list[str], size: int, timeout: float, options: dict[str, Any]) -> list:
    return render_batch(kind, sources, size, timeout=timeout, **options)


def _drop_numbers(text: str) -> str:
    return " ".join(w for w in words(text) if not _NUMBER_WORD.match(w))


def _check_metrics(metrics: Mapping[str, float] | str | None) -> dict[str, float]:
    if metrics is None:
        return dict(DEFAULT_METRICS)
    chosen = {metrics: 1.0} if isinstance(metrics, str) else dict(metrics)
    bad = [name for name in chosen if name not in IMAGE_METRICS]
    if bad or not chosen:
        raise ValueError(f"metrics must name some of {', '.join(IMAGE_METRICS)}, got {metrics!r}")
    if any(not _is_number(w) or w < 0 for w in chosen.values()) or sum(chosen.values()) <= 0:
        raise ValueError(f"metrics weights must be finite, >= 0 and not all 0, got {metrics!r}")
    return {name: float(w) for name, w in chosen.items()}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
