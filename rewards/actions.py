"""GUI agent actions: reading one action out of model text, and the rewards that compare it with a target action.

Two writing styles are read, both as the answer of a completion (`answer_region`: think removed, last `<answer>`
tag's content if any; after the last "Action:" marker if there is one):

* function calls, as in AndroidControl / AITW-style prompts and UI-TARS: `click(120, 340)`, `click(x=120, y=340)`,
  `click([120, 340])`, `click(start_box='<|box_start|>(120,340)<|box_end|>')`, `long_press(120, 340)`,
  `type("hello")` / `type(text='hello')`, `scroll(down)` / `scroll(direction="down")`, `press(back)` /
  `press(key="enter")` / `press_back()` / `navigate_home()`, `finish()` / `finish("the answer")`;
* JSON (or Python-dict) objects as in UI-R1: `[{"action": "click", "coordinate": [120, 340]}]`,
  `{"action_type": "type", "text": "hello"}`, `{"action": "scroll", "direction": "up"}`.

Whichever form starts first in the answer is tried first. Parsing is total: any text gives an `Action`, with
`kind=None` and a reason when nothing valid was found.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from rewards.box import point_in_box
from rewards.catalog import REWARDS
from rewards.parse import MAX_BOX_CHARS, answer_region
from rewards.parse.geometry import box_token_content, find_numbers, find_point_numbers
from rewards.text import normalize_answer

ACTION_KINDS = ("click", "long_press", "type", "scroll", "press", "finish")
SCROLL_DIRECTIONS = ("up", "down", "left", "right")

# Spelling -> (kind, key for press aliases). Only these names count as calls, so prose ("I will click the button")
# is never read as an action; the name must be followed by "(".
_CALL_NAMES = {
    "click": ("click", None),
    "tap": ("click", None),
    "left_click": ("click", None),
    "long_press": ("long_press", None),
    "longpress": ("long_press", None),
    "type": ("type", None),
    "input": ("type", None),
    "input_text": ("type", None),
    "type_text": ("type", None),
    "scroll": ("scroll", None),
    "press": ("press", None),
    "press_key": ("press", None),
    "key": ("press", None),
    "press_back": ("press", "back"),
    "navigate_back": ("press", "back"),
    "press_home": ("press", "home"),
    "navigate_home": ("press", "home"),
    "press_enter": ("press", "enter"),
    "finish": ("finish", None),
    "done": ("finish", None),
    "status": ("finish", None),
    "terminate": ("finish", None),
}
_KEY_ALIASES = {"return": "enter", "go_back": "back", "navigate_back": "back", "navigate_home": "home"}
_CALL = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(sorted(_CALL_NAMES, key=len, reverse=True)) + r")\s{0,3}\(", re.I)
_ACTION_MARKER = re.compile(r"action\s{0,3}:", re.IGNORECASE)
_KEYWORD_ARG = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)", re.DOTALL)
_POINT_ARGS = ("point", "coordinate", "coordinates", "position", "start_box", "box", "pos", "start_point")
_TEXT_ARGS = ("text", "content", "value", "input_text")


@dataclass(frozen=True)
class Action:
    """One parsed GUI action, or the reason there is none.

    Attributes:
        kind: one of `ACTION_KINDS`, or None if nothing valid was found.
        args: by kind: click / long_press `{"x": float, "y": float}`; type `{"text": str}`; scroll
            `{"direction": "up" | "down" | "left" | "right"}`; press `{"key": str}` (lower case, e.g. "back",
            "home", "enter"); finish `{}` or `{"answer": str}`.
        reason: why `kind` is None; "" when an action was parsed.
    """

    kind: str | None
    args: dict[str, float | str] = field(default_factory=dict)
    reason: str = ""


def parse_action(text: str) -> Action:
    """Reads one GUI action from a completion (see the module docstring for the forms).

    A click given as a box (`click(start_box='(x1,y1,x2,y2)')`) is read as the box's centre.

    Args:
        text: one completion.

    Returns:
        The action, or `kind=None` and the reason.
    """
    if not isinstance(text, str):
        return Action(None, {}, "input is not a string")
    region = answer_region(text)
    markers = list(_ACTION_MARKER.finditer(region))
    if markers:
        region = region[markers[-1].end() :]
    region = region[:MAX_BOX_CHARS]
    call = _CALL.search(region)
    brace = region.find("{")
    attempts = [lambda: _from_call(region, call), lambda: _from_json(region, brace)]
    if call is None or (0 <= brace < call.start()):
        attempts.reverse()
    reasons = []
    for attempt in attempts:
        action = attempt()
        if action.kind is not None:
            return action
        if action.reason:
            reasons.append(action.reason)
    return Action(None, {}, reasons[0] if reasons else "no action found")


def parse_actions(texts: list[str]) -> list[Action]:
    """`parse_action` over a batch of R completions."""
    return [parse_action(text) for text in texts]


# --------------------------------------------------------------------------------------------------------------------
# Function-call form
# --------------------------------------------------------------------------------------------------------------------


def _from_call(region: str, call: re.Match[str] | None) -> Action:
    if call is None:
        return Action(None, {}, "")
    kind, key = _CALL_NAMES[call.group(1).lower()]
    pieces = _split_args(region, call.end())
    if pieces is None:
        return Action(None, {}, f"unclosed parenthesis after {call.group(1)}")
    positional: list[str] = []
    keywords: dict[str, str] = {}
    for piece in pieces:
        keyword = _KEYWORD_ARG.fullmatch(piece)
        if keyword is not None and not piece.startswith(("'", '"')):
            keywords[keyword.group(1).lower()] = keyword.group(2).strip()
        elif piece:
            positional.append(piece)
    if key is not None:
        return Action(kind, {"key": key}, "")
    return _build(kind, positional, keywords)


def _split_args(region: str, start: int) -> list[str] | None:
    """The comma-separated arguments from `start` to the matching ")", quotes and brackets respected; None if unclosed."""
    pieces = []
    depth = 0
    piece_start = start
    for i, char in _outside_strings(region, start):
        if char in "([{":
            depth += 1
        elif char in "}]" or (char == ")" and depth > 0):
            depth = max(depth - 1, 0)
        elif char == ")":
            pieces.append(region[piece_start:i].strip())
            return pieces if pieces != [""] else []
        elif char == "," and depth == 0:
            pieces.append(region[piece_start:i].strip())
            piece_start = i + 1
    return None


def _outside_strings(region: str, start: int) -> Iterator[tuple[int, str]]:
    """(index, character) of `region` from `start` on, but for quoted strings (`'...'`, `"..."`, backslash escapes
    inside) and their quotes: what the bracket scanners count."""
    quote = None
    escaped = False
    for i in range(start, len(region)):
        char = region[i]
        if quote is not None:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        else:
            yield i, char


def _unquote(value: str) -> str:
    """The text of a quoted argument (escapes resolved when it is a valid literal), else the argument as written."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        try:
            literal = ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return value[1:-1]
        return literal if isinstance(literal, str) else value[1:-1]
    return value


def _number(value: str) -> float | None:
    try:
        number = float(_unquote(value))
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _point_from_text(value: str) -> tuple[float, float] | None:
    """A point written as `(x, y)`, `[x, y]`, `x, y` or a box token; a box's centre; None if neither."""
    region = box_token_content(_unquote(value))
    numbers, _ = find_point_numbers(region)
    if numbers is None:
        box, _ = find_numbers(region)
        if box is None:
            return None
        numbers = ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
    x, y = numbers
    return (float(x), float(y)) if math.isfinite(x) and math.isfinite(y) else None


def _build(kind: str, positional: list[str], keywords: dict[str, str]) -> Action:
    """An `Action` of `kind` from raw argument strings (positional in order, keywords lower-cased)."""
    if kind in ("click", "long_press"):
        point = None
        if "x" in keywords and "y" in keywords:
            x, y = _number(keywords["x"]), _number(keywords["y"])
            point = None if x is None or y is None else (x, y)
        elif len(positional) >= 2 and _number(positional[0]) is not None and _number(positional[1]) is not None:
            point = (_number(positional[0]), _number(positional[1]))
        else:
            named = next((keywords[k] for k in _POINT_ARGS if k in keywords), None)
            source = named if named is not None else (positional[0] if positional else None)
            point = None if source is None else _point_from_text(source)
        if point is None:
            return Action(None, {}, f"{kind} has no valid point")
        return Action(kind, {"x": float(point[0]), "y": float(point[1])}, "")
    if kind == "type":
        value = next((keywords[k] for k in _TEXT_ARGS if k in keywords), positional[0] if positional else None)
        if value is None:
            return Action(None, {}, "type has no text")
        return Action("type", {"text": _unquote(value)}, "")
    if kind == "scroll":
        words = [keywords["direction"]] if "direction" in keywords else positional
        for word in words:
            direction = _unquote(word).strip().lower()
            if direction in SCROLL_DIRECTIONS:
                return Action("scroll", {"direction": direction}, "")
        return Action(None, {}, "scroll has no direction among up, down, left, right")
    if kind == "press":
        value = next(
            (keywords[k] for k in ("key", "button", "keys") if k in keywords), positional[0] if positional else None
        )
        key = "" if value is None else _unquote(value).strip().lower()
        if not key:
            return Action(None, {}, "press has no key")
        return Action("press", {"key": _KEY_ALIASES.get(key, key)}, "")
    # finish: an optional answer, positional or under a few names
    value = next((keywords[k] for k in ("answer", "content", "text", "message") if k in keywords), None)
    if value is None and positional:
        value = positional[0]
    return Action("finish", {} if value is None else {"answer": _unquote(value)}, "")


# --------------------------------------------------------------------------------------------------------------------
# JSON form
# --------------------------------------------------------------------------------------------------------------------


def _from_json(region: str, brace: int) -> Action:
    if brace < 0:
        return Action(None, {}, "")
    start = brace
    bracket = region.rfind("[", 0, brace)
    if bracket >= 0 and not region[bracket + 1 : brace].strip():  # a list of action objects: take the first
        start = bracket
    span = _balanced(region, start)
    if span is None:
        return Action(None, {}, "unclosed JSON object")
    obj = None
    for load in (json.loads, ast.literal_eval):
        try:
            obj = load(span)
            break
        except Exception:  # untrusted text: any parser failure (syntax, depth, size) just means "not this form"
            continue
    if isinstance(obj, list):
        obj = obj[0] if obj else None
    if not isinstance(obj, dict):
        return Action(None, {}, "not a JSON action object")
    fields = {str(k).lower(): v for k, v in obj.items()}
    name = fields.get("action", fields.get("action_type"))
    if not isinstance(name, str) or name.lower() not in _CALL_NAMES:
        return Action(None, {}, f"unknown action {name!r}")
    kind, key = _CALL_NAMES[name.lower()]
    if key is not None:
        return Action(kind, {"key": key}, "")
    keywords = {}
    for k, v in fields.items():
        if k in ("action", "action_type") or v is None:
            continue
        if isinstance(v, (list, tuple)) and all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in v):
            keywords[k] = "[" + ", ".join(repr(float(n)) for n in v) + "]"
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            keywords[k] = repr(float(v))
        else:
            # Quoted back into a literal that `_unquote` reads exactly (ensure_ascii=False keeps astral characters).
            keywords[k] = json.dumps(v, ensure_ascii=False) if isinstance(v, str) else str(v)
    return _build(kind, [], keywords)


def _balanced(region: str, start: int) -> str | None:
    """The text from the bracket at `start` to its matching close, strings respected; None if it never closes."""
    depth = 0
    for i, char in _outside_strings(region, start):
        if char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
            if depth == 0:
                return region[start : i + 1]
    return None


# --------------------------------------------------------------------------------------------------------------------
# Rewards
# --------------------------------------------------------------------------------------------------------------------


def _target_actions(target_action: Sequence[str | None], completions: Sequence[str]) -> list[Action | None]:
    if len(target_action) != len(completions):
        raise ValueError(f"got {len(completions)} completions and {len(target_action)} target actions")
    targets = []
    for i, target in enumerate(target_action):
        if target is None:
            targets.append(None)
            continue
        action = parse_action(target)
        if action.kind is None:
            raise ValueError(f"target_action[{i}] = {target!r} is no action: {action.reason}")
        targets.append(action)
    return targets


def _nan_where(values: list[float], targets: list[Action | None]) -> torch.Tensor:
    return torch.tensor([math.nan if t is None else v for v, t in zip(values, targets)], dtype=torch.float32)


@REWARDS.register("action_type")
def action_type_reward(completions: list[str], target_action: Sequence[str | None]) -> torch.Tensor:
    """1.0 where the completion's action has the target's kind (click, type, ...), else 0.0 (UI-R1's action reward).

    Args:
        completions: R completions.
        target_action: R target actions written in any form `parse_action` reads, or None (no target: NaN).

    Returns:
        `[R]` float32 of 0.0 and 1.0, NaN where there is no target.
    """
    targets = _target_actions(target_action, completions)
    kinds = [parse_action(text).kind for text in completions]
    return _nan_where([float(t is not None and k == t.kind) for k, t in zip(kinds, targets)], targets)


@REWARDS.register("action_match")
def action_match_reward(
    completions: list[str],
    target_action: Sequence[str | None],
    *,
    target_box: torch.Tensor | None = None,
    click_radius: float = 14.0,
) -> torch.Tensor:
    """1.0 where the completion's action is the target action, arguments included, else 0.0.

    Arguments match by kind: a click or long press lands in the row's `target_box` when one is given (a finite row),
    else within `click_radius` of the target's point; typed text and finish answers match after `normalize_answer`
    (a target `finish()` without answer accepts any answer); scroll directions and keys match exactly.

    Args:
        completions: R completions.
        target_action: R target actions written in any form `parse_action` reads, or None (no target: NaN).
        target_box: optional `[R, 4]` xyxy boxes of the element to click (its NaN rows fall back to the radius).
        click_radius: the largest distance, in the targets' units, from the target point that counts as a hit.

    Returns:
        `[R]` float32 of 0.0 and 1.0, NaN where there is no target.
    """
    targets = _target_actions(target_action, completions)
    actions = parse_actions(completions)
    nan2 = (math.nan, math.nan)

    def point(action: Action | None) -> tuple[float, float]:
        if action is None or action.kind not in ("click", "long_press"):
            return nan2
        return (float(action.args["x"]), float(action.args["y"]))

    # Clicks: one tensor pass for the distance and the box test.
    pred_points = torch.tensor([point(a) for a in actions], dtype=torch.float64).reshape(-1, 2)  # [R, 2]
    target_points = torch.tensor([point(t) for t in targets], dtype=torch.float64).reshape(-1, 2)  # [R, 2]
    near = (pred_points - target_points).norm(dim=-1) <= click_radius  # [R], False on NaN
    if target_box is not None:
        boxes = target_box.detach().to("cpu", torch.float64).reshape(-1, 4)  # [R, 4]
        has_box = torch.isfinite(boxes).all(-1)
        near = torch.where(has_box, point_in_box(pred_points, boxes).bool(), near)
    values = []
    for i, (action, target) in enumerate(zip(actions, targets)):
        if target is None or action.kind != target.kind:
            values.append(0.0)
        elif target.kind in ("click", "long_press"):
            values.append(float(near[i]))
        elif target.kind == "type":
            values.append(
                float(normalize_answer(str(action.args["text"])) == normalize_answer(str(target.args["text"])))
            )
        elif target.kind == "finish":
            wanted = target.args.get("answer")
            got = action.args.get("answer")
            values.append(float(wanted is None or normalize_answer(str(got or "")) == normalize_answer(str(wanted))))
        else:  # scroll, press
            values.append(float(action.args == target.args))
    return _nan_where(values, targets)
