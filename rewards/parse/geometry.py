"""Boxes, box lists and points in free model output, and mapping coordinates between image sizes.

`parse_box`, `parse_point` and `parse_box_list` read `answer_region(text)` (at most `MAX_BOX_CHARS`, box lists
`MAX_BOX_LIST_CHARS`, characters of it) with a one-pass tokenizer and regexes over the token signature, so the cost
is linear in the input; malformed text is a result with `None` and a reason, never an exception.
`rescale_boxes` and `rescale_points` map what was parsed from one image size to another.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from rewards.parse.answer import MAX_BOX_CHARS, answer_region

MAX_BOX_LIST_CHARS = 50_000
"""Only this many characters of the answer are searched by `parse_box_list` (a detection answer lists many boxes)."""

_FLOAT32_MAX = 3.4028234663852886e38  # a larger coordinate would turn into inf in the float32 box tensor
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
_POINT_KEYS = frozenset({"point_2d", "point", "coordinate", "coordinates", "position"})
_PUNCT = frozenset("[](),{}:")

# The box forms, matched on the token signature: n = number, b = the bbox_2d key, p = a point key (point_2d, ...),
# q = a quote, w = a word, o = any other character; brackets, parentheses, braces, commas and colons stand for
# themselves.
_RUN = re.compile(r"n(?:,n)*")  # [x1, y1, x2, y2], (x1, y1, x2, y2), bare x1, y1, x2, y2
_POINT_PAIR = re.compile(r"\(n,n\),?\(n,n\)|\[n,n\],?\[n,n\]")  # (x1,y1),(x2,y2) and [[x1,y1],[x2,y2]]
_BBOX_KEY = re.compile(r"bq?:\[")  # "bbox_2d": [   (the key opens the list that follows)
_NUMBER_LIST = re.compile(r"\[n(?:,n)*\]")
_POINT_KEY = re.compile(r"pq?:[\[(]")  # "point_2d": [   or   'coordinate': (
_NUMBER_TUPLE = re.compile(r"[\[(]n(?:,n)*[\])]")
_BRACKETED_POINT = re.compile(r"[\[(]n,n[\])]")  # [x, y] and (x, y)
# One box of a list, in the forms parse_box accepts inside brackets; [[x1,y1],[x2,y2]] is found at its inner "[".
_LISTED_BOX = re.compile(r"\[n,n,n,n\]|\(n,n,n,n\)|\(n,n\),?\(n,n\)|\[n,n\],?\[n,n\]")


@dataclass(frozen=True)
class BoxParse:
    """One parsed box, or the reason there is none.

    Attributes:
        box: `(x1, y1, x2, y2)` with `x1 < x2` and `y1 < y2`, finite and within float32 range; None if no box.
        reason: why `box` is None; "" when a box was parsed.
    """

    box: tuple[float, float, float, float] | None
    reason: str


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
    return parse_region(answer_region(text), normalized_1000=normalized_1000, scale=scale)


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


def parse_region(region: str, *, normalized_1000: bool = False, scale: tuple[float, float] | None = None) -> BoxParse:
    """`parse_box` on text already reduced to the part that should hold the box.

    No tags are looked at here but Qwen2-VL's box tokens.
    """
    numbers, reason = find_numbers(box_token_content(region[:MAX_BOX_CHARS]))
    if numbers is None:
        return BoxParse(None, reason)
    return _checked_box(numbers, normalized_1000=normalized_1000, scale=scale)


def box_token_content(region: str) -> str:
    """The content of the first Qwen2-VL `<|box_start|>...<|box_end|>` pair (to the end if unclosed), else `region`."""
    start = region.find(_BOX_START)
    if start < 0:
        return region
    end = region.find(_BOX_END, start)
    return region[start + len(_BOX_START) : end if end >= 0 else len(region)]


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
            word = piece.lower()
            letter = "b" if word == "bbox_2d" else "p" if word in _POINT_KEYS else "w"
        elif piece in _PUNCT:
            letter = piece
        elif piece in "\"'":
            letter = "q"
        else:
            letter = "o"
        signature.append(letter)
        values.append(value)
    return "".join(signature), values


def find_numbers(region: str) -> tuple[list[float] | None, str]:
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


def _scaled_pair(
    x: float, y: float, *, normalized_1000: bool, scale: tuple[float, float] | None
) -> tuple[float, float] | None:
    """Scales one `(x, y)` like `_checked_box` does; None if a coordinate is non-finite or beyond float32."""
    if scale is not None:
        sx, sy = scale
        x, y = (x * sx / 1000, y * sy / 1000) if normalized_1000 else (x * sx, y * sy)
    if not all(math.isfinite(v) and abs(v) <= _FLOAT32_MAX for v in (x, y)):
        return None
    return float(x), float(y)


# --------------------------------------------------------------------------------------------------------------------
# Points
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PointParse:
    """One parsed point, or the reason there is none.

    Attributes:
        point: `(x, y)`, finite and within float32 range; None if no point.
        reason: why `point` is None; "" when a point was parsed.
    """

    point: tuple[float, float] | None
    reason: str


def parse_point(text: str, *, normalized_1000: bool = False, scale: tuple[float, float] | None = None) -> PointParse:
    """Finds one `(x, y)` point in free model output (GUI grounding, pointing).

    The search runs on `answer_region(text)` (at most `MAX_BOX_CHARS` characters) and, when Qwen2-VL box tokens are
    present, only inside the first `<|box_start|>...<|box_end|>`. Accepted forms, first match wins:

    * a point key with a list: `{"point_2d": [x, y]}`, also `point`, `coordinate`, `coordinates`, `position` (the key
      decides, so a list of other than two numbers after it is an error, not a miss);
    * the earliest `(x, y)` or `[x, y]` (`<|box_start|>(x,y)<|box_end|>` is this form inside the tokens);
    * an answer that is nothing but `x, y`.

    A box where a point was asked for (`[x1, y1, x2, y2]`, `(x1,y1),(x2,y2)`) is `point=None` with the reason
    "found a box, not a point": callers that accept boxes (`point_in_box_reward`) take the centre themselves.

    Args:
        text: one completion.
        normalized_1000: the model writes coordinates on a 0-1000 grid (Qwen2-VL); see `parse_box`.
        scale: as in `parse_box`: the image `(width, height)` with `normalized_1000`, else `(sx, sy)` multipliers.

    Returns:
        The point, or None and the reason.
    """
    if not isinstance(text, str):
        return PointParse(None, "input is not a string")
    region = box_token_content(answer_region(text)[:MAX_BOX_CHARS])
    numbers, reason = find_point_numbers(region)
    if numbers is None:
        return PointParse(None, reason)
    point = _scaled_pair(*numbers, normalized_1000=normalized_1000, scale=scale)
    return PointParse(None, "point has non-finite numbers") if point is None else PointParse(point, "")


def parse_points(texts: list[str], **kwargs) -> tuple[torch.Tensor, list[str]]:
    """Runs `parse_point` over a batch.

    Args:
        texts: R completions.
        **kwargs: `normalized_1000` and `scale`, passed to `parse_point`.

    Returns:
        points: `[R, 2]` float32 `(x, y)`, NaN rows where nothing parsed (which `point_in_box` scores 0).
        reasons: R strings, "" where a point parsed.
    """
    parses = [parse_point(text, **kwargs) for text in texts]
    points = torch.tensor([(math.nan, math.nan) if p.point is None else p.point for p in parses], dtype=torch.float32)
    return points.reshape(-1, 2), [p.reason for p in parses]  # [R, 2]


def find_point_numbers(region: str) -> tuple[tuple[float, float] | None, str]:
    signature, values = _tokenize(region)

    def numbers_in(match: re.Match[str]) -> list[float]:
        return [values[i] for i in range(match.start(), match.end()) if signature[i] == "n"]

    key = _POINT_KEY.search(signature)
    if key is not None:
        listed = _NUMBER_TUPLE.match(signature, key.end() - 1)
        if listed is not None:
            numbers = numbers_in(listed)
            if len(numbers) != 2:
                return None, f"point has {len(numbers)} number{'' if len(numbers) == 1 else 's'}, need 2"
            return (numbers[0], numbers[1]), ""
    pair = _BRACKETED_POINT.search(signature)
    if pair is not None and _POINT_PAIR.match(signature, pair.start()) is None:
        x, y = numbers_in(pair)
        return (x, y), ""
    if signature == "n,n":  # the whole answer is "x, y"
        return (values[0], values[2]), ""
    if pair is not None or find_numbers(region)[0] is not None:
        return None, "found a box, not a point"
    return None, "no point found"


# --------------------------------------------------------------------------------------------------------------------
# Lists of boxes (detection)
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BoxListParse:
    """All boxes of a detection answer, or the reason there are none.

    Attributes:
        boxes: each `(x1, y1, x2, y2)` as `BoxParse.box`; `()` for an answer that lists no box (`[]`); None if the
            answer is not a box list at all.
        reason: why `boxes` is None; with boxes, "" or a note of the malformed boxes that were skipped. A skipped box
            is simply missing, so it costs recall in `matched_iou` and `detection_f1`.
    """

    boxes: tuple[tuple[float, float, float, float], ...] | None
    reason: str


def parse_box_list(
    text: str, *, normalized_1000: bool = False, scale: tuple[float, float] | None = None
) -> BoxListParse:
    """Finds every box of a detection answer, in text order.

    The search runs on `answer_region(text)`, at most `MAX_BOX_LIST_CHARS` characters. Accepted forms:

    * a JSON (or Python-quoted) list of objects with `bbox_2d` keys, as Qwen2.5-VL writes them: every key's list is
      one box (other keys such as `label` are ignored);
    * otherwise every bracketed box in the text: a list of lists `[[x1, y1, x2, y2], ...]`, tuples
      `(x1, y1, x2, y2)`, point pairs `[[x1,y1],[x2,y2]]` and Qwen2-VL `<|box_start|>(x1,y1),(x2,y2)<|box_end|>`;
    * otherwise an empty list `[]` (the model says there is nothing), or a single box in any form `parse_box` reads.

    Args:
        text: one completion.
        normalized_1000: the model writes coordinates on a 0-1000 grid (Qwen2-VL); see `parse_box`.
        scale: as in `parse_box`.

    Returns:
        The boxes, or None and the reason.
    """
    if not isinstance(text, str):
        return BoxListParse(None, "input is not a string")
    region = answer_region(text)[:MAX_BOX_LIST_CHARS]
    signature, values = _tokenize(region)

    def numbers_in(start: int, end: int) -> list[float]:
        return [values[i] for i in range(start, end) if signature[i] == "n"]

    found: list[tuple[list[float] | None, str]] = []
    keys = list(_BBOX_KEY.finditer(signature))
    if keys:
        for key in keys:
            listed = _NUMBER_LIST.match(signature, key.end() - 1)
            if listed is None:
                found.append((None, "bbox_2d is not a number list"))
            else:
                found.append(_four_or_reason(numbers_in(listed.start(), listed.end())))
    else:
        found = [(numbers_in(m.start(), m.end()), "") for m in _LISTED_BOX.finditer(signature)]
    if not found:
        if "[]" in signature:
            return BoxListParse((), "")
        single = parse_region(region, normalized_1000=normalized_1000, scale=scale)
        return BoxListParse(None, single.reason) if single.box is None else BoxListParse((single.box,), "")

    boxes = []
    skipped = []
    for numbers, reason in found:
        parsed = (
            BoxParse(None, reason)
            if numbers is None
            else _checked_box(numbers, normalized_1000=normalized_1000, scale=scale)
        )
        if parsed.box is None:
            skipped.append(parsed.reason)
        else:
            boxes.append(parsed.box)
    if not boxes:
        return BoxListParse(None, skipped[0])
    note = f"skipped {len(skipped)} malformed box{'' if len(skipped) == 1 else 'es'}: {skipped[0]}" if skipped else ""
    return BoxListParse(tuple(boxes), note)


def parse_box_lists(texts: list[str], **kwargs) -> tuple[list[torch.Tensor | None], list[str]]:
    """Runs `parse_box_list` over a batch.

    Args:
        texts: R completions.
        **kwargs: `normalized_1000` and `scale`, passed to `parse_box_list`.

    Returns:
        boxes: R entries, each `[P_i, 4]` float32 (`P_i` may be 0), or None where the text is not a box list.
        reasons: R strings, as `BoxListParse.reason`.
    """
    parses = [parse_box_list(text, **kwargs) for text in texts]
    boxes = [None if p.boxes is None else torch.tensor(p.boxes, dtype=torch.float32).reshape(-1, 4) for p in parses]
    return boxes, [p.reason for p in parses]


# --------------------------------------------------------------------------------------------------------------------
# Mapping coordinates between image sizes
# --------------------------------------------------------------------------------------------------------------------


Size = tuple[float, float] | torch.Tensor
"""An image size `(W, H)` shared by all rows, or a `[R, 2]` tensor of per-row sizes."""


def _size_factor(from_size: Size, to_size: Size, coords: torch.Tensor, repeat: int) -> torch.Tensor:
    """`to / from` per axis, shaped to broadcast against `coords` `[..., 2 * repeat]`."""
    dtype = torch.promote_types(coords.dtype, torch.float32)
    from_t = torch.as_tensor(from_size, dtype=dtype, device=coords.device)
    to_t = torch.as_tensor(to_size, dtype=dtype, device=coords.device)
    factor = to_t / from_t  # [2] or [R, 2]
    if factor.shape[-1:] != (2,) or factor.ndim > 2:
        raise ValueError(f"sizes must be (W, H) or [R, 2], got {tuple(from_t.shape)} and {tuple(to_t.shape)}")
    factor = factor.repeat(*([1] * (factor.ndim - 1)), repeat)  # [2 * repeat] or [R, 2 * repeat]
    if factor.ndim == 2:  # per row: broadcast over any middle dimensions of coords
        factor = factor.view(factor.shape[0], *([1] * (coords.ndim - 2)), 2 * repeat)
    return factor


def rescale_boxes(boxes: torch.Tensor, from_size: Size, to_size: Size) -> torch.Tensor:
    """Maps xyxy boxes from one image size to another, e.g. from the resized image the model saw to the original.

    Qwen2.5-VL answers in pixels of its resized input (a multiple of 28 px), Qwen2-VL on a 0-1000 grid
    (`from_size=(1000, 1000)`); targets usually live in the original image. `x -> x * to_W / from_W`, same for y.

    Args:
        boxes: `[R, 4]` (or `[R, ..., 4]`) boxes; NaN rows stay NaN.
        from_size: `(W, H)` shared by all rows, or `[R, 2]` per row: the size the boxes are in. Positive.
        to_size: `(W, H)` or `[R, 2]`: the size to map to.

    Returns:
        Boxes of the same shape, float32 or wider.
    """
    if boxes.shape[-1:] != (4,):
        raise ValueError(f"rescale_boxes needs [..., 4] boxes, got {tuple(boxes.shape)}")
    return boxes * _size_factor(from_size, to_size, boxes, repeat=2)


def rescale_points(points: torch.Tensor, from_size: Size, to_size: Size) -> torch.Tensor:
    """`rescale_boxes` for `[R, 2]` (or `[R, ..., 2]`) `(x, y)` points."""
    if points.shape[-1:] != (2,):
        raise ValueError(f"rescale_points needs [..., 2] points, got {tuple(points.shape)}")
    return points * _size_factor(from_size, to_size, points, repeat=1)
