"""A user's image file as an image viewer and transformers' processors show it: upright, opaque, 8 bits a channel.

PIL's `Image.convert("RGB")` alone differs from what a person looking at the file sees in three ways, each of which
changes what a policy is shown or where a box lands:

* **EXIF orientation.** Cameras store the sensor's pixels and an orientation tag (1-8); viewers, and transformers'
  `load_image` (`ImageOps.exif_transpose`), turn the image upright. A box drawn on the photo as a viewer shows it is
  in that upright frame, so the size a dataset checks boxes against is the upright size (`viewed_size`: width and
  height swapped for the orientations 5-8, read from the header without decoding the pixels).
* **Transparency.** Pixels under alpha 0 keep whatever colour the encoder left there. transformers' `convert_to_rgb`
  composites an image with an alpha band or a `transparency` entry on white (`Image.alpha_composite` over an opaque
  white RGBA), as viewers show it on a white page; so does `viewed_rgb` (RGBA, LA, PA, palette or grey with a
  transparent colour).
* **16-bit greyscale.** PIL opens a 16-bit PNG as mode `I;16` (or `I`) and `convert` clips its 0-65535 values to
  255, so mid-grey 32768 shows as white. `viewed_rgb` scales them to 0-255 (`v * 255 / 65535`, rounded).

Palette, bilevel, CMYK and YCbCr images go through PIL's own `convert`. Float images (`F`) are clipped to 0-255 as
PIL does (their range is not stated in the file).
"""

from __future__ import annotations

import struct

import numpy as np
from PIL import Image, PngImagePlugin

ORIENTATION_TAG = 0x0112  # EXIF "Orientation"
# The transpose that turns an image stored with each orientation upright, as `ImageOps.exif_transpose` does.
_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation (1-8) of an opened image, read without decoding its pixels; 1 if none or unreadable.

    Call it before the pixels are loaded: a PNG whose `eXIf` chunk follows the pixel data (PIL reads that chunk only
    when it decodes) is found by walking the file's chunk headers, so the upright size read from the header and the
    decoded image agree. An orientation that cannot be read (a damaged EXIF block) counts as 1, for both.
    """
    try:
        if isinstance(image, PngImagePlugin.PngImageFile) and "exif" not in image.info:
            late = _png_late_exif(image)
            if late is not None:
                image.info["exif"] = late
        # The base class's reader: PNG's own loads the pixels when the header held no EXIF.
        value = Image.Image.getexif(image).get(ORIENTATION_TAG, 1)
    except Exception:  # a damaged EXIF block: PIL's parsers raise many kinds; a viewer shows the image as stored
        return 1
    return value if isinstance(value, int) and value in range(1, 9) else 1


def _png_late_exif(image: Image.Image) -> bytes | None:
    """The bytes of an `eXIf` chunk that follows a PNG's pixel data, found by seeking from chunk header to header."""
    fp = getattr(image, "fp", None)
    try:
        position = fp.tell()  # None, or closed after loading: nothing to walk (a loaded image has read the chunk)
    except (AttributeError, OSError, ValueError):
        return None
    try:
        fp.seek(8)  # past the PNG signature
        while True:
            header = fp.read(8)
            if len(header) < 8:
                return None
            length, kind = struct.unpack(">I4s", header)
            if kind == b"eXIf":
                data = fp.read(length)
                return data if len(data) == length else None
            if kind == b"IEND":
                return None
            fp.seek(length + 4, 1)  # the chunk's data and its checksum
    finally:
        fp.seek(position)


def viewed_size(image: Image.Image) -> tuple[int, int]:
    """(W, H) of an opened image as a viewer shows it: its stored size, swapped for the EXIF orientations 5-8."""
    width, height = image.size
    return (height, width) if exif_orientation(image) >= 5 else (width, height)


def viewed_rgb(image: Image.Image) -> Image.Image:
    """An RGB copy of `image` as a viewer shows it (see the module docstring): upright, composited on white, 8-bit.

    Args:
        image: an image as `Image.open` returns it (pixels not yet loaded, so a late PNG `eXIf` chunk is found), or
            any PIL image.

    Returns:
        A new mode-`RGB` image of `viewed_size(image)`.
    """
    orientation = exif_orientation(image)
    image.load()
    transparent = image.info.get("transparency")
    if image.mode in _SIXTEEN_BIT:
        values = np.asarray(image).astype(np.int64).clip(0, 65535)  # [H, W]
        grey = Image.fromarray(((values * 255 + 32767) // 65535).astype(np.uint8), mode="L")
        if isinstance(transparent, int):
            alpha = Image.fromarray(np.where(values == transparent, 0, 255).astype(np.uint8), mode="L")
            grey = Image.merge("LA", (grey, alpha))
        image = grey
    bands = image.getbands()
    if "A" in bands or "a" in bands or transparent is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        rgb = Image.alpha_composite(white, rgba).convert("RGB")
    else:
        rgb = image.convert("RGB")
    if orientation in _UPRIGHT:
        rgb = rgb.transpose(_UPRIGHT[orientation])
    return rgb
