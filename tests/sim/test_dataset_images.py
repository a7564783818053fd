"""The dataset env shows a user's image files as a viewer does, checks boxes in that frame, and bounds a row's text.

The images are built here with PIL: an EXIF-rotated JPEG whose box was drawn on the photo as a viewer shows it, an
RGBA PNG hiding a colour under alpha 0, a 16-bit PNG in mid-grey.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import sim.tasks.records as records
from sim.errors import InputError
from sim.tasks.dataset import DatasetEnv

RED = (255, 0, 0)


def write_jsonl(path: Path, rows: list[dict | str]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def rotated_jpeg(path: Path) -> None:
    """A 20x40 portrait photo, red at x 2-12 and y 24-36 as a viewer shows it, stored sideways (40x20) with EXIF
    orientation 6, as a phone held upright stores it."""
    photo = Image.new("RGB", (20, 40), (230, 230, 230))
    photo.paste(RED, (2, 24, 12, 36))
    exif = Image.Exif()
    exif[0x0112] = 6
    photo.transpose(Image.Transpose.ROTATE_90).save(path, "JPEG", exif=exif, quality=100)


def test_a_box_drawn_on_an_exif_rotated_photo_is_checked_and_shown_upright(tmp_path):
    rotated_jpeg(tmp_path / "photo.jpg")
    box = [2, 24, 12, 36]  # in the upright photo: outside the stored 40x20 frame (y up to 36)
    path = write_jsonl(tmp_path / "data.jsonl", [{"image": "photo.jpg", "question": "Find red.", "box": box}])
    env = DatasetEnv(num_envs=1, path=path, image_size=40, eval_fraction=0.0, shuffle=False)
    assert env.records[0].size == (20, 40)
    obs = env.reset(seed=0)
    image = obs.image[0].int()  # 20x40 letterboxed into 40x40: 10 black columns on each side
    assert (image[:, :10] == 0).all() and (image[:, 30:] == 0).all()
    assert (image[26:34, 14:20] - torch.tensor(RED)).abs().max() < 40  # the block where the user drew the box
    result = env.step(["<answer>[12, 24, 22, 36]</answer>"])  # the box in the shown image's pixels
    assert result.reward[0] > 0.99
    sideways = write_jsonl(
        tmp_path / "sideways.jsonl", [{"image": "photo.jpg", "question": "Q?", "box": [25, 2, 35, 10]}]
    )  # inside the stored frame, outside the photo as seen
    with pytest.raises(InputError, match=r"sideways.jsonl line 1: field 'box' .* outside the 20x40 image"):
        DatasetEnv(num_envs=1, path=sideways)


def test_transparent_pixels_show_white_and_sixteen_bit_grey_stays_grey(tmp_path):
    hidden = np.zeros((8, 8, 4), dtype=np.uint8)
    hidden[..., 0] = 255  # red under alpha 0 everywhere
    Image.fromarray(hidden, mode="RGBA").save(tmp_path / "clear.png")
    Image.fromarray(np.full((8, 8), 32768, dtype=np.uint16)).save(tmp_path / "deep.png")
    rows = [{"image": name, "question": "Q?", "answer": "a"} for name in ("clear.png", "deep.png")]
    env = DatasetEnv(num_envs=2, path=write_jsonl(tmp_path / "d.jsonl", rows), image_size=8, eval_fraction=0.0)
    env.shuffle = False
    shown = {env.records[i].image.split("/")[-1]: env._prepare(i)[0] for i in range(2)}  # [H, W, 3] each
    assert (shown["clear.png"] == 255).all()  # white, as transformers composites it; red before
    assert (shown["deep.png"] == 128).all()  # mid-grey; white (clipped) before


def test_a_long_question_or_answer_is_refused_naming_the_limit_and_the_row(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    good = {"image": "a.png", "question": "Q?", "answer": "a"}
    long_text = "x" * (records.MAX_TEXT_CHARS + 1)
    for field, value in (("question", long_text), ("answer", long_text), ("answer", ["x" * 60_000] * 2)):
        path = write_jsonl(tmp_path / "data.jsonl", [good, {**good, field: value}])
        with pytest.raises(InputError, match=rf"data.jsonl line 2: field '{field}' holds \d+ characters, over "
                           rf"MAX_TEXT_CHARS = {records.MAX_TEXT_CHARS}$"):  # fmt: skip
            DatasetEnv(num_envs=1, path=path)


def test_a_line_over_the_bound_is_refused_unread_and_skipped_in_lenient_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "MAX_LINE_BYTES", 200)  # the bound is 16 MiB; the reading is the same at 200
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    good = json.dumps({"image": "a.png", "question": "Q?", "answer": "a"})
    long_line = json.dumps({"image": "a.png", "question": "Q" * 3000, "answer": "a"})
    path = write_jsonl(tmp_path / "data.jsonl", [good, long_line, good])
    with pytest.raises(InputError, match=r"data.jsonl line 2: longer than MAX_LINE_BYTES = 200 bytes"):
        DatasetEnv(num_envs=1, path=path)
    env = DatasetEnv(num_envs=1, path=path, eval_fraction=0.0, bad_records="skip")
    assert [r.where for r in env.records] == ["data.jsonl line 1", "data.jsonl line 3"]  # line numbers still right
    edge = json.dumps({"image": "a.png", "question": "Q", "answer": "a"})
    edge = edge.replace('"Q"', '"' + "Q" * (200 - len(edge) + 1) + '"')
    assert len(edge) == 200
    edge_path = write_jsonl(tmp_path / "e.jsonl", [edge])
    assert len(DatasetEnv(num_envs=1, path=edge_path, eval_fraction=0.0).records) == 1
