"""The dataset env showing each record's image at its own size (`resize="native"`), bounded as Qwen-VL bounds it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from PIL import Image

import sim.tasks.dataset  # noqa: F401  (registers `dataset`)
from sim import check_vec_env, make
from sim.errors import InputError
from sim.tasks.records import fit_pixels

RED = (200, 0, 0)


def write_png(path: Path, size: tuple[int, int], box: list[int] | None = None) -> None:
    """A light grey image of `size` (W, H) with a red rectangle filling `box` (x2/y2 exclusive)."""
    image = Image.new("RGB", size, (230, 230, 230))
    if box is not None:
        image.paste(RED, tuple(box))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


@pytest.fixture()
def two_sizes(tmp_path) -> Path:
    """A 300x200 record with a box and a 40x40 record with a point."""
    write_png(tmp_path / "img" / "wide.png", (300, 200), [30, 20, 150, 100])
    write_png(tmp_path / "img" / "small.png", (40, 40))
    records = [
        {"image": "img/wide.png", "question": "Find the red box.", "box": [30, 20, 150, 100]},
        {"image": "img/small.png", "question": "Point at the middle.", "point": [20, 10]},
    ]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def native(path: Path, **options):
    return make("dataset", num_envs=2, path=path, split="all", shuffle=False, resize="native", **options)


def test_fit_pixels_by_hand():
    # 300x200 on a 28 grid: 300/28 = 10.7 -> 11 cells, 200/28 = 7.1 -> 7 cells; area 60368 within the bounds.
    assert fit_pixels(300, 200, 28, 56 * 56, 28 * 28 * 1280) == (308, 196)
    assert fit_pixels(300, 200, 20, 56 * 56, 28 * 28 * 1280) == (300, 200)  # on the grid already: unchanged
    # 1000x500 above 100_000 px: beta = sqrt(500_000 / 100_000); floor(1000 / beta / 28) = 15, floor(500 / ...) = 7.
    assert fit_pixels(1000, 500, 28, 56 * 56, 100_000) == (420, 196)
    # 30x20 below 56*56: beta = sqrt(3136 / 600); ceil(30 * beta / 28) = 3, ceil(20 * beta / 28) = 2.
    assert fit_pixels(30, 20, 28, 56 * 56, 100_000) == (84, 56)
    with pytest.raises(InputError, match="aspect ratio"):
        fit_pixels(4020, 20, 28, 56 * 56, 10**7)


def test_fit_pixels_equals_transformers_smart_resize():
    resize = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl").smart_resize
    for width, height in ((300, 200), (1000, 500), (30, 20), (57, 611), (1920, 1080), (28, 28)):
        for factor, low, high in ((28, 56 * 56, 28 * 28 * 1280), (32, 64 * 64, 200_000), (28, 100_000, 400_000)):
            want_h, want_w = resize(height, width, factor=factor, min_pixels=low, max_pixels=high)
            assert fit_pixels(width, height, factor, low, high) == (want_w, want_h), (width, height, factor)


def test_a_300x200_record_stays_3_to_2_and_its_box_follows(two_sizes):
    env = native(two_sizes, factor=20, min_pixels=1000)
    obs = env.reset(seed=[0, 1])
    assert obs.sizes.tolist() == [[200, 300], [40, 40]]  # (H, W): both on the 20 grid and within the bounds
    assert obs.image.shape == (2, 200, 300, 3)  # one canvas holding the largest
    wide, small = (row[0] for row in obs.view_images())
    assert wide.shape == (200, 300, 3) and small.shape == (40, 40, 3)
    assert obs.image[1, 40:].eq(0).all() and obs.image[1, :, 40:].eq(0).all()  # the rest of its canvas is padding
    red = (wide[..., 0] == RED[0]) & (wide[..., 1] == 0)  # kept pixel for pixel: no resize happened
    ys, xs = red.nonzero(as_tuple=True)
    assert (xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1) == (30, 20, 150, 100)
    torch.testing.assert_close(env.target_boxes[0], torch.tensor([30.0, 20.0, 150.0, 100.0]))
    # The point's square: half-side point_tolerance (0.05) x the shown image's longer side (40) = 2 px.
    torch.testing.assert_close(env.target_boxes[1], torch.tensor([18.0, 8.0, 22.0, 12.0]))
    assert obs.instruction[0].endswith("in pixels of the 300x200 image.")
    assert obs.instruction[1].endswith("in pixels of the 40x40 image.")
    assert env.step(env.expert_action()).reward.tolist() == [1.0, 1.0]


def test_the_box_follows_a_resize_onto_the_grid(two_sizes):
    env = native(two_sizes)  # factor 28: 300x200 -> 308x196, 40x40 -> 56x56 (min_pixels 56*56)
    obs = env.reset(seed=[0, 1])
    assert obs.sizes.tolist() == [[196, 308], [56, 56]]
    width, height = obs.sizes[0, 1].item(), obs.sizes[0, 0].item()
    assert abs(width / height - 1.5) < 28 / height  # 3:2 within one grid cell
    sx, sy = 308 / 300, 196 / 200
    want = torch.tensor([30 * sx, 20 * sy, 150 * sx, 100 * sy])
    torch.testing.assert_close(env.target_boxes[0], want)
    wide = obs.view_images()[0][0]
    red = (wide[..., 0] > 150) & (wide[..., 1] < 60)  # the resized red box (bilinear edges blend)
    ys, xs = red.nonzero(as_tuple=True)
    got = torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=torch.float32)
    assert (got - want).abs().max() <= 1.0  # the drawn box and the target agree to a pixel
    torch.testing.assert_close(env.target_boxes[1], torch.tensor([28 - 2.8, 14 - 2.8, 28 + 2.8, 14 + 2.8]))


def test_pixel_bounds_hold(tmp_path):
    sizes = [(1000, 500), (30, 20), (500, 1000), (64, 48)]
    for k, size in enumerate(sizes):
        write_png(tmp_path / f"{k}.png", size)
    path = tmp_path / "data.jsonl"
    path.write_text(
        "".join(json.dumps({"image": f"{k}.png", "question": "?", "answer": "a"}) + "\n" for k in range(4))
    )
    low, high, factor = 4_000, 60_000, 28
    env = make("dataset", num_envs=4, path=path, split="all", shuffle=False, resize="native",
               min_pixels=low, max_pixels=high, factor=factor)  # fmt: skip
    obs = env.reset(seed=[0, 1, 2, 3])
    for (h, w), (width, height) in zip(obs.sizes.tolist(), sizes):
        assert low <= h * w <= high and h % factor == 0 and w % factor == 0
        assert abs(w / h - width / height) <= factor * (w + h) / (h * h)  # aspect kept to the grid's rounding
    assert obs.image.shape[1:3] == (obs.sizes[:, 0].max(), obs.sizes[:, 1].max())


def test_contract_with_native_sizes_on_the_sample_dataset():
    env = make("dataset", num_envs=3, resize="native")  # assets/datasets/shapes_qa: 64x64, 64x48, 48x64, 56x56
    check_vec_env(env, seed=0)
    env.reset(seed=0)
    check_vec_env(env, seed=0, actions=env.expert_action())


def test_select_keeps_the_sizes_and_letterbox_stays_the_default(two_sizes):
    obs = native(two_sizes, factor=20, min_pixels=1000).reset(seed=[0, 1])
    part = obs.select([1])
    assert part.sizes.tolist() == [[40, 40]] and part.view_images()[0][0].shape == (40, 40, 3)
    boxed = make("dataset", num_envs=2, path=two_sizes, split="all", shuffle=False).reset(seed=[0, 1])
    assert boxed.sizes is None and boxed.image.shape == (2, 64, 64, 3)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"resize": "square"}, "option 'resize' .*'letterbox', 'native'"),
        ({"resize": "native", "min_pixels": 0}, "min_pixels must be"),
        ({"resize": "native", "min_pixels": 9000, "max_pixels": 8000}, "min_pixels .9000. must be <= max_pixels"),
        ({"resize": "native", "max_pixels": 100, "min_pixels": 10}, "max_pixels .100. must hold one"),
        ({"resize": "native", "factor": 2.5}, "option 'factor'.*integer"),
    ],
)
def test_bad_options_are_named(two_sizes, options, message):
    with pytest.raises(InputError, match=message):
        make("dataset", num_envs=1, path=two_sizes, **options)


def test_native_refuses_the_re_ask():
    with pytest.raises(InputError, match="resize='letterbox'"):
        make("dataset", num_envs=1, path=sim.tasks.dataset.REPO / "assets/datasets/shapes_mc", resize="native",
             reward="multiple_choice", consistency="measure")  # fmt: skip


def test_embedded_images_are_sized_from_their_headers(tmp_path):
    datasets = pytest.importorskip("datasets")
    images = [Image.new("RGB", (300, 200), (10, 20, 30)), Image.new("RGB", (60, 90), (1, 2, 3))]
    data = datasets.Dataset.from_dict({"image": images, "question": ["a?", "b?"], "answer": ["x", "y"]})
    data = data.cast_column("image", datasets.Image())
    data.save_to_disk(str(tmp_path / "hf"))
    env = make("dataset", num_envs=2, path=tmp_path / "hf", split="all", shuffle=False, resize="native", factor=10)
    obs = env.reset(seed=[0, 1])
    assert obs.sizes.tolist() == [[200, 300], [90, 60]]
    assert math.isnan(env.target_boxes[0, 0])
