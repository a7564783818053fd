"""SVG: the input checks and the cairosvg renderer that run inside the sandbox's render child.

Imports only the standard library at the top (the sandbox worker loads this file by path, without the `rewards`
package); cairosvg is imported in `warm_up` and `render`.

What is refused, and why (each as `RenderRefused` with the reason, so the render is `image=None`):

* more than `max_bytes` bytes, or gzip-compressed input (a decompression bomb would dodge the size cap);
* any ENTITY declaration, and any reference to an entity that is not one of XML's five: so no entity expansion
  (billion laughs) and no external entity (XXE). This is decided by parsing (expat's declaration handlers), not by
  matching text: a DOCTYPE without entities is accepted, the plain `<!DOCTYPE svg>` and the public SVG 1.1 one
  (`PUBLIC "-//W3C//DTD SVG 1.1//EN" "http://www.w3.org/.../svg11.dtd"`, which matplotlib and many editors write)
  included, because its external subset is never read (expat's parameter-entity parsing is off here, and
  cairosvg parses with defusedxml, external references forbidden). Also `<?xml-stylesheet ...?>` (an external
  style sheet);
* malformed XML, a root element other than `svg`, more than `max_elements` elements, nesting deeper than
  `max_depth`, a root `width`/`height` above `max_dimension` user units or not finite (the canvas; the viewBox is
  only its coordinate system, refused only when not finite);
* any reference other than a same-document `#fragment`: `href`/`xlink:href` values and `url(...)` in attributes and
  `<style>` text, `@import`. The one exception is an inline raster image, `<image href="data:image/png;base64,...">`
  (or `image/jpeg`): it is self-contained, and image-to-SVG outputs sometimes embed one. An inline SVG (or anything
  not PNG/JPEG by its magic bytes) is refused, since it would bypass these checks. So `file:`, `http(s):`, relative
  paths, `data:image/svg+xml`, `data:text/css` all give `image=None`, not an image with the reference left out: a
  policy that writes external references scores zero, which is what it should learn.

Renders are composited on a white background (transparent SVG areas come out white) at exactly the requested size
(cairosvg scales the SVG's viewport to it, honouring `preserveAspectRatio`).
"""

from __future__ import annotations

import base64
import math
import re
import sys
import xml.parsers.expat as expat
from typing import Any

OPTIONS: dict[str, Any] = {
    "max_bytes": 1_000_000,
    "max_elements": 20_000,
    "max_depth": 64,
    "max_dimension": 20_000.0,
}
"""Defaults of the per-render options (see the module docstring)."""

RENDERS_PER_CHILD = 64
"""Renders one confined child may serve before a fresh one replaces it (see `rewards.render.sandbox`). SVG is data,
not code: nothing in it runs, so a warm child can rasterise many files without the 4-10 ms of a fresh fork,
confinement and copy-on-write faults per file; the input checks above apply to each file, the wall-clock timeout
to each render. Retiring the child now and then bounds what a renderer bug could carry from one file to the next."""

_URL = re.compile(r"url\(\s*(['\"]?)(.*?)\1\s*\)", re.IGNORECASE | re.DOTALL)
_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")
_DATA_IMAGE = re.compile(r"^data:image/(png|jpe?g)(?:;[^,;]*)*;base64,", re.IGNORECASE)
_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")
_ENCODING = re.compile(rb"<\?xml[^>]*encoding\s*=\s*['\"]([^'\"]*)['\"]", re.IGNORECASE)


class RenderRefused(ValueError):
    """The input was refused by a check; the message is the reason reported to the caller."""


def check_svg(source: str | bytes, options: dict[str, Any] | None = None) -> bytes:
    """Checks an SVG against the limits in the module docstring.

    Args:
        source: the SVG text.
        options: overrides of `OPTIONS`.

    Returns:
        The SVG as UTF-8 bytes.

    Raises:
        RenderRefused: with the reason, if a check fails.
    """
    opts = {**OPTIONS, **(options or {})}
    data = source.encode("utf-8", "surrogatepass") if isinstance(source, str) else bytes(source)
    if len(data) > opts["max_bytes"]:
        raise RenderRefused(f"svg refused: {len(data)} bytes, more than {opts['max_bytes']}")
    if data[:2] == b"\x1f\x8b":
        raise RenderRefused("svg refused: compressed (svgz) input is not accepted")
    # Only UTF-8 (or its ASCII subset) is parsed, so what the checks read is what cairosvg reads.
    declared = _ENCODING.search(data[:200])
    if b"\x00" in data or (declared is not None and declared.group(1).lower() not in (b"utf-8", b"utf8", b"us-ascii")):
        raise RenderRefused("svg refused: only UTF-8 input is accepted")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise RenderRefused("svg refused: only UTF-8 input is accepted") from None
    counter = _Checker(opts)
    parser = expat.ParserCreate(namespace_separator="}")  # names come as "namespace}local", as ElementTree's
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)  # never read an external DTD subset
    parser.StartElementHandler = counter.start
    parser.EndElementHandler = counter.end
    parser.CharacterDataHandler = counter.data
    parser.EntityDeclHandler = _refuse_entity
    parser.UnparsedEntityDeclHandler = lambda name, *rest: _refuse_entity(name)
    parser.ExternalEntityRefHandler = lambda context, base, system_id, public_id: _refuse_entity(system_id)
    parser.SkippedEntityHandler = _refuse_undeclared
    parser.ProcessingInstructionHandler = _check_instruction
    try:
        parser.Parse(data, True)
    except RenderRefused:
        raise
    except expat.ExpatError as e:
        raise RenderRefused(f"svg refused: not well-formed XML ({e})") from None
    if counter.root is None:
        raise RenderRefused("svg refused: no root element")
    return data


class _Checker:
    """An XMLParser target that counts, measures depth and vets references while expat parses (no tree is built)."""

    def __init__(self, opts: dict[str, Any]):
        self.opts = opts
        self.depth = 0
        self.elements = 0
        self.root: str | None = None
        self.in_style = 0

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        name = _local(tag)
        self.elements += 1
        self.depth += 1
        if self.elements > self.opts["max_elements"]:
            raise RenderRefused(f"svg refused: more than {self.opts['max_elements']} elements")
        if self.depth > self.opts["max_depth"]:
            raise RenderRefused(f"svg refused: elements nested deeper than {self.opts['max_depth']}")
        if self.root is None:
            if name != "svg":
                raise RenderRefused(f"svg refused: root element is <{name}>, not <svg>")
            self.root = name
            self._check_dimensions(attrib)
        if name == "style":
            self.in_style += 1
        for key, value in attrib.items():
            if _local(key) == "href":
                _check_href(value, image=name == "image")
            elif "url(" in value.lower():
                _check_css(value)

    def end(self, tag: str) -> None:
        self.depth -= 1
        if _local(tag) == "style":
            self.in_style -= 1

    def data(self, text: str) -> None:
        if self.in_style:
            _check_css(text)

    def close(self) -> None:
        return None

    def _check_dimensions(self, attrib: dict[str, str]) -> None:
        # The canvas is the root's width and height (the render is scaled to the requested size); the viewBox is only
        # the coordinate system drawn into it, so any finite viewBox is fine (maps and plots in data units have
        # viewBoxes of 10^5-10^6 units). A non-finite one is refused: it would make the scaling to the canvas NaN.
        limit = self.opts["max_dimension"]
        view_box = attrib.get("viewBox")
        if view_box is not None:
            for key, text in zip(("x", "y", "width", "height"), re.split(r"[\s,]+", view_box.strip()), strict=False):
                value = _number(text)
                if value is not None and not math.isfinite(value):
                    raise RenderRefused(f"svg refused: viewBox {key} {text!r} is not finite")
        for key in ("width", "height"):
            text = attrib.get(key)
            if text is None or text.strip().endswith("%"):
                continue
            value = _number(text)
            if value is not None and (not math.isfinite(value) or abs(value) > limit):
                raise RenderRefused(f"svg refused: {key} {text.strip()!r} is larger than {limit:g}")


def _number(text: str) -> float | None:
    """The number a length starts with, as cairosvg reads it (units ignored); None where it reads none (0 / auto)."""
    match = _NUMBER.match(text)
    try:  # "inf" and "nan" are not numbers to the pattern, but float() (and so cairosvg) takes them
        return float(match.group(1) if match is not None else text)
    except ValueError:
        return None


def _refuse_entity(name: str | None, *rest: Any) -> None:
    raise RenderRefused(
        f"svg refused: ENTITY declarations and external entities in the DOCTYPE are not allowed ({name!r})"
    )


def _refuse_undeclared(name: str, is_parameter_entity: bool) -> None:
    raise RenderRefused(f"svg refused: reference to the undeclared entity {name!r}")


def _check_instruction(target: str, data: str) -> None:
    if target.strip().lower() == "xml-stylesheet":
        raise RenderRefused("svg refused: external style sheets (xml-stylesheet) are not allowed")


def _local(name: str) -> str:
    return name.rsplit("}", 1)[-1]


def _check_href(value: str, *, image: bool) -> None:
    ref = value.strip()
    if ref.startswith("#"):
        return
    if image and _DATA_IMAGE.match(ref):
        return
    raise RenderRefused(f"svg refused: external reference {_quote(ref)}")


def _check_css(text: str) -> None:
    if "@import" in text.lower():
        raise RenderRefused("svg refused: @import in a style sheet")
    for match in _URL.finditer(text):
        ref = match.group(2).strip()
        if not ref.startswith("#"):
            raise RenderRefused(f"svg refused: external reference {_quote(ref)}")


def _quote(ref: str) -> str:
    return repr(ref if len(ref) <= 60 else ref[:57] + "...")


def _fetch(url: str, resource_type: str) -> bytes:
    """cairosvg's url_fetcher: only the inline PNG/JPEG images `check_svg` let through; everything else refused."""
    match = _DATA_IMAGE.match(url)
    if match is None:
        raise RenderRefused(f"svg refused: external reference {_quote(url)}")
    try:
        data = base64.b64decode(url[match.end() :], validate=False)
    except ValueError:
        raise RenderRefused("svg refused: inline image is not valid base64") from None
    if not data.startswith(_MAGIC) or (not data.startswith(_MAGIC[0]) and b"<svg" in data):
        raise RenderRefused("svg refused: inline image is not a PNG or JPEG")
    return data


def read_roots() -> list[str]:
    """Directories the render child must be able to read besides the Python installation (fonts)."""
    import os

    home = os.environ.get("HOME", "")
    cache = os.environ.get("XDG_CACHE_HOME") or (os.path.join(home, ".cache") if home else "")
    roots = [os.path.join(cache, "fontconfig") if cache else "", os.path.join(home, ".fonts") if home else ""]
    return [root for root in roots if root]


def warm_up() -> None:
    """Imports cairosvg and renders text and a gradient once (loads cairo, fontconfig and their caches)."""
    sample = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="32" height="32"><defs><linearGradient id="g">'
        '<stop offset="0" stop-color="red"/><stop offset="1" stop-color="blue"/></linearGradient></defs>'
        '<rect width="32" height="32" fill="url(#g)" opacity="0.5"/><text x="2" y="20" font-size="10">Ab</text></svg>'
    )
    render(sample, 16, 16, {})


def render(source: str, width: int, height: int, options: dict[str, Any]) -> bytes:
    """Checks and renders one SVG.

    Args:
        source: the SVG text.
        width: output width in pixels.
        height: output height in pixels.
        options: overrides of `OPTIONS`.

    Returns:
        `height * width * 3` bytes, RGB, row-major.
    """
    data = check_svg(source, options)
    from cairosvg.parser import Tree
    from cairosvg.surface import PNGSurface

    try:
        tree = Tree(bytestring=data, unsafe=False, url_fetcher=_fetch)
        surface = PNGSurface(tree, None, 96, output_width=width, output_height=height, background_color="white")
    except RenderRefused:
        raise
    except (ValueError, TypeError, KeyError, IndexError, ZeroDivisionError, AttributeError, OverflowError) as e:
        raise RenderRefused(f"svg could not be rendered: {type(e).__name__}: {e}") from None
    image = surface.cairo
    image.flush()
    if (image.get_width(), image.get_height()) != (width, height):
        raise RenderRefused(f"svg rendered at {image.get_width()}x{image.get_height()}, not {width}x{height}")
    stride = image.get_stride()
    bgra = bytes(image.get_data())
    if stride != width * 4:
        bgra = b"".join(bgra[row * stride : row * stride + width * 4] for row in range(height))
    # Cairo's ARGB32 is premultiplied, in native (little-endian: B, G, R, A) byte order; the opaque white background
    # makes every alpha 255, so the colour bytes are the plain colour.
    red, green, blue = (2, 1, 0) if sys.byteorder == "little" else (1, 2, 3)
    rgb = bytearray(width * height * 3)
    rgb[0::3] = bgra[red::4]
    rgb[1::3] = bgra[green::4]
    rgb[2::3] = bgra[blue::4]
    return bytes(rgb)
