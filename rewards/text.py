"""Rewards that read only the completion text: format, exact match, multiple choice, numbers, length.

The answer compared is `answer_region(completion)`: think blocks removed, then the last `<answer>` tag's content if
there is one. A target of None means the reward does not apply to that row, which scores NaN (see
`rewards.combine`); an answer that does not parse scores 0.0.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence

import torch

from rewards.catalog import REWARDS
from rewards.parse import answer_region, parse_box, parse_choice, parse_number, strip_think
from rewards.parse.answer import ANSWER_TAG
from rewards.parse.geometry import parse_region


@REWARDS.register("format")
def format_reward(texts: list[str], *, require_answer_tag: bool = True) -> torch.Tensor:
    """1.0 where a completion, after `strip_think`, is an answer in the expected shape, else 0.0.

    With `require_answer_tag`, the text must be exactly one `<answer>...</answer>` with nothing but whitespace around
    it, and its content must hold a box that `parse_box` accepts. Without it, `parse_box` must accept the text.

    Args:
        texts: R completions.
        require_answer_tag: whether the box has to sit in an answer tag.

    Returns:
        `[R]` float32 of 0.0 and 1.0.
    """
    if require_answer_tag:
        scores = [float(_is_tagged_box(text)) for text in texts]
    else:
        scores = [float(parse_box(text).box is not None) for text in texts]
    return torch.tensor(scores, dtype=torch.float32)  # [R]


_THINK_ANSWER = re.compile(r"\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*", re.DOTALL)


@REWARDS.register("think_answer_format")
def think_answer_format_reward(texts: list[str]) -> torch.Tensor:
    """1.0 where a completion is exactly `<think>...</think><answer>...</answer>` (DeepSeek-R1's format), else 0.0.

    Both parts must be non-empty and appear once each, the think first, with nothing but whitespace around and
    between them; what the answer holds is the task reward's business.

    >>> think_answer_format_reward(["<think>left of it</think> <answer>[1,2,3,4]</answer>", "<answer>1</answer>"])
    tensor([1., 0.])
    """
    return torch.tensor([float(think_answer_problem(text) == "") for text in texts], dtype=torch.float32)  # [R]


def think_answer_problem(text: str) -> str:
    """Why a completion is not DeepSeek-R1's `<think>...</think><answer>...</answer>` ("" when it is): the reason
    `think_answer_format_reward` scores 0.

    >>> think_answer_problem("<answer>[1, 2, 3, 4]</answer>")
    'no <think>...</think> block before the answer'
    """
    if not isinstance(text, str):
        return "input is not a string"
    match = _THINK_ANSWER.fullmatch(text)
    if match is None:
        if "<think>" not in text:
            return "no <think>...</think> block before the answer"
        if "</think>" not in text:
            return "the <think> block is never closed"
        if "<answer>" not in text.rsplit("</think>", 1)[-1] or "</answer>" not in text.rsplit("</think>", 1)[-1]:
            return "no <answer>...</answer> after the think block"
        return "text outside <think>...</think><answer>...</answer>"
    if match["think"].strip() == "" or match["answer"].strip() == "":
        return f"the <{'think' if match['think'].strip() == '' else 'answer'}> block is empty"
    if "<think>" in match["think"] + match["answer"] or "<answer>" in match["answer"]:
        return "a tag opened twice"
    return ""


def _is_tagged_box(text: str) -> bool:
    if not isinstance(text, str):
        return False
    body = strip_think(text).strip()
    tags = list(ANSWER_TAG.finditer(body))
    if len(tags) != 2:
        return False
    open_tag, close_tag = tags
    if open_tag.group(1) or not close_tag.group(1) or open_tag.start() != 0 or close_tag.end() != len(body):
        return False
    return parse_region(body[open_tag.end() : close_tag.start()]).box is not None


# --------------------------------------------------------------------------------------------------------------------
# Exact match
# --------------------------------------------------------------------------------------------------------------------

_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD-style answer normalisation: lower case, no ASCII punctuation, no articles, single spaces.

    >>> normalize_answer("  The Eiffel-Tower! ")
    'eiffeltower'
    """
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _applicable(answer: Sequence[object], completions: Sequence[str]) -> list[bool]:
    if len(answer) != len(completions):
        raise ValueError(f"got {len(completions)} completions and {len(answer)} answers")
    return [a is not None for a in answer]


def _scores(values: list[float], applicable: list[bool]) -> torch.Tensor:
    return torch.tensor([v if ok else math.nan for v, ok in zip(values, applicable)], dtype=torch.float32)  # [R]


@REWARDS.register("exact_match")
def exact_match(
    completions: list[str], answer: Sequence[str | Sequence[str] | None], *, normalize: bool = True
) -> torch.Tensor:
    """1.0 where the completion's answer equals the target (or one of several accepted targets), else 0.0.

    Args:
        completions: R completions; the answer is `answer_region(completion)`, stripped.
        answer: R targets: a string, a list of accepted strings, or None (no target: NaN).
        normalize: compare after `normalize_answer` (case, punctuation, articles, spacing); else exact strings.

    Returns:
        `[R]` float32 of 0.0 and 1.0, NaN where there is no target.
    """
    applicable = _applicable(answer, completions)

    def norm(text: str) -> str:
        return normalize_answer(text) if normalize else text.strip()

    values = []
    for text, target in zip(completions, answer):
        if target is None or not isinstance(text, str):
            values.append(0.0)
            continue
        accepted = {norm(target)} if isinstance(target, str) else {norm(t) for t in target}
        values.append(float(norm(answer_region(text)) in accepted))
    return _scores(values, applicable)


# --------------------------------------------------------------------------------------------------------------------
# Multiple choice
# --------------------------------------------------------------------------------------------------------------------


@REWARDS.register("multiple_choice")
def multiple_choice(completions: list[str], answer: Sequence[str | None], *, choices: str = "ABCDE") -> torch.Tensor:
    """1.0 where the letter `parse_choice` reads from the completion is the target letter, else 0.0.

    Args:
        completions: R completions ("(B)", "B.", "answer: b", "<answer>B</answer>", ...).
        answer: R target letters, read by `parse_choice` too ("B", "(b)"); None for no target (NaN).
        choices: the valid letters.

    Returns:
        `[R]` float32 of 0.0 and 1.0, NaN where there is no target.

    Raises:
        ValueError: A target names no letter among `choices`.
    """
    applicable = _applicable(answer, completions)
    values = []
    for i, (text, target) in enumerate(zip(completions, answer)):
        if target is None:
            values.append(0.0)
            continue
        wanted = parse_choice(target, choices)
        if wanted.letter is None:
            raise ValueError(f"answer[{i}] = {target!r} is no choice among {choices}: {wanted.reason}")
        values.append(float(parse_choice(text, choices).letter == wanted.letter))
    return _scores(values, applicable)


# --------------------------------------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------------------------------------


@REWARDS.register("numeric_match")
def numeric_match(
    completions: list[str],
    answer: Sequence[str | float | None],
    *,
    rel_tol: float = 1e-6,
    abs_tol: float = 1e-9,
) -> torch.Tensor:
    """1.0 where the completion's final number (`parse_number`) equals the target within tolerance, else 0.0.

    A match is `|pred - target| <= max(rel_tol * |target|, abs_tol)`, relative to the target as in ChartQA's
    "relaxed accuracy" (which is `rel_tol=0.05`). When exactly one side is a percentage, the other reading also
    counts: "45%" matches 0.45 and "0.45" matches "45%".

    Args:
        completions: R completions.
        answer: R targets: numbers, strings that `parse_number` reads ("1,234", "45%", "-2.5e3"), or None (NaN).
        rel_tol: relative tolerance.
        abs_tol: absolute tolerance.

    Returns:
        `[R]` float32 of 0.0 and 1.0, NaN where there is no target.

    Raises:
        ValueError: A target string holds no number.
    """
    applicable = _applicable(answer, completions)
    target_values, target_percent = [], []
    for i, target in enumerate(answer):
        if target is None:
            target_values.append(math.nan)
            target_percent.append(False)
        elif isinstance(target, str):
            parsed = parse_number(target)
            if parsed.value is None:
                raise ValueError(f"answer[{i}] = {target!r} holds no number: {parsed.reason}")
            target_values.append(parsed.value)
            target_percent.append(parsed.percent)
        else:
            target_values.append(float(target))
            target_percent.append(False)
    parses = [parse_number(text) for text in completions]
    pred = torch.tensor([math.nan if p.value is None else p.value for p in parses], dtype=torch.float64)  # [R]
    pred_percent = torch.tensor([p.percent for p in parses], dtype=torch.bool)  # [R]
    target = torch.tensor(target_values, dtype=torch.float64)  # [R]
    target_pct = torch.tensor(target_percent, dtype=torch.bool)  # [R]
    tol = torch.clamp(rel_tol * target.abs(), min=abs_tol)  # [R]
    # The other reading of a percentage: pred "45%" against target 0.45, or pred 0.45 against target "45%".
    other = torch.where(
        pred_percent & ~target_pct, pred / 100, torch.where(target_pct & ~pred_percent, pred * 100, pred)
    )
    hit = ((pred - target).abs() <= tol) | ((other - target).abs() <= tol)  # [R], False where pred is NaN
    return _scores(hit.float().tolist(), applicable)


# --------------------------------------------------------------------------------------------------------------------
# Length
# --------------------------------------------------------------------------------------------------------------------


def length_penalty(lengths: torch.Tensor, target_length: float, max_length: float) -> torch.Tensor:
    """A linear penalty for running past a target length: 0 up to `target_length`, -1 at `max_length` and beyond.

        0                                                    if L <= target_length
        (target_length - L) / (max_length - target_length)   if target_length < L < max_length
        -1                                                   if L >= max_length

    Added to a correctness reward (weight > 0), it makes a long right answer worth less than a short one without
    ever making it worth less than a wrong one when the weight is below the correctness reward's. It is DAPO's soft
    overlong punishment (https://arxiv.org/abs/2503.14476) with `target_length = L_max - L_cache`.

    Args:
        lengths: `[R]` completion lengths (tokens, or any unit the two limits share).
        target_length: the length the penalty starts at.
        max_length: the length at which it reaches -1; > target_length.

    Returns:
        `[R]` float32 or wider, in [-1, 0].
    """
    if not max_length > target_length:
        raise ValueError(f"need max_length > target_length, got {max_length} and {target_length}")
    lengths = lengths.to(torch.promote_types(lengths.dtype, torch.float32))
    return ((target_length - lengths) / (max_length - target_length)).clamp(-1.0, 0.0)  # [R]


@REWARDS.register("length_penalty")
def length_penalty_reward(
    completions: list[str],
    *,
    target_length: float,
    max_length: float,
    completion_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """`length_penalty` of each completion's length.

    Args:
        completions: R completions.
        target_length: as in `length_penalty`, in the unit of the lengths used.
        max_length: as in `length_penalty`.
        completion_lengths: `[R]` lengths in tokens (`completion_mask.sum(-1)`); when None, the length of each
            completion in characters is used, so the two limits are then in characters.

    Returns:
        `[R]` in [-1, 0]; applies to every row.
    """
    if completion_lengths is None:
        completion_lengths = torch.tensor([len(text) for text in completions], dtype=torch.float32)
    return length_penalty(completion_lengths, target_length, max_length)
