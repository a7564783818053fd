"""The text answers of the `highway` env: its meta-actions and how an answer names one (`parse_meta_action`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rewards.parse import answer_region

META_ACTIONS = ("LANE_LEFT", "IDLE", "LANE_RIGHT", "FASTER", "SLOWER")

# The first meta-action named in the text. Letters or digits may not touch it ("FASTERX" is no action), but an
# underscore, space or hyphen may separate LANE from its side.
_ACTION_RE = re.compile(r"(?<![a-z0-9])(lane[ _-]?left|lane[ _-]?right|idle|faster|slower)(?![a-z0-9])", re.IGNORECASE)


def parse_meta_action(
    text: str, allowed: Sequence[str] = META_ACTIONS, letters: dict[str, str] | None = None
) -> tuple[str | None, str]:
    """The first meta-action named in a model's answer.

    Args:
        text: One completion; `<think>` blocks are dropped and the last `<answer>` tag's content is searched if any.
        allowed: The scenario's meta-actions (upper case).
        letters: Meta-action -> letter, where answers may be a letter (`HighwayEnv(answer="letter")`): an answer
            that is one of them alone (spaces and a final period aside) is that action; otherwise names are searched.

    Returns:
        `(action, "")`, or `(None, reason)` when the text names no action or one not in `allowed`.

    >>> parse_meta_action("<answer>faster</answer>")
    ('FASTER', '')
    >>> parse_meta_action("turn left", ("SLOWER", "IDLE", "FASTER"))[0] is None
    True
    """
    if not isinstance(text, str):
        return None, "answer is not a string"
    if letters:
        bare = answer_region(text).strip().rstrip(".").strip().upper()
        by_letter = {letter: name for name, letter in letters.items()}
        if bare in by_letter:
            return by_letter[bare], ""
    match = _ACTION_RE.search(answer_region(text))
    if match is None:
        if letters:
            return None, f"no action found; answer with one letter of {', '.join(letters.values())}"
        return None, f"no action found; answer with one of {', '.join(allowed)}"
    name = re.sub(r"[ _-]", "_", match.group(1).upper())
    if name not in allowed:
        return None, f"{name} is not an action here; answer with one of {', '.join(allowed)}"
    return name, ""
