"""Multiple-choice questions about a freshly drawn image of flat shapes: a task whose failures are perceptual.

**Task.** Each world is an image of the grounding env's scenes (`sim.tasks.grounding`: 2-4 flat shapes of four kinds
and four colours on a light background) and one question with lettered options:

* `colour`: "What colour is the {kind}?" about a shape whose kind is unique in the image; options red, green, blue,
  yellow;
* `shape`: "Which shape is {colour}?" about a shape whose colour is unique; options circle, square, triangle, diamond;
* `count`: "How many shapes are in the image?"; options 1 to 5.

The policy answers with a letter, ideally `<answer>B</answer>`. Episodes last one step. Every seed draws a new image,
so nothing can be memorised: unlike a dataset of a few hundred records, a policy can only beat chance by looking.

**Randomizations** (per world, from that world's seed only): the scene (as in grounding), which of the `questions`
kinds is asked (uniformly among those the scene can ask: `colour` needs a shape of a unique kind, `shape` one of a
unique colour; `count` always can), which shape it is about, and the order of the options. The right letter is
therefore uniform over the options, and an answer that ignores the image is right at chance: 1/4 for `colour` and
`shape`, about 1/3 for `count` (the count is 2, 3 or 4); about 0.28 over the three kinds.

**Reward.** 1 when the letter read by `rewards.parse_choice` is right, else 0 (a reason says why: no letter found, or
which option it picked). **Success** is a right answer. `info["task"]` is the question's kind, so evaluation reports
accuracy per kind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from rewards import parse_choice
from sim.base import check_expert_noise
from sim.registry import ENVS
from sim.tasks.grounding import COLOURS, KINDS, GroundingEnv

QUESTIONS = ("colour", "shape", "count")
COUNTS = ("1", "2", "3", "4", "5")
LETTERS = "ABCDE"


@ENVS.register("shape_questions")
class ShapeQuestionsEnv(GroundingEnv):
    """N worlds of single-step multiple-choice questions about shapes (see the module docstring for the task).

    >>> env = ShapeQuestionsEnv(num_envs=2, image_size=64)
    >>> obs = env.reset(seed=0)
    >>> env.step(env.expert_action()).reward  # the right letters
    tensor([1., 1.])

    Args:
        num_envs: N, the number of worlds.
        image_size: Side of the square images, in pixels.
        questions: The kinds of question asked, a non-empty subset of `QUESTIONS`.
        min_shapes: Fewest shapes per image (at least 2, so a count has a range to miss).
        max_shapes: Most shapes per image (at most 4: the options stop at 5). Fewer may be drawn when the
            placement tries run out.
        min_size: Smallest shape side, in pixels; None: a sixth of `image_size` (at least 4).
        max_size: Largest shape side, in pixels; None: a third of `image_size`.
        answer_hint: Append "Answer with the letter of your choice in <answer></answer>." to each question.
        device: Where the returned tensors live. Scenes are always drawn on the CPU.
    """

    has_boxes = False

    def __init__(
        self,
        num_envs: int,
        image_size: int = 64,
        questions: Sequence[str] = QUESTIONS,
        min_shapes: int = 2,
        max_shapes: int = 4,
        min_size: int | None = None,
        max_size: int | None = None,
        answer_hint: bool = True,
        device: str = "cpu",
    ):
        if isinstance(questions, str) or not questions or any(q not in QUESTIONS for q in questions):
            raise ValueError(f"questions must be a non-empty list of {', '.join(QUESTIONS)}, got {questions!r}")
        if not 2 <= min_shapes <= max_shapes <= 4:
            raise ValueError(f"need 2 <= min_shapes <= max_shapes <= 4, got {min_shapes}, {max_shapes}")
        if not isinstance(answer_hint, bool):
            raise ValueError(f"answer_hint must be a bool, got {answer_hint!r}")
        min_size = max(4, image_size // 6) if min_size is None else min_size
        max_size = max(min_size, image_size // 3) if max_size is None else max_size
        super().__init__(num_envs, image_size, min_shapes, max_shapes, min_size, max_size, device=device)
        self.questions = tuple(dict.fromkeys(questions))
        self.answer_hint = answer_hint
        self._answers = [""] * num_envs  # the right letter per world
        self._kinds = [""] * num_envs  # the question's kind per world
        self._options: list[tuple[str, ...]] = [()] * num_envs

    # ------------------------------------------------------------------------------------------------ hooks
    def draw_worlds(self, ids: list[int], seeds: list[int]) -> tuple[np.ndarray, list[str], None]:
        """Draw new scenes and questions for the worlds `ids`, each from its own seed (the `SingleStepImageEnv`
        hook)."""
        images = np.empty((len(ids), self.image_size, self.image_size, 3), dtype=np.uint8)  # [K, H, W, 3]
        instructions = []
        for row, (i, world_seed) in enumerate(zip(ids, seeds)):
            images[row], scene = self._draw_world(world_seed)
            self.scenes[i] = scene
            # The question's own generator: the scene stays the grounding env's for the same seed.
            rng = np.random.default_rng([world_seed % 2**63, 0x5155])
            kind, stem, options, right = _question(scene.shapes, self.questions, rng)
            order = [options[int(j)] for j in rng.permutation(len(options))]
            listed = " ".join(f"({LETTERS[k]}) {option}" for k, option in enumerate(order))
            hint = " Answer with the letter of your choice in <answer></answer>." if self.answer_hint else ""
            instructions.append(f"{stem} {listed}{hint}")
            self._answers[i] = LETTERS[order.index(right)]
            self._kinds[i] = kind
            self._options[i] = tuple(order)
        return images, instructions, None

    def score(self, texts: list[str]) -> tuple[torch.Tensor, dict]:
        """Score one answer per world (the `SingleStepImageEnv` hook; `step` ends every episode after it).

        Args:
            texts: N answers, ideally `<answer>B</answer>`.

        Returns:
            Reward `[N]` (1 for the right letter, else 0) and info: `reward_components` (`correct`: `[N]`),
            `reasons` (N strings, "" where right), `success` (`[N]` bool) and `task` (N question kinds).
        """
        correct, reasons = [], []
        for text, answer, options in zip(texts, self._answers, self._options):
            picked = parse_choice(text, LETTERS[: len(options)])
            right = picked.letter == answer
            correct.append(float(right))
            if picked.letter is None:
                reasons.append(picked.reason)
            elif not right:
                reasons.append(f"picked ({picked.letter}) {options[LETTERS.index(picked.letter)]}")
            else:
                reasons.append("")
        reward = torch.tensor(correct, dtype=torch.float32)  # [N]
        info = {
            "reward_components": {"correct": reward.clone()},
            "reasons": reasons,
            "success": reward > 0,
            "task": list(self._kinds),
        }
        return reward, info

    @property
    def reward_target_names(self) -> tuple[str, ...]:
        return ("answer",)

    def reward_targets(self) -> dict[str, list[str]]:
        """The right letters by the name the `multiple_choice` reward reads them (`answer`)."""
        return {"answer": list(self._answers)}

    def expert_action(self, noise: float = 0.0, generator: torch.Generator | None = None) -> list[str]:
        """Each world's right letter as `<answer>X</answer>`, for an SFT cold start.

        Args:
            noise: The probability that a world answers another option instead, in [0, 1].
            generator: Source of that randomness; required when `noise > 0`.

        Returns:
            N answer strings.

        Raises:
            ValueError: `noise` is outside [0, 1], or `noise > 0` without a generator.
            RuntimeError: Some world was never reset.
        """
        check_expert_noise(noise, generator, [i for i, answer in enumerate(self._answers) if not answer])
        answers = []
        for answer, options in zip(self._answers, self._options):
            if noise > 0 and float(torch.rand((), generator=generator)) < noise:
                wrong = [LETTERS[k] for k in range(len(options)) if LETTERS[k] != answer]
                answer = wrong[int(torch.randint(len(wrong), (), generator=generator))]
            answers.append(f"<answer>{answer}</answer>")
        return answers


def _question(shapes, kinds: tuple[str, ...], rng: np.random.Generator) -> tuple[str, str, tuple[str, ...], str]:
    """(kind, question stem, options, right option) for a scene, drawn among the kinds the scene can ask."""
    by_kind, by_colour = Counter(s.kind for s in shapes), Counter(s.colour for s in shapes)
    unique_kind = [s for s in shapes if by_kind[s.kind] == 1]
    unique_colour = [s for s in shapes if by_colour[s.colour] == 1]
    possible = [
        k for k in kinds if k == "count" or (k == "colour" and unique_kind) or (k == "shape" and unique_colour)
    ]
    if not possible:  # e.g. only `colour` asked of a scene whose kinds all repeat: ask the count instead
        possible = ["count"]
    kind = possible[int(rng.integers(len(possible)))]
    if kind == "colour":
        shape = unique_kind[int(rng.integers(len(unique_kind)))]
        return kind, f"What colour is the {shape.kind}?", tuple(COLOURS), shape.colour
    if kind == "shape":
        shape = unique_colour[int(rng.integers(len(unique_colour)))]
        return kind, f"Which shape is {shape.colour}?", KINDS, shape.kind
    return kind, "How many shapes are in the image?", COUNTS, str(len(shapes))
