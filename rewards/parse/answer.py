"""Where the answer sits in a completion: think blocks, `<answer>` tags, fenced code blocks.

Every parser in `rewards.parse` reads the same answer region: `strip_think`, then the content of the last
`<answer>` tag if there is one, else the whole remaining text (`answer_region`). `extract_code` looks for code
blocks after `strip_think`; `answer_code` is the code of a completion as the render envs and `mmrl score` read it. Tags are found with literal regexes and blocks by a linear scan, so the cost is linear in the input.
"""

from __future__ import annotations

import re

MAX_BOX_CHARS = 10_000
"""Only this many characters of the answer (or of the whole think-stripped text) are searched for a box.

Numbers and letter choices are read from the last this many characters (`rewards.parse.scalars`).
"""

_THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)
ANSWER_TAG = re.compile(r"<(/?)answer>", re.IGNORECASE)


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
    for tag in ANSWER_TAG.finditer(text):
        if not tag.group(1):
            opened_at = tag.end()
        elif opened_at is not None:
            last = (opened_at, tag.start())
            opened_at = None
    return None if last is None else text[last[0] : last[1]].strip()


def answer_region(text: str) -> str:
    """The part of a completion that holds its answer: `strip_think`, then the last `<answer>` tag's content if any.

    Args:
        text: one completion.

    Returns:
        The stripped content of the last complete answer tag, or else the whole think-stripped text (unstripped).
    """
    body = strip_think(text)
    answer = extract_answer(body)
    return body if answer is None else answer


# --------------------------------------------------------------------------------------------------------------------
# Code blocks
# --------------------------------------------------------------------------------------------------------------------

_FENCE = "```"
# A fence's info string names the language; these names count as the key language.
_LANG_ALIASES = {
    "python": frozenset({"python", "py", "python3"}),
    "svg": frozenset({"svg"}),
    "html": frozenset({"html", "htm"}),
    "javascript": frozenset({"javascript", "js"}),
}


def extract_code(text: str, lang: str | None = None) -> str | None:
    """Returns the code block of a completion: the last fenced block in `lang`, or a bare `<svg>...</svg>`.

    Think blocks are removed first. Fenced blocks are `` ```info `` on one line, the code, then the next
    `` ``` ``; an unclosed fence (a completion cut at the token limit) does not count. When several blocks match,
    the last one wins: models that revise write the final version last.

    * `lang=None`: the last fenced block of any language, else a bare SVG.
    * `lang="svg"`: the last block fenced as `svg`, or fenced as `xml`/`html`/nothing and holding `<svg`; else the
      bare SVG from the first `<svg` to the last `</svg>` (tags case-insensitive).
    * other languages: the last block whose info string starts with the language or an alias (`py` for python).

    Args:
        text: one completion.
        lang: the language wanted, case-insensitive; None for any.

    Returns:
        The code without its fences and surrounding blank lines, or None if there is none.
    """
    if not isinstance(text, str):
        return None
    body = strip_think(text)
    want = None if lang is None else lang.strip().lower()
    names = _LANG_ALIASES.get(want, frozenset({want})) if want is not None else frozenset()
    chosen = None
    for info, code in _fenced_blocks(body):
        words = info.split()
        tag = words[0].lower() if words else ""
        if want is None or tag in names or (want == "svg" and tag in ("", "xml", "html") and "<svg" in code.lower()):
            chosen = code
    if chosen is not None:
        return chosen.lstrip("\r\n").rstrip()
    if want is None or want == "svg":
        lowered = body.lower()
        start = lowered.find("<svg")
        end = lowered.rfind("</svg>")
        if 0 <= start < end:
            return body[start : end + len("</svg>")]
    return None


def answer_code(text: str, lang: str) -> str | None:
    """The code a completion answers with, read as the render envs read it (`sim.render`).

    The answer region (`answer_region`: think blocks removed, the last `<answer>` tag's content if any), then its last
    block fenced in `lang` (`extract_code`). Failing a fence, SVG is the bare `<svg>...</svg>` (so a leading sentence
    does not count); other languages take the whole region as bare code.

    Args:
        text: one completion.
        lang: the language of the code: "svg", "python", "html", ...

    Returns:
        The code, or None if there is none (an empty block or answer; for SVG, no `<svg>` element).
    """
    region = answer_region(text)
    code = extract_code(region, lang)
    if code is None and lang.strip().lower() != "svg":
        code = region.strip()
    return code or None


def _fenced_blocks(body: str) -> list[tuple[str, str]]:
    """`(info, code)` of every closed fenced block, by a linear scan (no regex backtracking on unclosed fences)."""
    blocks = []
    pos = 0
    while True:
        start = body.find(_FENCE, pos)
        if start < 0:
            return blocks
        line_end = body.find("\n", start + len(_FENCE))
        if line_end < 0:
            return blocks
        info = body[start + len(_FENCE) : line_end]
        if "`" in info:  # an inline ```x``` on one line, or a longer run of backticks: skip past it
            pos = start + len(_FENCE)
            continue
        end = body.find(_FENCE, line_end + 1)
        if end < 0:
            return blocks
        blocks.append((info.strip(), body[line_end + 1 : end]))
        pos = end + len(_FENCE)
