"""Answer consistency: which answer a completion gives, a question's options and their shuffles, ACRE's reward.

Three consistency methods read answers this way (the training side lives in `mmrl.consistency`):

* **TTRV** (label-free test-time RL, https://arxiv.org/abs/2510.06783) compares the answers of a group with each
  other: `answer_keys` turns each completion into a comparable key (its letter choice, or its normalised answer text).
* **ACRE** (answer-consistency verification, https://arxiv.org/abs/2510.10104) re-asks a multiple-choice question
  with its options shuffled: `split_options` reads the options out of the question, `shuffled_question` writes them
  in another order, and `consistency_verified_reward` scores the two answers.
* **GRPO-CARE** (https://arxiv.org/abs/2506.16141) scores how likely the answer is given the reasoning:
  `reasoning_of` is the reasoning part of a completion.

Options are written inline in the question, each as `(X) text` with X = A, B, C, ...:
`"Which shape is red? (A) circle (B) square (C) triangle"` (see `scripts/make_choice_dataset.py`).
"""

from __future__ import annotations

import re
from typing import Literal

import torch

from rewards.parse import answer_region, extract_answer, parse_choice, strip_think

LETTERS = "ABCDEFGHIJ"
_OPTION = re.compile(r"\(([A-J])\)\s*")
_SPACES = re.compile(r"\s+")


def answer_keys(texts: list[str], kind: Literal["choice", "text"] = "choice") -> list[str | None]:
    """The answer each completion gives, as a key equal for equal answers; None where none can be read.

    Args:
        texts: R completions.
        kind: `choice`: the letter `parse_choice` reads ("B"); `text`: the answer region (`answer_region`),
            lower-cased with runs of whitespace collapsed ("" counts as no answer).

    Returns:
        R keys.
    """
    if kind == "choice":
        return [parse_choice(text).letter for text in texts]
    if kind != "text":
        raise ValueError(f"kind must be 'choice' or 'text', got {kind!r}")
    keys = []
    for text in texts:
        key = _SPACES.sub(" ", answer_region(text) if isinstance(text, str) else "").strip().lower()
        keys.append(key or None)
    return keys


def split_options(question: str) -> tuple[str, list[str]]:
    """The stem and the options of a question whose options are written `(A) ... (B) ...` in order.

    >>> split_options("Which shape is red? (A) circle (B) square (C) triangle")
    ('Which shape is red?', ['circle', 'square', 'triangle'])

    Raises:
        ValueError: Fewer than two options, or letters not A, B, C, ... in order.
    """
    marks = list(_OPTION.finditer(question))
    letters = "".join(m.group(1) for m in marks)
    if len(marks) < 2 or letters != LETTERS[: len(marks)]:
        raise ValueError(f"question {question!r} lists no options written (A) ... (B) ... in order")
    stem = question[: marks[0].start()].strip()
    ends = [m.start() for m in marks[1:]] + [len(question)]
    return stem, [question[m.end() : end].strip() for m, end in zip(marks, ends)]


def shuffled_question(stem: str, options: list[str], order: list[int]) -> str:
    """The question with option `order[k]` listed at letter k (`order` a permutation of the options' indices)."""
    if sorted(order) != list(range(len(options))):
        raise ValueError(f"order {order} is no permutation of {len(options)} options")
    listed = " ".join(f"({LETTERS[k]}) {options[i]}" for k, i in enumerate(order))
    return f"{stem} {listed}"


def reasoning_of(text: str) -> str:
    """The reasoning of a completion: its think block's content if it has one, else the text before its last answer
    tag (the whole text without one), stripped."""
    think = re.search(r"<think>(.*?)</think>", text, flags=re.IGNORECASE | re.DOTALL)
    if think is not None:
        return think.group(1).strip()
    body = strip_think(text)
    if extract_answer(body) is None:
        return body.strip()
    return body[: body.lower().rfind("<answer>")].strip()


def consistency_verified_reward(
    first_correct: torch.Tensor, consistent: torch.Tensor, *, partial: float = 0.5
) -> torch.Tensor:
    """ACRE's consistency-verification reward (https://arxiv.org/abs/2510.10104): the full reward only when the first
    answer is correct and the answer after the shuffle agrees with it (so both are correct); a correct first answer
    that the shuffle overturns gets `partial`; a wrong first answer gets 0 whatever the second.

    The paper grants "a high reward only if both the original and the post-shuffle answers agree and are correct;
    otherwise, a lower reward"; the values here (1, `partial`, 0) are this module's.

    Args:
        first_correct: `[N]` bool, the first answer is correct.
        consistent: `[N]` bool, the second answer picks the same option (by content, not letter) as the first.
        partial: the reward of a correct first answer that the shuffle overturns, in [0, 1].

    Returns:
        `[N]` float32.
    """
    if not 0.0 <= partial <= 1.0:
        raise ValueError(f"partial must be in [0, 1], got {partial}")
    first_correct, consistent = first_correct.bool(), consistent.bool()
    full = (first_correct & consistent).float()
    return full + partial * (first_correct & ~consistent).float()
