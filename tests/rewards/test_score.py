"""`mmrl score`: JSON lines and folders in, per-item scores and a summary out; broken items are rows, not crashes."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("cairosvg")

from mmrl.cli import main  # noqa: E402
from rewards.render import render  # noqa: E402
from rewards.score import MAX_TEXT_FILE, read_items, score_items  # noqa: E402

NS = 'xmlns="http://www.w3.org/2000/svg"'
RED = f'<svg {NS} width="8" height="8"><rect width="8" height="8" fill="red"/></svg>'
HALF = f'<svg {NS} width="8" height="8"><rect width="4" height="8" fill="red"/></svg>'


def save_png(path: Path, color: tuple[int, int, int], size: int = 32) -> Path:
    from PIL import Image

    Image.new("RGB", (size, size), color).save(path)
    return path


@pytest.fixture
def jsonl(tmp_path) -> Path:
    save_png(tmp_path / "red.png", (255, 0, 0))
    save_png(tmp_path / "blue.png", (0, 0, 255), size=50)  # resized to --size
    (tmp_path / "half.svg").write_text(HALF)
    rows = [
        {"id": "same", "prediction": RED, "target": "red.png"},
        {"id": "file", "prediction": "half.svg", "target": {"image": "red.png"}},
        {"id": "image", "prediction": "blue.png", "target": "red.png"},
        {"id": "broken", "prediction": "<svg", "target": "red.png"},
        {"id": "hostile", "prediction": f'<svg {NS}><image href="file:///etc/passwd"/></svg>', "target": "red.png"},
        {"id": "no_target", "prediction": RED, "target": "missing.png"},
        {"id": "box", "prediction": "<answer>[0, 0, 10, 10]</answer>", "target": [0, 0, 10, 20]},
        {"id": "no_box", "prediction": "I cannot see it", "target": {"box": [0, 0, 10, 20]}},
        {"id": "text", "prediction": "the cat sat", "target": {"text": "The cat"}, "reference_length": 20},
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    return path


def test_score_jsonl_rows(jsonl):
    items = read_items(jsonl, render="auto")
    metrics = ["pixel", "ssim", "box_iou", "text_f1", "code_length"]
    score_items(items, metrics, size=(16, 16), workers=1, progress=False)
    by_id = {item.id: item for item in items}
    assert len(items) == 10 and by_id["10"].pred_error.startswith("line 10 is not JSON")
    assert by_id["same"].scores["pixel"] == pytest.approx(1.0) and by_id["same"].scores["ssim"] == pytest.approx(1.0)
    assert by_id["same"].pred_error == by_id["same"].target_error == "" and by_id["same"].render_seconds is not None
    # Its empty scores say why they are empty.
    assert (
        math.isnan(by_id["same"].scores["box_iou"])
        and "box_iou: the prediction must be text (not an SVG) and the target must be a box (not an image)"
        in by_id["same"].reason
    )
    assert by_id["file"].scores["pixel"] == pytest.approx(1 - 0.5 * 2 / 3, abs=0.02)  # half the pixels, 2 channels
    assert by_id["image"].scores["pixel"] == pytest.approx(1 - 2 / 3, abs=1e-6)  # red vs blue: 2 channels of 3
    for name in ("broken", "hostile"):  # the prediction failed: 0.0 and the reason
        assert by_id[name].scores["pixel"] == 0.0
    assert by_id["broken"].reason == "prediction holds no <svg>...</svg> element (fenced or bare)"
    assert by_id["hostile"].reason.startswith("render failed")
    assert "external reference" in by_id["hostile"].reason
    assert math.isnan(by_id["no_target"].scores["pixel"]) and "not found" in by_id["no_target"].reason
    assert by_id["box"].scores["box_iou"] == pytest.approx(0.5) and math.isnan(by_id["box"].scores["pixel"])
    assert by_id["no_box"].scores["box_iou"] == 0.0 and "no box" in by_id["no_box"].reason
    assert by_id["text"].scores["text_f1"] == pytest.approx(0.8)
    assert by_id["text"].scores["code_length"] == pytest.approx(1 - (1 / 20) ** 2)  # 11 chars, free up to 10


def test_cli_writes_csv_and_jsonl_and_prints_a_summary(jsonl, tmp_path, capsys):
    out = tmp_path / "scores.csv"
    argv = ["score", str(jsonl), "--metrics", "ssim,pixel", "--size", "16", "--workers", "1", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "ssim" in printed and "mean" in printed and "top reasons" in printed
    assert "1 of 4 renders failed" in printed  # the cut-off "<svg" is no render: no SVG element in it
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["id"] for r in rows][:3] == ["same", "file", "image"]
    assert set(rows[0]) == {"id", "prediction", "target", "ssim", "pixel", "render_seconds", "reason"}
    assert float(rows[0]["ssim"]) == pytest.approx(1.0) and rows[6]["ssim"] == ""  # box row: not applicable
    jsonl_out = tmp_path / "scores.jsonl"
    assert main([*argv[:-1], str(jsonl_out), "--metrics", "box_iou", "--no-progress"]) == 0
    lines = [json.loads(line) for line in jsonl_out.read_text().splitlines()]
    assert lines[6]["box_iou"] == pytest.approx(0.5) and lines[0]["box_iou"] is None


def test_folder_mode_matches_stems(tmp_path, capsys):
    (tmp_path / "pred").mkdir()
    (tmp_path / "target").mkdir()
    (tmp_path / "pred" / "a.svg").write_text(RED)
    save_png(tmp_path / "target" / "a.png", (255, 0, 0))
    save_png(tmp_path / "pred" / "b.png", (255, 0, 0))
    save_png(tmp_path / "target" / "b.png", (255, 0, 0))
    (tmp_path / "pred" / "c.svg").write_text(RED)  # no target
    (tmp_path / "pred" / "d.txt").write_text("a box at [1, 1, 5, 5]")
    (tmp_path / "target" / "d.json").write_text("[1, 1, 5, 5]")
    assert main(["score", str(tmp_path), "--metrics", "pixel,box_iou", "--size", "8", "--workers", "1"]) == 0
    items = {item.id: item for item in read_items(tmp_path)}
    assert items["a"].pred_kind == "svg" and items["b"].pred_kind == "image" and items["d"].target_kind == "box"
    assert "0 files named c.*" in items["c"].reason
    printed = capsys.readouterr().out
    assert "pixel" in printed and "box_iou" in printed


def test_targets_given_as_sources_are_rendered_once_and_compared_as_images(tmp_path, capsys):
    (tmp_path / "pred").mkdir()
    (tmp_path / "target").mkdir()
    for stem in ("a", "b"):
        (tmp_path / "pred" / f"{stem}.svg").write_text(RED if stem == "a" else HALF)
        (tmp_path / "target" / f"{stem}.svg").write_text(RED)
    (tmp_path / "pred" / "c.svg").write_text(RED)
    (tmp_path / "target" / "c.svg").write_text(f'<svg {NS}><image href="file:///etc/passwd"/></svg>')
    (tmp_path / "pred" / "d.svg").write_text(RED)
    (tmp_path / "target" / "d.txt").write_text("a caption")
    out = tmp_path / "scores.jsonl"
    argv = ["score", str(tmp_path), "--metrics", "ssim", "--size", "8", "--workers", "1", "--out", str(out)]
    assert main(argv) == 0
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["a"]["ssim"] == pytest.approx(1.0) and rows["a"]["reason"] == ""
    assert rows["b"]["ssim"] < 0.9  # half the canvas differs
    assert rows["c"]["ssim"] is None and rows["c"]["reason"].startswith("target render failed")
    assert "external reference" in rows["c"]["reason"]
    assert rows["d"]["ssim"] is None  # no empty score without why:
    assert rows["d"]["reason"] == "empty: ssim: the target must be an image (not text)"
    printed = capsys.readouterr().out
    assert printed.index("renders failed") < printed.index("mean")  # refusals come first in the summary
    assert "1 of 3 target renders failed" in printed
    # Inline sources as targets, the same source rendered once for all rows that share it.
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "\n".join(json.dumps({"id": str(i), "prediction": RED, "target": {"svg": RED}}) for i in range(3))
    )
    items = read_items(pairs)
    calls = []
    from rewards import score as score_module

    original = score_module.RenderPool.render_batch

    def counting(self, sources, *args, **kwargs):
        calls.append(len(sources))
        return original(self, sources, *args, **kwargs)

    score_module.RenderPool.render_batch = counting
    try:
        score_items(items, ["ssim"], size=(8, 8), workers=1, progress=False)
    finally:
        score_module.RenderPool.render_batch = original
    assert [item.scores["ssim"] for item in items] == pytest.approx([1.0] * 3)
    assert sorted(calls) == [1, 3]  # 3 predictions, and the shared target once


def test_cli_usage_errors(tmp_path, capsys):
    assert main(["score", str(tmp_path / "nope.jsonl")]) == 2
    assert main(["score", str(tmp_path), "--metrics", "ssim,psnr"]) == 2
    assert main(["score", str(tmp_path), "--size", "big"]) == 2
    assert main(["score", str(tmp_path), "--metrics", "embedding"]) == 2
    err = capsys.readouterr().err
    assert "psnr" in err and "--size" in err and "--encoder" in err


def test_help_shows_an_example(capsys):
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    assert "mmrl score pairs.jsonl --metrics ssim,pixel,edge" in capsys.readouterr().out


def test_folder_mode_with_a_relative_folder(tmp_path, monkeypatch):
    # A folder given relative to the working directory (how people type it) must resolve its files once, not twice.
    (tmp_path / "run" / "pred").mkdir(parents=True)
    (tmp_path / "run" / "target").mkdir()
    (tmp_path / "run" / "pred" / "a.svg").write_text(RED)
    save_png(tmp_path / "run" / "target" / "a.png", (255, 0, 0))
    monkeypatch.chdir(tmp_path)
    items = {item.id: item for item in read_items(Path("run"))}
    assert items["a"].reason == "" and items["a"].target_kind == "image"


def test_score_cad_scripts(tmp_path):
    """A build123d `.py` prediction is rendered as CAD (not matplotlib) and compared with a target render."""
    pytest.importorskip("build123d")
    from PIL import Image

    box = "from build123d import *\nresult = Box(10, 20, 5)\n"
    target = render("cad", box, size=(32, 32))
    assert target.image is not None, target.reason
    Image.fromarray(target.image.numpy()).save(tmp_path / "box.png")
    (tmp_path / "box.py").write_text(box)
    (tmp_path / "ball.py").write_text("from build123d import *\nresult = Sphere(8)\n")
    rows = [{"id": "same", "prediction": "box.py", "target": "box.png"},
            {"id": "other", "prediction": "ball.py", "target": "box.png"}]  # fmt: skip
    (tmp_path / "cad.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    items = read_items(tmp_path / "cad.jsonl", render="auto")
    assert [item.pred_kind for item in items] == ["cad", "cad"]
    score_items(items, ["ssim"], size=(32, 32), workers=1, progress=False)
    by_id = {item.id: item for item in items}
    assert by_id["same"].scores["ssim"] == pytest.approx(1.0, abs=1e-4)
    assert by_id["other"].scores["ssim"] < 0.95


@pytest.fixture
def unreadable(tmp_path) -> Path:
    """Pairs whose files or lines cannot be read, between two good rows: each is its row's reason, never the run's."""
    save_png(tmp_path / "red.png", (255, 0, 0))
    (tmp_path / "latin1.svg").write_bytes(RED.replace("</svg>", "<!-- caf\xe9 --></svg>").encode("latin-1"))
    (tmp_path / "big.svg").write_text(RED + " " * MAX_TEXT_FILE)
    rows = [
        json.dumps({"id": "good", "prediction": RED, "target": "red.png"}),
        json.dumps({"id": "gone_pred", "prediction": "preds/gone.svg", "target": "red.png"}),
        json.dumps({"id": "gone_target", "prediction": RED, "target": "targets/gone.svg"}),
        json.dumps({"id": "latin1", "prediction": "latin1.svg", "target": "red.png"}),
        json.dumps({"id": "big", "prediction": "big.svg", "target": "red.png"}),
        '{"id": "deep", "prediction": ' + "[" * 100_000 + "]" * 100_000 + ', "target": "red.png"}',
        '{"id": "digits", "prediction": "<answer>[0, 0, 1, 1]</answer>", "target": [' + "9" * 5000 + ", 0, 1, 1]}",
        '{"id": "wide", "prediction": "<answer>[0, 0, 1, 1]</answer>", "target": [' + "9" * 400 + ", 0, 1, 1]}",
        json.dumps({"id": "also_good", "prediction": "<answer>[0, 0, 10, 10]</answer>", "target": [0, 0, 10, 20]}),
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_bytes("\n".join(rows).encode() + b'\n{"id": "bytes\xff", "prediction": "x", "target": "y"}\n')
    return path


def test_unreadable_files_and_lines_are_the_rows_reasons(unreadable, tmp_path):
    items = {item.id: item for item in read_items(unreadable, render="auto")}
    assert list(items) == ["good", "gone_pred", "gone_target", "latin1", "big", "6", "7", "wide", "also_good", "10"]
    assert items["good"].reason == "" and items["also_good"].reason == ""
    # A missing file is named as one, not read as a text answer (or target) with an unrelated reason.
    assert items["gone_pred"].pred_error == f"file not found: {tmp_path / 'preds' / 'gone.svg'}"
    assert items["gone_pred"].pred_kind == "svg"
    assert items["gone_target"].target_error == f"file not found: {tmp_path / 'targets' / 'gone.svg'}"
    # Not UTF-8: refused with where, not silently repaired.
    assert items["latin1"].pred_error.startswith("prediction file latin1.svg is not UTF-8 (byte 0xe9 at offset ")
    # Over the size limit: which file, its size and the limit.
    size = (tmp_path / "big.svg").stat().st_size
    assert items["big"].pred_error == f"prediction file big.svg is {size} bytes, over the limit of {MAX_TEXT_FILE}"
    assert items["6"].pred_error.startswith("line 6 is not readable JSON (RecursionError")
    assert items["7"].pred_error.startswith("line 7 is not readable JSON (ValueError: Exceeds the limit")
    assert items["wide"].target_error == "target box must be 4 finite numbers"  # 400 digits: too large for a float
    assert items["10"].pred_error == "line 10 is not UTF-8 (byte 0xff at offset 13)"


def test_the_cli_scores_the_readable_rows_and_writes_every_row(unreadable, tmp_path, capsys):
    out = tmp_path / "scores.jsonl"
    argv = ["score", str(unreadable), "--metrics", "pixel,box_iou", "--size", "8", "--workers", "1", "--out", str(out)]
    assert main(argv) == 0
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert len(rows) == 10
    assert rows["good"]["pixel"] == pytest.approx(1.0) and rows["also_good"]["box_iou"] == pytest.approx(0.5)
    assert rows["gone_pred"]["pixel"] == 0.0 and rows["gone_pred"]["reason"].startswith("file not found")
    assert "pairs with a problem" in capsys.readouterr().out
