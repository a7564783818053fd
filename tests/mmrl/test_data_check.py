"""`mmrl data check`: a dataset read as training would read it; its report's lines, and exit code 2 for a bad row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

import sim
from mmrl.cli import main
from mmrl.data_check import check_dataset
from mmrl.policy import build_tiny

REPO = Path(__file__).resolve().parents[2]


def _png(path: Path, size: tuple[int, int]) -> None:
    Image.new("RGB", size, (90, 160, 30)).save(path)


def _jsonl(folder: Path, records: list[dict | str]) -> Path:
    path = folder / "data.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


GOOD = [
    {"image": "wide.png", "question": "Find the box.", "box": [30, 20, 150, 100]},
    {"image": "square.png", "instruction": "Click it.", "point": [10, 50]},
    {"image": "small.png", "question": "What colour?", "answer": "green"},
]


@pytest.fixture()
def good(tmp_path) -> Path:
    """A 300x200, a 64x64 and a 40x20 image: a box, a point and a text answer."""
    for name, size in (("wide", (300, 200)), ("square", (64, 64)), ("small", (40, 20))):
        _png(tmp_path / f"{name}.png", size)
    return _jsonl(tmp_path, GOOD)


def _run(capsys, *argv: str) -> tuple[int, list[str], str]:
    code = main(["data", "check", *argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_a_good_json_lines_dataset_is_reported_and_exits_0(good, capsys):
    code, lines, err = _run(capsys, str(good), "--model", "tiny:qwen3_vl")
    assert code == 0, err
    assert lines[1:6] == [
        "rows: 3 (3 good, 0 bad)",
        "targets: box 1 (box_iou 1); point 1 (point_in_box 1); answer 1 (exact_match 1)",
        "image sizes: width min 40 / median 64 / max 300, height min 20 / median 64 / max 200 (pixels, as stored)",
        "shown: letterboxed into 64x64",
        "boxes: xyxy in pixels of the original image in the data; the model (tiny:qwen3_vl) is asked for and scored "
        "in 0-1000, relative to the image",
    ]
    assert lines[6].startswith("prompt tokens: min ") and not any(line.startswith("bad:") for line in lines)


def test_options_and_the_model_change_what_is_reported(good, capsys):
    """An env option as key=value (after the options too), a dotted config field, a model in pixels; without a model
    the convention is the default model's and no tokens are counted."""
    code, lines, _ = _run(capsys, str(good), "--model", "tiny:qwen2_5_vl", "image_size=128")
    assert code == 0
    assert "shown: letterboxed into 128x128" in lines
    assert lines[5].endswith("asked for and scored in pixels of the 140x140 image the model sees (its processor "
                             "resizes the 128x128 shown)")  # fmt: skip
    code, lines, _ = _run(capsys, str(good), "env.options.image_size=32")
    assert code == 0 and "shown: letterboxed into 32x32" in lines
    # The default model, the warm start, answers in pixels; its processor brings a 32 px image up to its 64 px least.
    assert lines[5].endswith("(assets/tiny_models/qwen3_vl_warm_start) is asked for and scored in pixels of the "
                             "64x64 image the model sees (its processor resizes the 32x32 shown)")  # fmt: skip
    assert lines[6] == "prompt tokens: give --model to count them"
    code, lines, _ = _run(capsys, str(good), "--config", str(REPO / "configs" / "dataset_tiny.yaml"))
    assert code == 0 and "rows: 3 (3 good, 0 bad)" in lines


def test_prompt_tokens_are_the_policys_own(good):
    """Per row, the tokens the policy's encoding of the shown record holds (template, hint, image tokens)."""
    report = check_dataset(str(good), model="tiny:qwen2_5_vl")
    env = sim.make("dataset", num_envs=3, path=good, split="all", shuffle=False, coordinates="pixels", input_size=56)
    obs = env.reset(seed=[0, 1, 2])
    inputs = build_tiny("qwen2_5_vl", seed=0).encode(obs)
    assert report.tokens == inputs["attention_mask"].sum(-1).tolist()
    assert len(set(report.tokens)) == 3  # the questions and hints differ in length


def test_bad_rows_are_each_named_and_exit_2(good, capsys):
    _png(good.parent / "tiny.png", (10, 10))
    (good.parent / "cut.png").write_bytes((good.parent / "wide.png").read_bytes()[:60])  # a header, no pixels
    _jsonl(good.parent, [
        *GOOD,
        {"image": "tiny.png", "question": "Find it.", "box": [2, 2, 30, 8]},  # line 4: outside the 10x10 image
        '{"image": "square.png", "question": ',  # line 5: not JSON
        {"image": "gone.png", "question": "Q?", "answer": "a"},  # line 6: no such file
        {"image": "square.png", "question": "Q?"},  # line 7: no target
        {"image": "cut.png", "question": "Q?", "answer": "a"},  # line 8: does not decode
    ])  # fmt: skip
    code, lines, _ = _run(capsys, str(good))
    assert code == 2
    assert "rows: 8 (3 good, 5 bad)" in lines
    bad = [line for line in lines if line.startswith("bad: ")]
    assert len(bad) == 5
    for number, field in (
        (4, "field 'box'"),
        (5, "not valid JSON"),
        (6, "field 'image'"),
        (7, ""),
        (8, "field 'image'"),
    ):
        assert any(line.startswith(f"bad: data.jsonl line {number}: {field}") for line in bad), (number, bad)


def test_a_saved_datasets_folder_good_and_bad(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    images = [Image.new("RGB", (32, 24), (200, 0, 0)) for _ in range(3)]
    columns = {"image": images, "question": ["Find it."] * 3, "box": [[1, 1, 10, 10], [0, 0, 32, 24], [5, 5, 9, 9]]}
    datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "good"))
    code, lines, err = _run(capsys, str(tmp_path / "good"))
    assert code == 0, err
    assert lines[1:3] == ["rows: 3 (3 good, 0 bad)", "targets: box 3 (box_iou 3)"]
    assert (
        "image sizes: width min 32 / median 32 / max 32, height min 24 / median 24 / max 24 (pixels, as stored)"
        in lines
    )
    # Embedded images are read only when shown: a broken one and a box outside its image are found by showing them.
    columns["box"][1] = [0, 0, 40, 24]
    features = datasets.Features({"image": datasets.Image(), "question": datasets.Value("string"),
                                  "box": datasets.Sequence(datasets.Value("float64"))})  # fmt: skip
    rows = datasets.Dataset.from_dict(columns, features=features).cast_column("image", datasets.Image(decode=False))
    rows = rows.map(lambda row, i: {"image": {"bytes": b"not an image" if i == 2 else row["image"]["bytes"],
                                              "path": None}}, with_indices=True)  # fmt: skip
    rows.cast_column("image", datasets.Image()).save_to_disk(str(tmp_path / "bad"))
    code, lines, _ = _run(capsys, str(tmp_path / "bad"))
    assert code == 2
    assert "rows: 3 (1 good, 2 bad)" in lines
    bad = [line for line in lines if line.startswith("bad: ")]
    assert bad[0].startswith("bad: bad row 1: field 'box' = [0.0, 0.0, 40.0, 24.0] lies outside the 32x24 image")
    assert bad[1].startswith("bad: bad row 2: field 'image': cannot read the image")


def test_mistakes_are_one_line_and_exit_2(good, capsys):
    code, lines, err = _run(capsys, str(good), "colour=red")
    assert code == 2 and lines == [] and err.startswith("mmrl: config error: env.options.colour: unknown option")
    code, _, err = _run(capsys, str(good), "--config", str(REPO / "configs" / "grounding_tiny.yaml"))
    assert code == 2 and "trains on the 'grounding' env; data check reads 'dataset' datasets" in err
    code, _, err = _run(capsys, str(good.parent / "nothing.jsonl"))
    assert code == 2 and err.count("\n") == 1 and "nothing.jsonl" in err
    _jsonl(good.parent, [{"image": "gone.png", "question": "Q?", "answer": "a"}])  # no good row at all
    code, _, err = _run(capsys, str(good))
    assert code == 2 and err.count("\n") == 1 and "line 1: field 'image'" in err
