import math
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards import (
    BoxListParse,
    BoxParse,
    ChoiceParse,
    NumberParse,
    PointParse,
    answer_region,
    extract_answer,
    extract_code,
    parse_box,
    parse_box_list,
    parse_box_lists,
    parse_boxes,
    parse_choice,
    parse_number,
    parse_point,
    parse_points,
    rescale_boxes,
    rescale_points,
    strip_think,
)
from rewards.parse import MAX_BOX_CHARS

NAN = math.nan

# --------------------------------------------------------------------------------------------------------------------
# strip_think / extract_answer
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>a</think>b", "b"),
        ("x<THINK>a</Think>y<think>c</think>z", "xyz"),
        ("reasoning opened by the prompt</think>answer", "answer"),
        ("before<think>never closed [1,2,3,4]", "before"),
        ("<think>a</think>b</think>c", "b</think>c"),  # a later stray close stays, so format checks see it
        ("no tags", "no tags"),
    ],
)
def test_strip_think(text, expected):
    assert strip_think(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer> 42 </answer>", "42"),
        ("<answer>a</answer> then <ANSWER>b</Answer>", "b"),  # the last pair wins
        ("<answer>a</answer><answer>unterminated", "a"),
        ("<answer>a<answer>b</answer>", "b"),  # the opener nearest the close
        ("<answer></answer>", ""),
        ("no answer", None),
        ("</answer>only a close", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


# --------------------------------------------------------------------------------------------------------------------
# parse_box: accepted forms
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[10, 20, 30, 40]", (10.0, 20.0, 30.0, 40.0)),
        ("[10,20,30,40]", (10.0, 20.0, 30.0, 40.0)),
        ("[ 1.5 , 2.25 ,3e1, 4.0E1 ]", (1.5, 2.25, 30.0, 40.0)),
        ("[-5, -6, 7, 8]", (-5.0, -6.0, 7.0, 8.0)),
        ("The cat is at [10, 20, 30, 40].", (10.0, 20.0, 30.0, 40.0)),
        ('{"bbox_2d": [10, 20, 30, 40], "label": "cat"}', (10.0, 20.0, 30.0, 40.0)),
        (
            '```json\n[\n  {"bbox_2d": [1, 2, 3, 4], "label": "cat 5, 6, 7, 8"},\n'
            '  {"bbox_2d": [50, 60, 70, 80], "label": "dog"}\n]\n```',
            (1.0, 2.0, 3.0, 4.0),  # a JSON list of objects: the first one
        ),
        ("{'label': 'cup', 'bbox_2d': [1, 2, 3, 4]}", (1.0, 2.0, 3.0, 4.0)),  # Python-dict quoting
        ("<|object_ref_start|>cat<|object_ref_end|><|box_start|>(10,20),(30,40)<|box_end|>", (10.0, 20.0, 30.0, 40.0)),
        ("(10, 20), (30, 40)", (10.0, 20.0, 30.0, 40.0)),
        ("(10,20)(30,40)", (10.0, 20.0, 30.0, 40.0)),
        ("[[10, 20], [30, 40]]", (10.0, 20.0, 30.0, 40.0)),
        ("(10, 20, 30, 40)", (10.0, 20.0, 30.0, 40.0)),
        ("10, 20, 30, 40", (10.0, 20.0, 30.0, 40.0)),
        ("Step 1: look. Box: 10,20,30,40", (10.0, 20.0, 30.0, 40.0)),  # a lone number does not count
        ("[30, 40, 10, 20]", (10.0, 20.0, 30.0, 40.0)),  # swapped corners are reordered
        ("[10, 40, 30, 20]", (10.0, 20.0, 30.0, 40.0)),  # only y swapped
        ("(30,40),(10,20)", (10.0, 20.0, 30.0, 40.0)),
    ],
)
def test_parse_box_accepts(text, expected):
    assert parse_box(text) == BoxParse(expected, "")


def test_qwen2_vl_grid_maps_back_to_pixels():
    text = "<|box_start|>(100,250),(500,1000)<|box_end|>"
    assert parse_box(text, normalized_1000=True).box == (100.0, 250.0, 500.0, 1000.0)  # no scale: grid units
    got = parse_box(text, normalized_1000=True, scale=(640, 480)).box  # x * 640 / 1000, y * 480 / 1000
    assert got == pytest.approx((64.0, 120.0, 320.0, 480.0))


def test_scale_without_grid_multiplies_x_and_y():
    # A box predicted on an image resized by 1/2 in x and 1/4 in y, mapped back to the original size.
    assert parse_box("[10, 20, 30, 40]", scale=(2.0, 4.0)).box == (20.0, 80.0, 60.0, 160.0)
    # A negative multiplier flips the axis; the corners are reordered after scaling.
    assert parse_box("[10, 20, 30, 40]", scale=(-1.0, 1.0)).box == (-30.0, 20.0, -10.0, 40.0)


def test_box_start_content_is_the_only_place_searched():
    assert parse_box("[1, 2, 3, 4] <|box_start|>(10,20),(30,40)<|box_end|>").box == (10.0, 20.0, 30.0, 40.0)
    assert parse_box("[1, 2, 3, 4] <|box_start|>(10,20)<|box_end|>").reason == "box has 2 numbers, need 4"
    assert parse_box("<|box_start|>(10,20),(30,40)").box == (10.0, 20.0, 30.0, 40.0)  # box_end cut off


def test_answer_tag_wins_over_the_rest_and_think_is_ignored():
    text = (
        "<think>maybe <answer>[0, 0, 1, 1]</answer> or [5,5,6,6]</think> I guess [7,7,8,8] <answer>[1,2,3,4]</answer>"
    )
    assert parse_box(text).box == (1.0, 2.0, 3.0, 4.0)
    assert parse_box("<think>[0, 0, 1, 1]</think>[1, 2, 3, 4]").box == (1.0, 2.0, 3.0, 4.0)
    assert parse_box("thinking [0, 0, 1, 1]</think>[1, 2, 3, 4]").box == (1.0, 2.0, 3.0, 4.0)
    # With an answer tag, a box outside it is not used.
    assert parse_box("[1, 2, 3, 4] <answer>the cat</answer>") == BoxParse(None, "no box found")
    # An answer tag left open inside the think block does not count either.
    assert parse_box("<think>[0,0,1,1]") == BoxParse(None, "no box found")


def test_bbox_2d_key_decides_even_when_wrong():
    got = parse_box('{"bbox_2d": [1, 2, 3], "label": "x"} [5, 6, 7, 8]')
    assert got == BoxParse(None, "box has 3 numbers, need 4")


def test_first_box_in_text_order_is_taken():
    assert parse_box("(1,2),(3,4) then [5,6,7,8]").box == (1.0, 2.0, 3.0, 4.0)
    assert parse_box("[5,6,7,8] then (1,2),(3,4)").box == (5.0, 6.0, 7.0, 8.0)


# --------------------------------------------------------------------------------------------------------------------
# parse_box: malformed input is a reason, never an exception
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no box found"),
        ("I cannot see a cat.", "no box found"),
        ("There are 2 cats and 3 dogs", "no box found"),
        ("[a, b, c, d]", "no box found"),
        ("[10 20 30 40]", "no box found"),  # numbers must be comma-separated
        ("<answer></answer>", "no box found"),
        ("[10, 20, 30]", "box has 3 numbers, need 4"),
        ("10, 20", "box has 2 numbers, need 4"),
        ("[1, 2, 3, 4, 5]", "box has 5 numbers, need 4"),
        ('{"bbox_2d": [7], "label": "x"}', "box has 1 number, need 4"),
        ("[1.2.3, 4, 5, 6]", "malformed number list"),
        ("[10-20, 30, 40, 50]", "malformed number list"),
        ("[nan, 2, 3, 4]", "box has non-finite numbers"),
        ("[1, -inf, 3, 4]", "box has non-finite numbers"),
        ("[1, 2, Infinity, 4]", "box has non-finite numbers"),
        ("[1e999, 2, 3, 4]", "box has non-finite numbers"),  # overflows to inf
        ("[1e39, 2, 3, 4]", "box has non-finite numbers"),  # finite, but inf once stored as float32
        ("[10, 20, 10, 40]", "degenerate box (zero area)"),
        ("(5,5),(5,5)", "degenerate box (zero area)"),
        ("<|box_start|>1, 2, 3<|box_end|>", "box has 3 numbers, need 4"),
    ],
)
def test_parse_box_rejects_with_reason(text, reason):
    assert parse_box(text) == BoxParse(None, reason)


def test_parse_box_scale_overflow_and_zero_scale_are_rejected():
    assert parse_box("[1, 2, 3, 4]", scale=(1e300, 1e300)).reason == "box has non-finite numbers"
    assert parse_box("[1, 2, 3, 4]", scale=(0.0, 1.0)).reason == "degenerate box (zero area)"


def test_parse_box_non_string_input_is_a_reason():
    assert parse_box(None) == BoxParse(None, "input is not a string")  # type: ignore[arg-type]
    assert parse_box(b"[1,2,3,4]") == BoxParse(None, "input is not a string")  # type: ignore[arg-type]


def test_only_the_first_max_box_chars_are_searched():
    assert parse_box("x" * (MAX_BOX_CHARS - 20) + " [1, 2, 3, 4]").box == (1.0, 2.0, 3.0, 4.0)
    assert parse_box("x" * MAX_BOX_CHARS + " [1, 2, 3, 4]") == BoxParse(None, "no box found")
    # The cap applies to the answer, so a long think block before it does not hide the box.
    assert parse_box("<think>" + "y" * 50_000 + "</think><answer>[1,2,3,4]</answer>").box == (1.0, 2.0, 3.0, 4.0)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 1_000_000,
        "1," * 1_000_000,
        "(1," * 300_000,
        "9" * 1_000_000,
        "<answer>" * 100_000,
        "<think>" * 100_000 + "</think>" * 100_000,
        "<|box_start|>" * 50_000,
        '{"bbox_2d": [' * 50_000,
        "1e" * 500_000,
    ],
)
def test_adversarial_huge_inputs_stay_fast(text):
    start = time.perf_counter()
    got = parse_box(text)
    elapsed = time.perf_counter() - start
    assert got.box is None and got.reason
    assert elapsed < 2.0, f"{elapsed:.2f}s"  # each takes well under 0.1 s; a quadratic path takes minutes


# --------------------------------------------------------------------------------------------------------------------
# fuzz: any text gives a valid box or a reason
# --------------------------------------------------------------------------------------------------------------------

NEAR_MISS_ALPHABET = '[](),{}<>0123456789.-e answer/ bbox_2d"'
NEAR_MISS_PIECES = [
    "<answer>", "</answer>", "<think>", "</think>", "<|box_start|>", "<|box_end|>", '"bbox_2d": ',
    "[", "]", "(", ")", ", ", "nan", "inf", "1e999", "-0", "0", "12", "3.5", ".5", "1e3",
]  # fmt: skip


def assert_valid(parsed: BoxParse) -> None:
    assert isinstance(parsed, BoxParse)
    if parsed.box is None:
        assert isinstance(parsed.reason, str) and parsed.reason
    else:
        assert parsed.reason == ""
        assert len(parsed.box) == 4
        assert all(isinstance(v, float) and math.isfinite(v) for v in parsed.box)
        x1, y1, x2, y2 = parsed.box
        assert x1 < x2 and y1 < y2


FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None)


@FUZZ
@given(st.text())
def test_fuzz_arbitrary_text(text):
    assert_valid(parse_box(text))
    assert_valid(parse_box(text, normalized_1000=True, scale=(640.0, 480.0)))


@FUZZ
@given(st.text(alphabet=NEAR_MISS_ALPHABET, max_size=200))
def test_fuzz_near_miss_alphabet(text):
    assert_valid(parse_box(text))


@FUZZ
@given(st.lists(st.sampled_from(NEAR_MISS_PIECES), max_size=40).map("".join))
def test_fuzz_near_miss_pieces(text):
    assert_valid(parse_box(text))


NUMBER_TEXT = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),  # "nan", "-inf", "1e+300", "5e-324", ...
    st.sampled_from(["1e999", ".5", "1.", "-0", "+3", "07", "1e39"]),
)
WRAPPERS = [
    "[{}]",
    "({})",
    "{}",
    '{{"bbox_2d": [{}], "label": "a"}}',
    "<|box_start|>{}<|box_end|>",
    "<answer>{}</answer>",
]


@FUZZ
@given(
    st.one_of(st.lists(NUMBER_TEXT, min_size=4, max_size=4), st.lists(NUMBER_TEXT, max_size=6)),
    st.sampled_from(WRAPPERS),
    st.sampled_from([",", ", ", " , ", ",", ", ", " ", ",,"]),  # mostly valid separators
    st.sampled_from(["", "<think>[9, 9, 9, 9]</think>", "x</think>", "The box: ", "<answer>"]),
)
def test_fuzz_box_shaped_text(numbers, wrapper, separator, prefix):
    assert_valid(parse_box(prefix + wrapper.format(separator.join(numbers))))


@FUZZ
@given(st.lists(st.integers(-(10**6), 10**6), min_size=4, max_size=4), st.sampled_from(WRAPPERS[:4]))
def test_fuzz_four_integers_parse_to_sorted_corners(numbers, wrapper):
    x1, y1, x2, y2 = numbers
    got = parse_box(wrapper.format(", ".join(map(str, numbers))))
    if x1 == x2 or y1 == y2:
        assert got == BoxParse(None, "degenerate box (zero area)")
    else:
        assert got == BoxParse((min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)), "")


# --------------------------------------------------------------------------------------------------------------------
# parse_boxes
# --------------------------------------------------------------------------------------------------------------------


def test_parse_boxes_stacks_boxes_with_nan_rows():
    boxes, reasons = parse_boxes(["[1, 2, 3, 4]", "nothing", "<answer>(30,40),(10,20)</answer>", "[1, 2, 3]"])
    assert boxes.shape == (4, 4) and boxes.dtype == torch.float32
    torch.testing.assert_close(boxes[0], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    torch.testing.assert_close(boxes[2], torch.tensor([10.0, 20.0, 30.0, 40.0]))
    assert torch.isnan(boxes[1]).all() and torch.isnan(boxes[3]).all()
    assert reasons == ["", "no box found", "", "box has 3 numbers, need 4"]


def test_parse_boxes_passes_options_and_handles_empty_batches():
    boxes, _ = parse_boxes(["<|box_start|>(500,500),(1000,1000)<|box_end|>"], normalized_1000=True, scale=(200, 100))
    torch.testing.assert_close(boxes, torch.tensor([[100.0, 50.0, 200.0, 100.0]]))
    empty, reasons = parse_boxes([])
    assert empty.shape == (0, 4) and reasons == []


def test_answer_region_strips_think_and_prefers_the_answer_tag():
    assert answer_region("<think>x</think> <answer> B </answer>") == "B"
    assert answer_region("<think>x</think> just text ") == " just text "


# --------------------------------------------------------------------------------------------------------------------
# parse_point
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("(120, 340)", (120.0, 340.0)),
        ("[120,340]", (120.0, 340.0)),
        ("Click at (1.5, -2)", (1.5, -2.0)),
        ('{"point_2d": [10, 20], "label": "ok button"}', (10.0, 20.0)),
        ("[{'point_2d': [10, 20]}]", (10.0, 20.0)),
        ('{"coordinate": [7, 8]}', (7.0, 8.0)),
        ("<|box_start|>(500,250)<|box_end|>", (500.0, 250.0)),
        ("<answer>(3, 4)</answer> (9, 9)", (3.0, 4.0)),
        ("<think>(0, 0)</think>(5, 6)", (5.0, 6.0)),
        ("<answer>12, 34</answer>", (12.0, 34.0)),  # the whole answer is "x, y"
        ("[[10, 20]]", (10.0, 20.0)),
    ],
)
def test_parse_point_accepts(text, expected):
    assert parse_point(text) == PointParse(expected, "")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no point found"),
        ("the button on the left", "no point found"),
        ("12, 34 and more", "no point found"),  # a bare pair only counts as the whole answer
        ("[1, 2, 3, 4]", "found a box, not a point"),
        ("(1,2),(3,4)", "found a box, not a point"),
        ('{"point_2d": [1, 2, 3]}', "point has 3 numbers, need 2"),
        ('{"point_2d": [1]}', "point has 1 number, need 2"),
        ("(nan, 3)", "point has non-finite numbers"),
        ("(1e39, 3)", "point has non-finite numbers"),
    ],
)
def test_parse_point_rejects_with_reason(text, reason):
    assert parse_point(text) == PointParse(None, reason)


def test_parse_point_scales_like_parse_box_and_batches():
    assert parse_point("(500, 250)", normalized_1000=True, scale=(640, 480)).point == (320.0, 120.0)
    assert parse_point("(10, 20)", scale=(2.0, 0.5)).point == (20.0, 10.0)
    assert parse_point(None).reason == "input is not a string"  # type: ignore[arg-type]
    points, reasons = parse_points(["(1, 2)", "none"])
    assert points.shape == (2, 2) and points.dtype == torch.float32
    torch.testing.assert_close(points[0], torch.tensor([1.0, 2.0]))
    assert torch.isnan(points[1]).all() and reasons == ["", "no point found"]
    assert parse_points([])[0].shape == (0, 2)


# --------------------------------------------------------------------------------------------------------------------
# parse_box_list
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '```json\n[{"bbox_2d": [1, 2, 3, 4], "label": "cat 5, 6, 7, 8"}, {"bbox_2d": [50, 60, 70, 80]}]\n```',
            ((1.0, 2.0, 3.0, 4.0), (50.0, 60.0, 70.0, 80.0)),
        ),
        ("[[1, 2, 3, 4], [5, 6, 7, 8]]", ((1.0, 2.0, 3.0, 4.0), (5.0, 6.0, 7.0, 8.0))),
        ("(1, 2, 3, 4) and (5, 6, 7, 8)", ((1.0, 2.0, 3.0, 4.0), (5.0, 6.0, 7.0, 8.0))),
        ("[[[1, 2], [3, 4]], [[5, 6], [7, 8]]]", ((1.0, 2.0, 3.0, 4.0), (5.0, 6.0, 7.0, 8.0))),
        (
            "<|box_start|>(1,2),(3,4)<|box_end|> and <|box_start|>(7,8),(5,6)<|box_end|>",
            ((1.0, 2.0, 3.0, 4.0), (5.0, 6.0, 7.0, 8.0)),  # corners reordered per box
        ),
        ("<answer>[]</answer>", ()),  # nothing to report
        ("[ ]", ()),
        ("1, 2, 3, 4", ((1.0, 2.0, 3.0, 4.0),)),  # a single bare box
    ],
)
def test_parse_box_list_accepts(text, expected):
    assert parse_box_list(text) == BoxListParse(expected, "")


def test_parse_box_list_skips_malformed_boxes_and_says_so():
    got = parse_box_list('[{"bbox_2d": [1, 2, 3, 4]}, {"bbox_2d": [5, 6, 7]}, {"bbox_2d": ["x"]}]')
    assert got == BoxListParse(((1.0, 2.0, 3.0, 4.0),), "skipped 2 malformed boxes: box has 3 numbers, need 4")
    got = parse_box_list("[[1, 2, 3, 4], [5, 5, 5, 9]]")
    assert got == BoxListParse(((1.0, 2.0, 3.0, 4.0),), "skipped 1 malformed box: degenerate box (zero area)")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no box found"),
        ("I see two cats.", "no box found"),
        ('[{"bbox_2d": [1, 2, 3]}]', "box has 3 numbers, need 4"),
        ("[[1, 2, 1, 4]]", "degenerate box (zero area)"),
        ("[1, 2, 3]", "box has 3 numbers, need 4"),
    ],
)
def test_parse_box_list_rejects_with_reason(text, reason):
    assert parse_box_list(text) == BoxListParse(None, reason)


def test_parse_box_lists_batches_with_none_for_unparsed():
    boxes, reasons = parse_box_lists(["[[1,2,3,4],[5,6,7,8]]", "[]", "nothing"], normalized_1000=True, scale=(100, 10))
    torch.testing.assert_close(boxes[0], torch.tensor([[0.1, 0.02, 0.3, 0.04], [0.5, 0.06, 0.7, 0.08]]))
    assert boxes[1].shape == (0, 4) and boxes[2] is None
    assert reasons == ["", "", "no box found"]


# --------------------------------------------------------------------------------------------------------------------
# rescale_boxes / rescale_points
# --------------------------------------------------------------------------------------------------------------------


def test_rescale_boxes_shared_and_per_row_sizes():
    boxes = torch.tensor([[10.0, 20.0, 30.0, 40.0], [NAN, NAN, NAN, NAN]])
    got = rescale_boxes(boxes, (100, 200), (50, 400))  # x halves, y doubles
    torch.testing.assert_close(
        got, torch.tensor([[5.0, 40.0, 15.0, 80.0], [NAN] * 4], dtype=torch.float32), equal_nan=True
    )
    per_row = rescale_boxes(
        torch.tensor([[100.0, 100.0, 500.0, 500.0], [0.0, 0.0, 1000.0, 1000.0]]),
        (1000, 1000),
        torch.tensor([[640, 480], [28, 56]]),
    )  # Qwen2-VL grid -> each row's own image
    torch.testing.assert_close(per_row, torch.tensor([[64.0, 48.0, 320.0, 240.0], [0.0, 0.0, 28.0, 56.0]]))
    many = rescale_boxes(torch.ones(2, 3, 4), torch.tensor([[1.0, 1.0], [2.0, 2.0]]), (4.0, 4.0))  # [R, K, 4]
    torch.testing.assert_close(many, torch.cat([torch.full((1, 3, 4), 4.0), torch.full((1, 3, 4), 2.0)]))
    assert rescale_boxes(torch.tensor([[1, 2, 3, 4]]), (1, 1), (2, 2)).dtype == torch.float32
    with pytest.raises(ValueError):
        rescale_boxes(torch.ones(2, 2), (1, 1), (2, 2))


def test_rescale_points():
    got = rescale_points(torch.tensor([[500.0, 500.0]]), (1000, 1000), (640, 480))
    torch.testing.assert_close(got, torch.tensor([[320.0, 240.0]]))


# --------------------------------------------------------------------------------------------------------------------
# extract_code
# --------------------------------------------------------------------------------------------------------------------

SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"><rect width="4" height="4"/></svg>'


@pytest.mark.parametrize(
    ("text", "lang", "expected"),
    [
        (f"Here:\n```svg\n{SVG}\n```\nDone.", "svg", SVG),
        (f"```xml\n{SVG}\n```", "svg", SVG),
        (f"```\n{SVG}\n```", "svg", SVG),
        (f"```html\n<p>no svg</p>\n```\nbare {SVG} after", "svg", SVG),  # the html block has no <svg
        (f"Sure! {SVG} is it.", "svg", SVG),
        ("<SVG width='1'></SVG>", "svg", "<SVG width='1'></SVG>"),
        ("```python\nprint(1)\n```", "python", "print(1)"),
        ("```py\nx = 1\n```", "PYTHON", "x = 1"),
        ("```python\nold()\n```\nfixed:\n```python\nnew()\n```", "python", "new()"),  # the last one wins
        ("```json\n{}\n```\n```python\n    indented()\n\n```", "python", "    indented()"),
        ("```js\nf()\n```", None, "f()"),
        ("<think>```python\ndraft()\n```</think>```python\nfinal()\n```", "python", "final()"),
        ("```python\ncut off at the token lim", "python", None),  # unclosed fence
        ("```python\nprint(1)\n```", "svg", None),
        ("no code", None, None),
        ("```svg inline``` text", "svg", None),
        ("</svg> before <svg", "svg", None),
    ],
)
def test_extract_code(text, lang, expected):
    assert extract_code(text, lang) == expected


# --------------------------------------------------------------------------------------------------------------------
# parse_number
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value", "percent"),
    [
        ("42", 42.0, False),
        ("The answer is 1,234.", 1234.0, False),
        ("1,234,567.89", 1234567.89, False),
        ("-3.5", -3.5, False),
        ("\u22127", -7.0, False),  # Unicode minus
        ("2.5e-3", 0.0025, False),
        ("6.02E23", 6.02e23, False),
        ("45%", 45.0, True),
        ("grew by 12.5 %", 12.5, True),
        ("$1,000", 1000.0, False),
        ("3/4", 0.75, False),
        ("First 3 apples, then 4 more: 7 in total", 7.0, False),  # the last number
        ("\\boxed{12} and later 99", 12.0, False),  # a boxed result wins
        ("<answer>-0.5</answer> I checked 3 times", -0.5, False),
        ("1,2", 2.0, False),  # not a thousands group: two numbers
        (".5", 0.5, False),
        ("1e999 is big, the answer is 2", 2.0, False),
    ],
)
def test_parse_number_accepts(text, value, percent):
    got = parse_number(text)
    assert got.reason == "" and got.percent is percent
    assert got.value == pytest.approx(value)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no number found"),
        ("no digits here", "no number found"),
        ("version v2 of x3", "no number found"),  # glued to words
        ("1e999", "number is not finite"),
        ("5/0", "division by zero"),
    ],
)
def test_parse_number_rejects_with_reason(text, reason):
    assert parse_number(text) == NumberParse(None, False, reason)


# --------------------------------------------------------------------------------------------------------------------
# parse_choice
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("B", "B"),
        ("(B)", "B"),
        ("b.", "B"),
        ("**C**", "C"),
        ("<answer>D</answer>", "D"),
        ("<think>maybe A</think><answer>(e)</answer>", "E"),
        ("Answer: b", "B"),
        ("The answer is (C).", "C"),
        ("I think the correct option is D because it is red.", "D"),
        ("The answer is A, no wait, the answer is B.", "B"),  # the last phrase
        ("B. The red circle", "B"),
        ("(C) the dog", "C"),
        ("Looking at the chart, (A) fits best.", "A"),
    ],
)
def test_parse_choice_accepts(text, letter):
    assert parse_choice(text) == ChoiceParse(letter, "")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no choice found"),
        ("the answer is a cat", "no choice found"),  # a lower-case article is no choice
        ("I like (A) and (C).", "ambiguous choice: A, C"),
        ("F", "F is not one of ABCDE"),
        ("Answer: F", "no choice found"),
    ],
)
def test_parse_choice_rejects_with_reason(text, reason):
    assert parse_choice(text) == ChoiceParse(None, reason)


def test_parse_choice_other_letter_sets():
    assert parse_choice("(F)", choices="ABCDEF").letter == "F"
    assert parse_choice("answer: b", choices="AB").letter == "B"


# --------------------------------------------------------------------------------------------------------------------
# fuzz: every parser gives a valid value or None with a reason, on any text
# --------------------------------------------------------------------------------------------------------------------

FUZZ_200 = settings(max_examples=200, deadline=None, derandomize=True, database=None)
PIECES = NEAR_MISS_PIECES + [
    '"point_2d": ', "{", "}", "```", "```svg\n", "```python\n", "\n", "<svg>", "</svg>", "%", ",", "1,234", "e-3",
    "/", "\\boxed{", "answer: ", "(B)", "b.", "option ", "\u2212", "$", "[]",
]  # fmt: skip
ANY_TEXT = st.one_of(st.text(), st.lists(st.sampled_from(PIECES), max_size=40).map("".join))


@FUZZ_200
@given(ANY_TEXT)
def test_fuzz_parse_point(text):
    got = parse_point(text)
    assert isinstance(got, PointParse)
    if got.point is None:
        assert got.reason
    else:
        assert got.reason == "" and all(isinstance(v, float) and math.isfinite(v) for v in got.point)


@FUZZ_200
@given(ANY_TEXT)
def test_fuzz_parse_box_list(text):
    got = parse_box_list(text)
    assert isinstance(got, BoxListParse)
    if got.boxes is None:
        assert got.reason
    else:
        for x1, y1, x2, y2 in got.boxes:
            assert all(math.isfinite(v) for v in (x1, y1, x2, y2)) and x1 < x2 and y1 < y2


@FUZZ_200
@given(ANY_TEXT, st.sampled_from([None, "svg", "python", "PY", "", "c++"]))
def test_fuzz_extract_code(text, lang):
    got = extract_code(text, lang)
    assert got is None or isinstance(got, str)


@FUZZ_200
@given(ANY_TEXT)
def test_fuzz_parse_number(text):
    got = parse_number(text)
    assert isinstance(got, NumberParse)
    if got.value is None:
        assert got.reason and got.percent is False
    else:
        assert got.reason == "" and math.isfinite(got.value)


@FUZZ_200
@given(ANY_TEXT)
def test_fuzz_parse_choice(text):
    got = parse_choice(text)
    assert isinstance(got, ChoiceParse)
    assert (got.letter is None and got.reason) or (got.letter in "ABCDE" and len(got.letter) == 1 and got.reason == "")


@pytest.mark.parametrize(
    "text",
    [
        "[" * 200_000,
        "(1," * 100_000,
        "1," * 200_000,
        "```" * 100_000,
        "```\n" * 100_000,
        "<svg" * 100_000,
        "answer" + " " * 100_000 + "is",
        "1" + " " * 100_000,
        "\\boxed{" * 50_000,
        '{"point_2d": [' * 30_000,
    ],
)
def test_new_parsers_stay_fast_on_adversarial_input(text):
    start = time.perf_counter()
    for parse in (parse_point, parse_box_list, extract_code, parse_number, parse_choice):
        parse(text)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"{elapsed:.2f}s"
