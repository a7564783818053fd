"""Reading answers out of untrusted model text.

Everything here is total: any string in gives a result out, and malformed text is a `BoxParse` with `box=None` and
a reason, never an exception. Tags are found with literal regexes and numbers with a one-pass tokenizer, so the
cost is linear in the input; the box search itself looks at no more than `MAX_BOX_CHARS` characters.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

MAX_BOX_CHARS = 10_000
"""Only this many characters of the answer (or of the whole think-stripped text) are searched for a box."""

_FLOAT32_MAX = 3.4028234663852886e38  # a larger coordinate would turn into inf in the float32 box tensor

_THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)
_ANSWER_TAG = re.compile(r"<(/?)answer>", re.IGNORECASE)
_BOX_START, _BOX_END = "<|box_start|>", "<|box_end|>"  # Qwen2-VL special tokens, case-sensitive like all tokens

# One pass, one token per match, no nested quantifiers: linear time on any input. ASCII digits only, so every
# number token is something `float` accepts; a sign before a letter keeps "-inf" and "-nan" together.
_TOKEN = re.compile(
    r"(?P<num>[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)"
    r"|(?P<word>[-+]?[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<space>\s+)"
    r"|(?P<char>.)",
    re.DOTALL,
)
_NON_FINITE_WORDS = frozenset({"nan", "inf", "infinity"})
_PUNCT = frozenset("[](),{}:")

# The box forms, matched on the token signature: n = number, b = the bbox_2d key, q = a quote, w = a word,
# o = any other character; brackets, parentheses, braces, commas and colons stand for themselves.
_RUN = re.compile(r"n(?:,n)*")  # [x1, y1, x2, y2], (x1, y1, x2, y2), bare x1, y1, x2, y2
_POINT_PAIR = re.compile(r"\(n,n\),?\(n,n\)|\[n,n\],?\[n,n\]")  # (x1,y1),(x2,y2) and [[x1,y1],[x2,y2]]
_BBOX_KEY = re.compile(r"bq?:\[")  # "bbox_2d": [   (the key opens the list that follows)
_NUMBER_LIST = re.compile(r"\[n(?:,n)*\]")


@dataclass(frozen=True)
class BoxParse:
    """One parsed box, or the reason there is none.

    Attributes:
        box: `(x1, y1, x2, y2)` with `x1 < x2` and `y1 < y2`, finite and within float32 range; None if no box.
        reason: why `box` is None; "" when a box was parsed.
    """

    box: tuple[float, float, float, float] | None
    reason: str


def strip_think(text: str) -> str:
    """Removes `<think>...</think>` blocks (tags matched case-insensitively).

    Three cases beyond the plain block: when the first think tag is a `</think>`, the chat template opened the
    block in the prompt, so everything up to and including it is dropped; a `<think>` that is never closed swallows
    the rest of the text (an answer written while still thinking does not count); any other stray `</think>` outside
    a block stays in the text, so format checks see it.

    Args:
        text: one completion.

    Returns:
        The text with the reasoning removed; surrounding whitespace is kept.
    """
    pieces = []
    pos = 0
    inside = False
    for i, tag in enumerate(_THINK_TAG.finditer(text)):
        closing = bool(tag.group(1))
        if i == 0 and closing:
            pos = tag.end()
        elif not inside and not closing:
            pieces.append(text[pos : tag.start()])
            inside = True
        elif inside and closing:
            inside = False
            pos = tag.end()
    if not inside:
        pieces.append(text[pos:])
    return "".join(pieces)


def extract_answer(text: str) -> str | None:
    """Returns the content of the last complete `<answer>...</answer>` pair (tags case-insensitive).

    The pair is the last `</answer>` that closes an opened tag, with the nearest `<answer>` before it, so an
    unterminated trailing `<answer>` is ignored. Think blocks are not removed here; `parse_box` strips them first.

    Args:
        text: one completion.

    Returns:
        The stripped content, or None if the text holds no complete pair.
    """
    opened_at = None
    last = None
    for tag in _ANSWER_TAG.finditer(text):
        if not tag.group(1):
            opened_at = tag.end()
        elif opened_at is not None:
            last = (opened_at, tag.start())
            opened_at = None
    return None if last is None else text[last[0] : last[1]].strip()


def parse_box(text: str, *, normalized_1000: bool = False, scale: tuple[float, float] | None = None) -> BoxParse:
    """Finds one `x1, y1, x2, y2` box in free model output.

    The search runs on the content of the last `<answer>` tag if there is one, else on the whole text, in both
    cases after `strip_think`, and on at most `MAX_BOX_CHARS` characters. Accepted forms, first match wins:

    * Qwen2-VL `<|box_start|>(x1,y1),(x2,y2)<|box_end|>`: when present, only its content is searched;
    * a `"bbox_2d": [x1, y1, x2, y2]` key as in Qwen2.5-VL JSON (in a list of objects, the first one);
    * otherwise the earliest of `[x1, y1, x2, y2]`, `(x1, y1, x2, y2)`, bare `x1, y1, x2, y2`, `(x1,y1),(x2,y2)`
      and `[[x1,y1],[x2,y2]]`. Numbers are comma-separated ints or floats; spaces are free.

    Swapped corners are reordered. A run of other than four numbers, a non-finite number or a box with zero width or
    height gives `box=None` with the reason.

    Args:
        text: one completion.
        normalized_1000: the model writes coordinates on a 0-1000 grid (Qwen2-VL). Without `scale` the box stays
            on that grid.
        scale: with `normalized_1000`, the image `(width, height)` in pixels, mapping `x -> x * width / 1000`; without
            it, `(sx, sy)` multipliers for x and y (for a box predicted on a resized image).

    Returns:
        The box, or None and the reason.
    """
    if not isinstance(text, str):
        return BoxParse(None, "input is not a string")
    body = strip_think(text)
    answer = extract_answer(body)
    return _parse_region(body if answer is None else answer, normalized_1000=normalized_1000, scale=scale)


def parse_boxes(texts: list[str], **kwargs) -> tuple[torch.Tensor, list[str]]:
    """Runs `parse_box` over a batch.

    Args:
        texts: R completions.
        **kwargs: `normalized_1000` and `scale`, passed to `parse_box`.

    Returns:
        boxes: `[R, 4]` float32 xyxy, NaN rows where nothing parsed (which `box_iou` scores 0).
        reasons: R strings, "" where a box parsed.
    """
    parses = [parse_box(text, **kwargs) for text in texts]
    nan_row = (math.nan,) * 4
    boxes = torch.tensor([nan_row if p.box is None else p.box for p in parses], dtype=torch.float32)  # [R, 4]
    return boxes.reshape(-1, 4), [p.reason for p in parses]


def _parse_region(region: str, *, normalized_1000: bool = False, scale: tuple[float, float] | None = None) -> BoxParse:
    """`parse_box` on text already reduced to the part that should hold the box.

    No tags are looked at here but Qwen2-VL's box tokens.
    """
    region = region[:MAX_BOX_CHARS]
    start = region.find(_BOX_START)
    if start >= 0:
        end = region.find(_BOX_END, start)
        region = region[start + len(_BOX_START) : end if end >= 0 else len(region)]
    numbers, reason = _find_numbers(region)
    if numbers is None:
        return BoxParse(None, reason)
    return _checked_box(numbers, normalized_1000=normalized_1000, scale=scale)


def _tokenize(text: str) -> tuple[str, list[float]]:
    """Returns the token signature and each token's number value.

    The signature has one letter per token (see the form regexes); the value is NaN for tokens that are not numbers.
    """
    signature = []
    values = []
    for token in _TOKEN.finditer(text):
        kind = token.lastgroup
        if kind == "space":
            continue
        piece = token.group()
        value = math.nan
        if kind == "num" or (kind == "word" and piece.lstrip("+-").lower() in _NON_FINITE_WORDS):
            letter = "n"
            try:
                value = float(piece)
            except ValueError:  # not reachable with the ASCII patterns above; a NaN still fails the finite check
                pass
        elif kind == "word":
            letter = "b" if piece.lower() == "bbox_2d" else "w"
        elif piece in _PUNCT:
            letter = piece
        elif piece in "\"'":
            letter = "q"
        else:
            letter = "o"
        signature.append(letter)
        values.append(value)
    return "".join(signature), values


def _find_numbers(region: str) -> tuple[list[float] | None, str]:
    """Picks the four numbers of the box in `region` by the priority in `parse_box`, or says why there are none."""
    signature, values = _tokenize(region)

    def numbers_in(start: int, end: int) -> list[float]:
        return [values[i] for i in range(start, end) if signature[i] == "n"]

    key = _BBOX_KEY.search(signature)
    if key is not None:
        listed = _NUMBER_LIST.match(signature, key.end() - 1)
        if listed is not None:  # the key says this list is the box, so a wrong count is an error, not a miss
            return _four_or_reason(numbers_in(listed.start(), listed.end()))

    runs = list(_RUN.finditer(signature))

    def is_clean(run: re.Match[str]) -> bool:  # "1.2.3" and "4-5" tokenize as two touching numbers
        return (run.start() == 0 or signature[run.start() - 1] != "n") and (
            run.end() == len(signature) or signature[run.end()] != "n"
        )

    run4 = next((r for r in runs if is_clean(r) and r.group().count("n") == 4), None)
    pair = _POINT_PAIR.search(signature)
    found = [m for m in (run4, pair) if m is not None]
    if found:
        first = min(found, key=lambda m: m.start())
        return numbers_in(first.start(), first.end()), ""

    # No box: report the nearest miss, a run of several numbers, rather than a lone number in the prose.
    miss = next((r for r in runs if r.group().count("n") >= 2), None)
    if miss is None:
        return None, "no box found"
    if not is_clean(miss):
        return None, "malformed number list"
    return _four_or_reason(numbers_in(miss.start(), miss.end()))


def _four_or_reason(numbers: list[float]) -> tuple[list[float] | None, str]:
    if len(numbers) == 4:
        return numbers, ""
    return None, f"box has {len(numbers)} number{'' if len(numbers) == 1 else 's'}, need 4"


def _checked_box(numbers: list[float], *, normalized_1000: bool, scale: tuple[float, float] | None) -> BoxParse:
    """Scales, reorders and validates four coordinates."""
    x1, y1, x2, y2 = numbers
    if scale is not None:
        sx, sy = scale
        if normalized_1000:
            x1, x2, y1, y2 = x1 * sx / 1000, x2 * sx / 1000, y1 * sy / 1000, y2 * sy / 1000
        else:
            x1, x2, y1, y2 = x1 * sx, x2 * sx, y1 * sy, y2 * sy
    if not all(math.isfinite(v) and abs(v) <= _FLOAT32_MAX for v in (x1, y1, x2, y2)):
        return BoxParse(None, "box has non-finite numbers")
    x1, x2 = min(x1, x2), max(x1, x2)
    y1, y2 = min(y1, y2), max(y1, y2)
    if x1 == x2 or y1 == y2:
        return BoxParse(None, "degenerate box (zero area)")
    return BoxParse((float(x1), float(y1), float(x2), float(y2)), "")
