"""CAD: runs a build123d script inside the sandbox's render child and draws the part it builds, shaded.

Imports only the standard library at the top (the sandbox worker loads this file by path); build123d (seconds to
import), OCP and numpy are imported in `warm_up`, which the worker runs once, so a render pays only for building the
part (tens of milliseconds for a simple one) and drawing it.

Which object is the result
--------------------------
The script is plain Python that imports build123d (`from build123d import *`) and needs no file path. After it ran:

1. a variable named `result`, else one named `part`, is the result: a build123d `Shape` (`Part`, `Solid`,
   `Compound`, ...), a `BuildPart` context (its `.part` is taken), or a list/tuple of shapes (drawn together). If
   that variable holds anything else, the render fails with a reason (it does not fall back to rule 2);
2. otherwise, the last variable (by first assignment) that holds a shape or a `BuildPart` with at least one solid.

The result must contain a solid and have a non-zero, finite size; otherwise the render fails with a reason, as it
does for a script that raises or builds nothing. 2-D results (sketches, faces, wires) are not drawn. A shape that
OCCT's checker calls invalid (`Shape.is_valid` False: an open shell, a self-intersecting face, a tolerance
mismatch after a boolean or a fillet, common in scripts from public collections) is drawn as it tessellates, like
build123d's and CadQuery's own exporters do: the picture is what the reward compares, and refusing it would score
a nearly right part as nothing.

How it is drawn
---------------
The result is tessellated in memory (OCCT's mesher, linear deflection `tolerance` times the bounding-box diagonal,
angular deflection `angular_tolerance` radians) and drawn by a small numpy z-buffer rasteriser: orthographic
projection, back faces culled, flat Lambert shading from a light fixed to the camera (above, left, behind the
viewer), `supersample` x `supersample` samples per pixel averaged. A z-buffer rather than painter's ordering
(what matplotlib's `Poly3DCollection` does) because CAD meshes have large planar triangles, whose centroid order
often hides a feature in front of a big face. Same script, same options: same bytes.

Views (`views`: one name or a list, tiled left to right, top to bottom on a grid of `ceil(sqrt(n))` columns that
fills the requested size; each view is centred in its cell), with +Z up unless said otherwise:

* `front` looks along +Y (X right), `back` along -Y, `right` along -X (Y right), `left` along +X;
* `top` looks down -Z (X right, Y up), `bottom` up +Z (X right, Y down);
* `iso` looks from the (+X, -Y, +Z) corner towards the part (the default).

Scale: with `normalize=True` (default) every view is centred on the bounding-box centre and the box's diagonal spans
`fill` of the cell's shorter side, so a part and a scaled copy give the same image and every view of one render has
the same scale. With `normalize=False` the origin is the centre of each cell and `extent` model units span the
cell's shorter side, so sizes compare across parts (what sticks out is cut off).

A part that needs worker threads would hang in a child that may not start threads (RLIMIT_NPROC = 0): `warm_up`
sizes OCCT's shared thread pool to the calling thread alone before anything uses it, so booleans, fillets and
meshing (which build123d asks to run in parallel) run serially instead.
"""

from __future__ import annotations

import math
import re
from typing import Any

OPTIONS: dict[str, Any] = {
    "views": "iso",
    "normalize": True,
    "fill": 0.95,
    "extent": 100.0,
    "background": "#ffffff",
    "color": "#9db4d0",
    "supersample": 2,
    "tolerance": 1e-3,
    "angular_tolerance": 0.2,
    "max_bytes": 200_000,
}
"""Defaults: `views` (a name in `VIEWS` or a list of them), `normalize` (fit the bounding box) with `fill` (share of
the cell the box diagonal spans) or, when False, `extent` (model units across the cell's shorter side),
`background` and part `color` (`"#rrggbb"` or `[r, g, b]` in 0-255), `supersample` (samples per pixel per side, 1-4),
mesh `tolerance` (relative to the bounding-box diagonal) and `angular_tolerance` (radians), and the largest accepted
script in bytes."""

VIEWS: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {
    "front": ((0.0, -1.0, 0.0), (0.0, 0.0, 1.0)),
    "back": ((0.0, 1.0, 0.0), (0.0, 0.0, 1.0)),
    "right": ((1.0, 0.0, 0.0), (0.0, 0.0, 1.0)),
    "left": ((-1.0, 0.0, 0.0), (0.0, 0.0, 1.0)),
    "top": ((0.0, 0.0, 1.0), (0.0, 1.0, 0.0)),
    "bottom": ((0.0, 0.0, -1.0), (0.0, -1.0, 0.0)),
    "iso": ((1.0, -1.0, 1.0), (0.0, 0.0, 1.0)),
}
"""View name -> (direction from the part towards the camera, the world direction that points up on screen)."""

_HEX = re.compile(r"^#?([0-9a-fA-F]{6})$")
_AMBIENT, _DIFFUSE = 0.3, 0.7
_MAX_PAIRS = 1 << 20  # (triangle, pixel) candidates per rasteriser chunk: bounds its memory to tens of MB


class RenderRefused(ValueError):
    """The script built nothing drawable, or an option is bad; the message is the reason reported to the caller."""


def check_options(options: dict[str, Any]) -> None:
    """Validates option values (the caller runs this before sending a batch, so a typo raises there, once).

    Args:
        options: `OPTIONS` merged with the caller's overrides.

    Raises:
        ValueError: naming the bad option and what it accepts.
    """
    _views(options["views"])
    _rgb(options["background"], "background")
    _rgb(options["color"], "color")
    for name in ("fill", "extent", "tolerance", "angular_tolerance"):
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
            raise ValueError(f"cad option {name} must be a positive number, got {value!r}")
    if not isinstance(options["normalize"], bool):
        raise ValueError(f"cad option normalize must be True or False, got {options['normalize']!r}")
    if options["supersample"] not in (1, 2, 3, 4) or isinstance(options["supersample"], bool):
        raise ValueError(f"cad option supersample must be 1, 2, 3 or 4, got {options['supersample']!r}")


def _views(value: Any) -> list[str]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not names or any(n not in VIEWS for n in names):
        raise ValueError(f"cad option views must be one of {sorted(VIEWS)} or a non-empty list of them, got {value!r}")
    return list(names)


def _rgb(value: Any, name: str) -> tuple[int, int, int]:
    if isinstance(value, str) and (m := _HEX.match(value)):
        h = m.group(1)
        return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)
    if (
        isinstance(value, list | tuple)
        and len(value) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in value)
    ):
        return int(value[0]), int(value[1]), int(value[2])
    raise ValueError(f"cad option {name} must be '#rrggbb' or [r, g, b] in 0-255, got {value!r}")


def read_roots() -> list[str]:
    """Directories the render child must read besides the Python installation: none (OCP lives in site-packages)."""
    return []


def warm_up() -> None:
    """Imports build123d, makes OCCT run serially, and builds, meshes and draws a filleted, drilled part once."""
    import numpy  # noqa: F401
    from OCP.OSD import OSD_ThreadPool

    # Before anything creates the default pool: one thread, the caller's. A pool made here with background threads
    # would be copied into every forked child without its threads, and a child may not start new ones.
    pool = OSD_ThreadPool.DefaultPool_s(1)
    if pool.NbThreads() != 1:
        pool.Init(1)
    if pool.NbThreads() != 1:
        raise RuntimeError(f"could not make OCCT's thread pool single-threaded ({pool.NbThreads()} threads)")
    import build123d  # noqa: F401
    from OCP.BRepMesh import BRepMesh_IncrementalMesh  # noqa: F401
    from OCP.StlAPI import StlAPI_Writer  # noqa: F401

    script = (
        "from build123d import *\n"
        "with BuildPart() as p:\n"
        "    Box(4, 3, 1)\n"
        "    fillet(p.edges().filter_by(Axis.Z), 0.5)\n"
        "    Hole(0.5)\n"
        "    with Locations((1, 0, 0.5)):\n"
        "        Cylinder(0.5, 1, align=(Align.CENTER, Align.CENTER, Align.MIN))\n"
    )
    render(script, 32, 32, {"views": ["front", "iso"]})


def render(source: str, width: int, height: int, options: dict[str, Any]) -> bytes:
    """Runs a build123d script and draws the part it builds.

    Args:
        source: Python code that builds a part (see the module docstring for which object is drawn).
        width: output width in pixels.
        height: output height in pixels.
        options: overrides of `OPTIONS`.

    Returns:
        `height * width * 3` bytes, RGB, row-major.
    """
    import builtins

    import numpy as np

    opts = {**OPTIONS, **options}
    try:
        check_options(opts)
    except ValueError as e:
        raise RenderRefused(str(e)) from None
    if len(source.encode("utf-8", "surrogatepass")) > opts["max_bytes"]:
        raise RenderRefused(f"cad script refused: more than {opts['max_bytes']} bytes")
    code = compile(source, "<cad>", "exec")
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    exec(code, namespace)
    shape = _result(namespace)
    triangles = _tessellate(shape, opts)  # [T, 3, 3] float64, counter-clockwise seen from outside
    box = shape.bounding_box()
    center = np.array([box.center().X, box.center().Y, box.center().Z])
    views = _views(opts["views"])
    background = np.array(_rgb(opts["background"], "background"), dtype=np.float64)
    color = np.array(_rgb(opts["color"], "color"), dtype=np.float64)
    image = np.empty((height, width, 3), dtype=np.uint8)
    image[:] = background.astype(np.uint8)
    cols = math.ceil(math.sqrt(len(views)))
    rows = math.ceil(len(views) / cols)
    for k, name in enumerate(views):
        r, c = divmod(k, cols)
        x0, x1 = c * width // cols, (c + 1) * width // cols
        y0, y1 = r * height // rows, (r + 1) * height // rows
        if x1 > x0 and y1 > y0:
            image[y0:y1, x0:x1] = _draw_view(
                triangles, name, x1 - x0, y1 - y0, center, box.diagonal, opts, color, background
            )
    return image.tobytes()


def _result(namespace: dict[str, Any]) -> Any:
    """Picks the shape to draw (module docstring, "Which object is the result") and checks it."""
    from build123d import BuildPart, Shape

    for name in ("result", "part"):
        if name in namespace:
            shape = _as_shape(namespace[name])
            if shape is None:
                raise RenderRefused(
                    f"cad script: `{name}` is a {type(namespace[name]).__name__}, not a build123d shape"
                )
            return _checked(shape, f"`{name}`")
    for name, value in reversed(namespace.items()):
        if name.startswith("_") or not isinstance(value, Shape | BuildPart):
            continue
        shape = _as_shape(value)
        if shape is not None and shape.solids():
            return _checked(shape, f"`{name}`")
    raise RenderRefused("cad script built no solid (assign the part to `result`)")


def _as_shape(value: Any) -> Any:
    from build123d import BuildPart, Compound, Shape

    if isinstance(value, BuildPart):
        value = value.part
    if isinstance(value, Shape):
        return value
    if isinstance(value, list | tuple) and value and all(isinstance(v, Shape) for v in value):
        return Compound(list(value))
    return None


def _checked(shape: Any, what: str) -> Any:
    if not shape.solids():
        raise RenderRefused(f"cad script: {what} has no solid")
    diagonal = shape.bounding_box().diagonal
    if not (math.isfinite(diagonal) and diagonal > 1e-9):
        raise RenderRefused(f"cad script: {what} has no extent (bounding-box diagonal {diagonal})")
    return shape


def _tessellate(shape: Any, opts: dict[str, Any]) -> Any:
    """Meshes `shape` in memory; returns `[T, 3, 3]` triangle corners (float64)."""
    import io

    import numpy as np
    from OCP.BRepMesh import BRepMesh_IncrementalMesh
    from OCP.StlAPI import StlAPI_Writer

    deflection = float(opts["tolerance"]) * shape.bounding_box().diagonal
    BRepMesh_IncrementalMesh(shape.wrapped, deflection, False, float(opts["angular_tolerance"]), False)
    # Binary STL into memory: OCCT walks the faces in C++ and orients each triangle outwards (reversed faces
    # included), far faster than collecting nodes face by face in Python.
    writer = StlAPI_Writer()
    writer.ASCIIMode = False
    stream = io.BytesIO()
    if not writer.Write(shape.wrapped, stream):
        raise RenderRefused("cad script: the part could not be tessellated")
    data = stream.getvalue()
    count = int.from_bytes(data[80:84], "little") if len(data) >= 84 else 0
    if count == 0 or len(data) < 84 + 50 * count:
        raise RenderRefused("cad script: the part tessellated to no triangles")
    record = np.dtype([("normal", "<f4", (3,)), ("corners", "<f4", (3, 3)), ("attr", "<u2")])
    triangles = np.frombuffer(data, dtype=record, count=count, offset=84)["corners"].astype(np.float64)  # [T, 3, 3]
    if not np.isfinite(triangles).all():
        raise RenderRefused("cad script: the tessellation has non-finite coordinates")
    return triangles


def _draw_view(
    triangles: Any,
    view: str,
    width: int,
    height: int,
    center: Any,
    diagonal: float,
    opts: dict[str, Any],
    color: Any,
    background: Any,
) -> Any:
    """Draws one view into a `[height, width, 3]` uint8 array."""
    import numpy as np

    toward, up = (np.array(v, dtype=np.float64) for v in VIEWS[view])
    eye = toward / np.linalg.norm(toward)
    right = np.cross(up, eye)
    right /= np.linalg.norm(right)
    up = np.cross(eye, right)
    s = int(opts["supersample"])
    w, h = width * s, height * s
    if opts["normalize"]:
        origin, scale = center, float(opts["fill"]) * min(w, h) / diagonal  # pixels per model unit
    else:
        origin, scale = np.zeros(3), min(w, h) / float(opts["extent"])
    rel = triangles - origin  # [T, 3, 3]
    px = w / 2 + scale * (rel @ right)  # [T, 3]
    py = h / 2 - scale * (rel @ up)  # [T, 3]; image rows grow downwards
    depth = rel @ eye  # [T, 3]; larger is nearer the camera
    normals = np.cross(triangles[:, 1] - triangles[:, 0], triangles[:, 2] - triangles[:, 0])  # [T, 3]
    lengths = np.linalg.norm(normals, axis=1)
    front = (normals @ eye > 0) & (lengths > 0)  # back faces and degenerate slivers are never visible
    light = 0.6 * up - 0.4 * right + eye
    light /= np.linalg.norm(light)
    lambert = np.clip((normals[front] @ light) / lengths[front], 0.0, 1.0)  # [T']
    shades = (_AMBIENT + _DIFFUSE * lambert)[:, None] * color  # [T', 3]
    owner = _rasterise(px[front], py[front], depth[front], w, h)  # [h, w], -1 where empty
    palette = np.vstack([shades, background]).astype(np.float32)  # [T' + 1, 3]; index -1 is the background
    # Average the s x s samples of each pixel: s^2 gathers at the output size (cheaper than reducing the big image).
    canvas = sum(palette[owner[i::s, j::s]] for i in range(s) for j in range(s)) / (s * s)  # [height, width, 3]
    return np.clip(np.rint(canvas), 0, 255).astype(np.uint8)


def _rasterise(px: Any, py: Any, depth: Any, w: int, h: int) -> Any:
    """Z-buffers T screen-space triangles; returns the nearest triangle per pixel (-1: none).

    Scanline style, vectorised: each triangle is cut into one span of pixel centres per row it covers, the spans
    into pixels, and the nearest pixel per position wins (`np.maximum.at` on depth). Only covered pixels are ever
    materialised, so the cost follows the drawn area, not the triangles' bounding boxes.

    Args:
        px: `[T, 3]` corner x in pixels (pixel i covers [i, i + 1)).
        py: `[T, 3]` corner y in pixels.
        depth: `[T, 3]` corner depth, larger nearer.
        w: image width.
        h: image height.

    Returns:
        `[h, w]` int64 triangle index, -1 where nothing is drawn.
    """
    import numpy as np

    zbuffer = np.full(h * w, -np.inf)
    owner = np.full(h * w, -1, dtype=np.int64)
    # Depth is linear in screen space (orthographic): z = z0 + gx (x - x0) + gy (y - y0) on each triangle's plane.
    ex1, ey1 = px[:, 1] - px[:, 0], py[:, 1] - py[:, 0]  # [T]
    ex2, ey2 = px[:, 2] - px[:, 0], py[:, 2] - py[:, 0]
    ez1, ez2 = depth[:, 1] - depth[:, 0], depth[:, 2] - depth[:, 0]
    area = ex1 * ey2 - ex2 * ey1  # [T], twice the signed area
    keep = np.abs(area) > 1e-9  # edge-on triangles cover no pixel centre worth drawing
    safe = np.where(keep, area, 1.0)
    gx, gy = (ez1 * ey2 - ez2 * ey1) / safe, (ex1 * ez2 - ex2 * ez1) / safe  # [T]
    # Rows whose centres (r + 0.5) the triangle spans.
    r_lo = np.clip(np.ceil(py.min(1) - 0.5), 0, h).astype(np.int64)  # [T]
    r_hi = np.clip(np.floor(py.max(1) - 0.5), -1, h - 1).astype(np.int64)
    n_rows = np.where(keep, np.maximum(r_hi - r_lo + 1, 0), 0)
    tri = np.repeat(np.arange(len(px)), n_rows)  # [S] one span per (triangle, row)
    row = r_lo[tri] + np.arange(len(tri)) - np.repeat(np.cumsum(n_rows) - n_rows, n_rows)  # [S]
    yc = row + 0.5
    # Where the row's centre line crosses the triangle's three edges: the span is [min, max] of the crossings.
    lo = np.full(len(tri), np.inf)
    hi = np.full(len(tri), -np.inf)
    for i, j in ((0, 1), (1, 2), (2, 0)):
        xa, ya, xb, yb = px[tri, i], py[tri, i], px[tri, j], py[tri, j]
        dy = yb - ya
        crosses = (np.minimum(ya, yb) <= yc) & (yc <= np.maximum(ya, yb)) & (dy != 0)
        x = xa + (yc - ya) * (xb - xa) / np.where(dy != 0, dy, 1.0)
        lo = np.where(crosses, np.minimum(lo, x), lo)
        hi = np.where(crosses, np.maximum(hi, x), hi)
    # A hair wider than exact, so neighbours sharing an edge leave no crack (the depth test settles the overlap).
    c_lo = np.clip(np.ceil(lo - 0.5 - 1e-7), 0, w).astype(np.int64)  # [S]
    c_hi = np.clip(np.floor(hi - 0.5 + 1e-7), -1, w - 1).astype(np.int64)
    n_cols = np.maximum(c_hi - c_lo + 1, 0)  # [S]
    ends = np.cumsum(n_cols)
    start = 0
    while start < len(tri):  # chunks of spans with at most _MAX_PAIRS pixels (one span holds at most w)
        base = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + _MAX_PAIRS, side="right")))
        n = n_cols[start:stop]
        span = np.repeat(np.arange(start, stop), n)  # [M]
        col = c_lo[span] + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)  # [M]
        t = tri[span]
        z = depth[t, 0] + gx[t] * (col + 0.5 - px[t, 0]) + gy[t] * (yc[span] - py[t, 0])  # [M]
        pix = row[span] * w + col
        np.maximum.at(zbuffer, pix, z)
        # The nearest candidate per pixel owns it (ties, only along shared edges: the later triangle).
        won = z >= zbuffer[pix]
        owner[pix[won]] = t[won]
        start = stop
    return owner.reshape(h, w)
