"""The loop every rendering-feedback env shares (`RenderEnv`), and its kernels: image similarity, the
target | render observation of a correction turn, code-length efficiency. The three kinds are in `sim.render.envs`,
whose docstring describes the tasks, rewards and turns.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

import rewards.image  # noqa: F401  (registers the image metrics in REWARDS)
from rewards.catalog import REWARDS
from rewards.image import code_length_reward
from rewards.ocr import words
from rewards.parse import answer_code
from rewards.render import render_batch
from sim.base import SingleStepImageEnv, StepResult, check_expert_noise, check_text_actions
from sim.render.targets import (
    Target,
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

CHART_PREAMBLE = 'import matplotlib as _m; _m.rcParams.update({"figure.autolayout": True, "font.size": 8})\n'
# Put before every chart source (target and answer): the renderer resizes the figure after the code ran, so the
# layout must be computed at draw time (autolayout), or titles and tick labels of a small figure are cut off.

_CACHE_SIZE = 512  # rendered targets kept per env, keyed by seed (resets with repeated seeds, eval sets, GRPO groups)
_TARGET_TIMEOUT = 60.0  # seconds for rendering our own targets (the first call also waits for the worker to start)
_MAX_SHOWN_CODE = 4000  # characters of the previous attempt quoted in a correction instruction
_MAX_SHOWN_REASON = 200
_BLANK_VALUE = 255  # every renderer draws on white: an empty answer renders all 255
_PAD_VALUE = 128  # grey around the two halves of a correction observation
CHART_LINE = re.compile(r"(<chart>, line )(\d+)")
_NUMBER_WORD = re.compile(r"^\d+$")


class RenderEnv(SingleStepImageEnv):
    """The shared loop of the rendering envs; subclasses set the kind, targets, instructions and extra terms.

    Buffers and `reset` come from `SingleStepImageEnv` (`draw_worlds` renders the targets); `step` is this env's own:
    with `turns > 1` an episode is several attempts (module docstring).
    """

    has_boxes = False
    kind: ClassVar[str]  # render kind of rewards.render
    language: ClassVar[str]  # the language of `answer_code`: "svg", "python", "html"
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
            generator: the noise's random source, drawn world by world; required when `noise > 0`.

        Returns:
            N sources ("" for worlds never reset). Unperturbed, each reproduces its target pixel for pixel.
        """
        check_expert_noise(noise, generator, probability=False)
        return ["" if t is None else t.program.source(noise, generator) for t in self.targets]

    # ------------------------------------------------------------------------------------------- subclass hooks

    missing_reason: ClassVar[str] = "no code found in the answer"

    def instruction(self) -> str:
        """The first-turn instruction."""
        return self.task

    def extract(self, text: str) -> str | None:
        """The code of an answer (`rewards.parse.answer_code`): a fenced block in the env's language, else the bare
        code (for SVG the bare `<svg>` element), inside `<answer>` tags or not."""
        return answer_code(text, self.language)

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


def drop_numbers(text: str) -> str:
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
