"""Single-value answers: the final number of a completion (`parse_number`) and a multiple-choice letter.

Both read `answer_region(text)`, at most its last `MAX_BOX_CHARS` characters, with bounded regexes (linear scans);
malformed text is a result with `None` and a reason, never an exception.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from rewards.parse.answer import MAX_BOX_CHARS, answer_region

# --------------------------------------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------------------------------------

# ASCII digits only, so `float` accepts what matches. Thousands separators must come in groups of exactly three
# ("1,234"; "1,2" is two numbers). Each alternative is anchored on a digit and spaces are bounded, so the scan stays
# linear.
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-+\u2212]?)\$?"
    r"(?P<mant>(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+)"
    r"(?:[eE](?P<exp>[-+]?[0-9]+))?"
    r"(?:\s{0,3}/\s{0,3}(?P<den>[0-9]+(?:\.[0-9]+)?)(?![0-9.]))?"
    r"(?P<pct>\s{0,3}%)?"
)
_BOXED = "\\boxed{"


@dataclass(frozen=True)
class NumberParse:
    """One parsed number, or the reason there is none.

    Attributes:
        value: the number as written (a percentage keeps its value: "45%" is 45.0); None if there is none.
        percent: the number carried a `%` sign.
        reason: why `value` is None; "" when a number was parsed.
    """

    value: float | None
    percent: bool
    reason: str


def parse_number(text: str) -> NumberParse:
    """Finds the final numeric answer of a completion.

    The search runs on the last `\\boxed{...}` of `answer_region(text)` if there is one, else on the whole region,
    at most its last `MAX_BOX_CHARS` characters, and takes the **last** number there (a worked solution ends with
    its result). Read: signs (also the Unicode minus), thousands separators in groups of three ("1,234,567"),
    decimals, scientific notation ("2.5e-3"), a leading `$`, simple fractions ("3/4" is 0.75), and a trailing `%`
    (flagged in `percent`). A number glued to a word or a dot ("x2", "v1.2") is not one.

    Args:
        text: one completion, or a bare target string.

    Returns:
        The number, or None and the reason.
    """
    if not isinstance(text, str):
        return NumberParse(None, False, "input is not a string")
    region = answer_region(text)
    boxed = region.rfind(_BOXED)
    if boxed >= 0:
        region = _braced(region, boxed + len(_BOXED))
    region = region[-MAX_BOX_CHARS:]
    matches = list(_NUMBER.finditer(region))
    if not matches:
        return NumberParse(None, False, "no number found")
    last = matches[-1]
    # float() of the text, not mantissa * 10**exp: "1e999" is inf and "1e-999" is 0.0, never an OverflowError.
    value = float(last["mant"].replace(",", "") + ("" if last["exp"] is None else "e" + last["exp"]))
    if last["den"] is not None:
        den = float(last["den"])
        if den == 0:
            return NumberParse(None, False, "division by zero")
        value = value / den
    if last["sign"] in ("-", "\u2212"):
        value = -value
    if not math.isfinite(value):
        return NumberParse(None, False, "number is not finite")
    return NumberParse(value, last["pct"] is not None, "")


def _braced(text: str, start: int) -> str:
    """The text from `start` to the brace that closes an already opened `{` (to the end if it never closes)."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return text[start:]


# --------------------------------------------------------------------------------------------------------------------
# Letter choices
# --------------------------------------------------------------------------------------------------------------------

# The whole answer is one letter, maybe wrapped: "B", "(B)", "[b]", "B.", "**B**", "'B'".
_LONE_LETTER = re.compile(r"[\s*(\[{\"'`]*([A-Za-z])[\s*)\]}\"'`.:,]*")
# "answer is (B)", "Answer: b", "the correct option is C", "choice: [D]". Lower case only counts when nothing but
# punctuation follows (checked in code): "the answer is a cat" is no choice. Bounded spaces keep the scan linear.
_CHOICE_PHRASE = re.compile(
    r"\b(?:answer|option|choice)(?:\s{1,3}is)?\s{0,3}[:=]?\s{0,3}(?:option\s{1,3})?([(\[]?)([A-Za-z])([)\]]?)(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_LEADING_LETTER = re.compile(r"\s*[(\[]?([A-Z])[)\].:](?:\s|$)")  # "B. a cat", "(C) the dog"
_PAREN_LETTER = re.compile(r"\(([A-Z])\)")


@dataclass(frozen=True)
class ChoiceParse:
    """One multiple-choice letter, or the reason there is none.

    Attributes:
        letter: the chosen letter, upper case; None if there is none.
        reason: why `letter` is None; "" when a letter was parsed.
    """

    letter: str | None
    reason: str


def parse_choice(text: str, choices: str = "ABCDE") -> ChoiceParse:
    """Finds the letter a completion picks among `choices`.

    The search runs on `answer_region(text)`, at most its last `MAX_BOX_CHARS` characters. In order, first found
    wins:

    1. the whole answer is one letter, maybe wrapped: `B`, `(B)`, `b.`, `**B**`, `<answer>B</answer>`;
    2. the last "answer/option/choice (is) (:) X" phrase: `answer: b`, `The answer is (C).`; a lower-case letter
       only when wrapped in brackets or when nothing but punctuation follows;
    3. a leading `B.`, `B)`, `(B)` or `B:` followed by a space;
    4. a single distinct `(X)` anywhere in the text; several different ones are ambiguous.

    Args:
        text: one completion, or a bare target string.
        choices: the valid letters, upper case.

    Returns:
        The letter, or None and the reason.
    """
    if not isinstance(text, str):
        return ChoiceParse(None, "input is not a string")
    valid = choices.upper()
    region = answer_region(text)[-MAX_BOX_CHARS:]
    lone = _LONE_LETTER.fullmatch(region)
    if lone is not None:
        letter = lone.group(1).upper()
        return ChoiceParse(letter, "") if letter in valid else ChoiceParse(None, f"{letter} is not one of {valid}")
    picked = None
    for phrase in _CHOICE_PHRASE.finditer(region):
        opened, letter, closed = phrase.groups()
        wrapped = bool(opened) and bool(closed)
        at_end = region[phrase.end() :].strip(" \t\r\n.,;:!)]*") == ""
        if letter.upper() in valid and (letter.isupper() or wrapped or at_end):
            picked = letter.upper()
    if picked is not None:
        return ChoiceParse(picked, "")
    leading = _LEADING_LETTER.match(region)
    if leading is not None and leading.group(1) in valid:
        return ChoiceParse(leading.group(1), "")
    found = sorted({m.group(1) for m in _PAREN_LETTER.finditer(region) if m.group(1) in valid})
    if len(found) == 1:
        return ChoiceParse(found[0], "")
    if found:
        return ChoiceParse(None, f"ambiguous choice: {', '.join(found)}")
    return ChoiceParse(None, "no choice found")
