"""User image files converted as a viewer and transformers show them: EXIF orientation, alpha on white, 16-bit scaled.

Every image is built here with PIL; what each should look like is stated by hand, and where transformers has its
own conversion (`load_image`: `exif_transpose` + `convert_to_rgb`'s composite on white) the result is compared with it.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rewards.image_files import ORIENTATION_TAG, exif_orientation, viewed_rgb, viewed_size

RED, WHITE = (255, 0, 0), (255, 255, 255)


def upright_photo() -> Image.Image:
    """A 20x40 (W x H) portrait, grey with a red block at x 2-12, y 24-36: the photo as a viewer shows it."""
    photo = Image.new("RGB", (20, 40), (128, 128, 128))
    photo.paste(RED, (2, 24, 12, 36))
    return photo


def save_rotated(photo: Image.Image, path: Path, fmt: str) -> None:
    """`photo` stored as a camera held sideways stores it: the sensor's 40x20 pixels with EXIF orientation 6."""
    exif = Image.Exif()
    exif[ORIENTATION_TAG] = 6  # "rotate 90 degrees clockwise to view"
    photo.transpose(Image.Transpose.ROTATE_90).save(
        path, fmt, exif=exif, **({"quality": 100} if fmt == "JPEG" else {})
    )


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_an_exif_rotated_photo_is_upright_and_sized_upright_from_its_header(tmp_path, fmt):
    path = tmp_path / f"photo.{fmt.lower()}"
    save_rotated(upright_photo(), path, fmt)
    with Image.open(path) as image:
        assert image.size == (40, 20)  # as stored
        assert viewed_size(image) == (20, 40)
        assert image._im is None  # the size came from the header: nothing decoded
        shown = np.asarray(viewed_rgb(image)).astype(int)  # [H, W, 3]
    assert shown.shape == (40, 20, 3)
    assert np.abs(shown[26:34, 4:10] - RED).max() < 40  # the red block where it was drawn (JPEG: lossy)
    assert np.abs(shown[2:20, 2:18] - 128).max() < 40


def test_orientation_matches_transformers_load_image_for_every_value(tmp_path):
    load_image = pytest.importorskip("transformers.image_utils").load_image
    rng = np.random.default_rng(0)
    stored = Image.fromarray(rng.integers(0, 256, (6, 10, 3), dtype=np.uint8))  # H 6, W 10: every transpose differs
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[ORIENTATION_TAG] = orientation
        path = tmp_path / f"o{orientation}.png"
        stored.save(path, exif=exif)
        with Image.open(path) as image:
            size = viewed_size(image)
            ours = viewed_rgb(image)
        theirs = load_image(str(path))
        assert ours.size == theirs.size == size, orientation
        assert np.array_equal(np.asarray(ours), np.asarray(theirs)), orientation


def test_a_png_exif_chunk_after_the_pixels_is_found_before_decoding():
    """PIL reads an eXIf chunk that follows IDAT only when it decodes; the header size must agree with the pixels."""
    exif = Image.Exif()
    exif[ORIENTATION_TAG] = 8
    buffer = io.BytesIO()
    Image.new("RGB", (30, 10), RED).save(buffer, "PNG", exif=exif)
    data, chunks, pos = buffer.getvalue(), [], 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        chunks.append(data[pos : pos + 12 + length])
        pos += 12 + length
    exif_chunk = next(c for c in chunks if c[4:8] == b"eXIf")
    chunks.remove(exif_chunk)
    chunks.insert(-1, exif_chunk)  # just before IEND
    late = data[:8] + b"".join(chunks)
    with Image.open(io.BytesIO(late)) as image:
        assert "exif" not in image.info  # PIL has not seen it
        assert exif_orientation(image) == 8 and viewed_size(image) == (10, 30)
        assert viewed_rgb(image).size == (10, 30)


def test_hidden_colour_under_alpha_zero_shows_white_as_transformers_composites_it():
    convert_to_rgb = pytest.importorskip("transformers.image_transforms").convert_to_rgb
    pixels = np.zeros((4, 4, 4), dtype=np.uint8)
    pixels[..., 0] = 255  # red everywhere ...
    pixels[:, 2:, 3] = 255  # ... but opaque only in the right half
    pixels[0, 0, 3] = 128  # one pixel half transparent: red over white
    image = Image.fromarray(pixels, mode="RGBA")
    shown = np.asarray(viewed_rgb(image))
    assert (shown[1:, :2] == WHITE).all() and (shown[:, 2:] == RED).all()
    assert tuple(shown[0, 0]) == (255, 127, 127)
    assert np.array_equal(shown, convert_to_rgb(image, return_numpy=True))
    assert tuple(np.asarray(image.convert("RGB"))[1, 0]) == RED  # what plain convert shows: the hidden colour


@pytest.mark.parametrize("mode", ["LA", "PA"])
def test_other_alpha_modes_and_a_transparent_palette_entry_composite_on_white(mode):
    image = Image.new("RGBA", (2, 1), (0, 0, 0, 0)).convert(mode)
    assert (np.asarray(viewed_rgb(image)) == WHITE).all()
    palette = Image.new("P", (2, 1), 0)
    palette.putpalette([0, 0, 255] * 2)
    palette.info["transparency"] = 0
    assert (np.asarray(viewed_rgb(palette)) == WHITE).all()
    assert (np.asarray(palette.convert("RGB")) == (0, 0, 255)).all()


def test_sixteen_bit_greys_are_scaled_not_clipped(tmp_path):
    values = np.array([[0, 257, 32768, 65535]], dtype=np.uint16)  # black, 1/255, mid-grey, white
    path = tmp_path / "deep.png"
    Image.fromarray(values).save(path)
    with Image.open(path) as image:
        assert image.mode.startswith("I")
        assert np.asarray(image.convert("RGB"))[0, 2, 0] == 255  # PIL alone: mid-grey clipped to white
        shown = np.asarray(viewed_rgb(image))
    assert shown[0, :, 0].tolist() == [0, 1, 128, 255] and (shown == shown[..., :1]).all()
    wide = Image.fromarray(values.astype(np.int32), mode="I")  # 16-bit PNGs open as mode I in older PIL
    assert np.asarray(viewed_rgb(wide))[0, :, 0].tolist() == [0, 1, 128, 255]


def test_cmyk_and_bilevel_convert(tmp_path):
    cmyk = Image.new("CMYK", (2, 2), (0, 255, 255, 0))  # no cyan, full magenta and yellow: red
    path = tmp_path / "print.jpg"
    cmyk.save(path, quality=100)
    with Image.open(path) as image:
        assert image.mode == "CMYK"
        shown = np.asarray(viewed_rgb(image)).astype(int)
    assert np.abs(shown - RED).max() < 8
    assert (np.asarray(viewed_rgb(Image.new("1", (2, 2), 1))) == WHITE).all()


def test_a_damaged_exif_block_shows_the_image_as_stored(tmp_path):
    path = tmp_path / "odd.jpg"
    Image.new("RGB", (6, 4), RED).save(path, exif=b"Exif\x00\x00MM\x00*\xff\xff\xff\xff")
    with Image.open(path) as image:
        assert exif_orientation(image) == 1 and viewed_size(image) == (6, 4)
        assert viewed_rgb(image).size == (6, 4)


def test_mmrl_score_reads_image_files_as_a_viewer_does(tmp_path):
    """`mmrl score`'s image reader: the rotated photo upright, hidden colour white, 16-bit grey mid-grey."""
    from rewards.score_inputs import load_image

    save_rotated(upright_photo(), tmp_path / "photo.png", "PNG")
    photo = load_image(tmp_path / "photo.png", (20, 40))  # [H, W, 3]
    assert photo.shape == (40, 20, 3) and photo[30, 5].tolist() == list(RED) and photo[5, 5].tolist() == [128] * 3
    hidden = np.zeros((4, 4, 4), dtype=np.uint8)
    hidden[..., 0] = 255
    Image.fromarray(hidden, mode="RGBA").save(tmp_path / "clear.png")
    assert (load_image(tmp_path / "clear.png", (4, 4)) == 255).all()
    Image.fromarray(np.full((4, 4), 32768, dtype=np.uint16)).save(tmp_path / "deep.png")
    assert (load_image(tmp_path / "deep.png", (4, 4)) == 128).all()
