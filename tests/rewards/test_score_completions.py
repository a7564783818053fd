"""`mmrl score` reads sources as a model writes them (fenced blocks, a leading sentence, think and answer tags) for
every render kind, as the render envs read their answers; a reason names the side that is wrong; unmatched files are
no pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("cairosvg")

from mmrl.cli import main  # noqa: E402
from rewards.render import html  # noqa: E402
from rewards.score import read_items, score_items  # noqa: E402

NS = 'xmlns="http://www.w3.org/2000/svg"'
SVG = f'<svg {NS} width="8" height="8"><rect width="8" height="4" fill="red"/></svg>'
CHART = "import matplotlib.pyplot as plt\nplt.bar([0, 1], [1, 2], color='red')\n"
PAGE = '<html><body style="margin:0"><div style="width:4px;height:8px;background:red"></div></body></html>'
CAD = "from build123d import *\nresult = Box(10, 20, 5)\n"


def completions(kind: str, source: str) -> dict[str, str]:
    """The ways a model writes `source`, by name."""
    fence = {"svg": "svg", "chart": "python", "cad": "python", "html": "html"}[kind]
    written = {
        "fenced": f"Here is the {kind}:\n```{fence}\n{source}\n```\nIt matches the image.",
        "thought_and_answer": f"<think>first a draft ```{fence}\nnot this\n```</think><answer>\n```{fence}\n{source}```"
        "\n</answer>",
    }
    if kind == "svg":
        written["sentence_then_bare"] = f"Sure! The image is a red band: {source} Hope this helps."
    return written


def score_rows(tmp_path: Path, rows: list[dict], metrics: list[str], render: str = "auto") -> dict:
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows))
    items = read_items(path, render=render)
    score_items(items, metrics, size=(16, 16), workers=1, progress=False)
    return {item.id: item for item in items}


KINDS = [
    ("svg", SVG),
    ("chart", CHART),
    pytest.param("html", PAGE, marks=pytest.mark.skipif(html.unavailable() is not None, reason="no Chromium")),
]


@pytest.mark.parametrize(("kind", "source"), KINDS)
@pytest.mark.parametrize("render", ["auto", "kind"])
def test_completions_score_as_their_clean_source(tmp_path, kind, source, render):
    """Each written form, read with --render auto and with --render <kind>, scores as the bare source against a
    target rendered from that source (a fenced SVG scored empty, blaming the target, before)."""
    written = completions(kind, source)
    rows = [{"id": name, "prediction": text, "target": {kind: source}} for name, text in written.items()]
    items = score_rows(tmp_path, rows, ["ssim"], render=kind if render == "kind" else "auto")
    for name in written:
        assert items[name].pred_kind == kind, name
        assert items[name].reason == "", name
        assert items[name].scores["ssim"] == pytest.approx(1.0, abs=1e-4), name


def test_a_build123d_completion_is_cad(tmp_path):
    pytest.importorskip("build123d")
    rows = [{"id": "cad", "prediction": completions("cad", CAD)["fenced"], "target": {"cad": CAD}}]
    item = score_rows(tmp_path, rows, ["ssim"])["cad"]
    assert item.pred_kind == "cad" and item.scores["ssim"] == pytest.approx(1.0, abs=1e-4)


def test_reasons_name_the_side_that_is_wrong(tmp_path):
    (tmp_path / "sentence.svg").write_text("I could not draw this image.")
    rows = [
        {"id": "no_svg", "prediction": "I would draw a red band.", "target": {"svg": SVG}},
        {"id": "file", "prediction": "sentence.svg", "target": {"svg": SVG}},
        {"id": "text_vs_image", "prediction": "a red band", "target": {"svg": SVG}},
        {"id": "svg_vs_box", "prediction": SVG, "target": [0, 0, 4, 4]},
        {"id": "empty_fence", "prediction": "```python\n```", "target": {"chart": CHART}},
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows))
    forced = {item.id: item for item in read_items(path, render="svg")}
    assert forced["no_svg"].pred_error == "prediction holds no <svg>...</svg> element (fenced or bare)"
    assert forced["file"].pred_error == "prediction file sentence.svg holds no <svg>...</svg> element (fenced or bare)"
    items = score_rows(tmp_path, rows, ["ssim", "box_iou"])
    assert items["file"].scores["ssim"] == 0.0 and "sentence.svg holds no <svg>" in items["file"].reason
    reason = items["text_vs_image"].reason
    assert reason.startswith("empty: ssim: the prediction must be an image or a source to render")
    assert "(not text): inline text is read as code when it holds SVG, HTML or fenced code" in reason
    assert "ssim: the target" not in reason  # the target, an image, is right for ssim
    assert "box_iou: the target must be a box (not an image)" in reason  # the text prediction is right for box_iou
    reason = items["svg_vs_box"].reason
    assert "ssim: the target must be an image (not a box)" in reason and "ssim: the prediction" not in reason
    assert "box_iou: the prediction must be text (not an SVG)" in reason
    assert items["empty_fence"].pred_error == "prediction holds no code"  # python fence, read as a chart
    assert items["empty_fence"].scores["ssim"] == 0.0


def test_the_summary_does_not_count_unmatched_files_as_pairs(tmp_path, capsys):
    for side in ("pred", "target"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "a.svg").write_text(SVG if side == "target" else f"```svg\n{SVG}\n```")
    (tmp_path / "pred" / "lonely.svg").write_text(SVG)
    (tmp_path / "target" / "orphan.svg").write_text(SVG)
    assert main(["score", str(tmp_path), "--metrics", "ssim", "--size", "8", "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    first = printed.splitlines()[0]
    assert first.startswith("1 pairs; 0 of 1 renders failed") and first.endswith("; 0 pairs with a problem")
    assert (
        "2 files without a partner of the same stem in the other folder, not scored: lonely.svg, orphan.svg" in printed
    )
    assert "ssim                  1   1.0000" in printed
