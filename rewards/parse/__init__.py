"""Reading answers out of untrusted model text: boxes, box lists, points, numbers, letter choices, code blocks.

Everything here is total: any string in gives a result out, and malformed text is a result with `None` and a
reason (`BoxParse`, `BoxListParse`, `PointParse`, `NumberParse`, `ChoiceParse`; `extract_code` returns None), never
an exception. Tags are found with literal regexes and numbers with a one-pass tokenizer, so the cost is linear in
the input; each search looks at no more than `MAX_BOX_CHARS` (box lists: `MAX_BOX_LIST_CHARS`) characters.

The answer region is the same for every parser: `strip_think`, then the content of the last `<answer>` tag if there
is one, else the whole remaining text.

Modules: `answer` (think blocks, answer tags, code blocks), `geometry` (boxes, box lists, points, rescaling) and
`scalars` (numbers, letter choices). Import the names from here.
"""

from rewards.parse.answer import (
    MAX_BOX_CHARS,
    answer_code,
    answer_region,
    extract_answer,
    extract_code,
    strip_think,
)
from rewards.parse.geometry import (
    MAX_BOX_LIST_CHARS,
    BoxListParse,
    BoxParse,
    PointParse,
    Size,
    parse_box,
    parse_box_list,
    parse_box_lists,
    parse_boxes,
    parse_point,
    parse_points,
    rescale_boxes,
    rescale_points,
)
from rewards.parse.scalars import ChoiceParse, NumberParse, parse_choice, parse_number

__all__ = [
    "MAX_BOX_CHARS",
    "MAX_BOX_LIST_CHARS",
    "BoxListParse",
    "BoxParse",
    "ChoiceParse",
    "NumberParse",
    "PointParse",
    "Size",
    "answer_code",
    "answer_region",
    "extract_answer",
    "extract_code",
    "parse_box",
    "parse_box_list",
    "parse_box_lists",
    "parse_boxes",
    "parse_choice",
    "parse_number",
    "parse_point",
    "parse_points",
    "rescale_boxes",
    "rescale_points",
    "strip_think",
]
