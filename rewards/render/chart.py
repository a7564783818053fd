"""Charts: runs matplotlib code inside the sandbox's render child and rasterises the figure it leaves open.

Imports only the standard library at the top (the sandbox worker loads this file by path); matplotlib and numpy are
imported in `warm_up`, which the worker runs once, so a render pays none of their import time.

The contract for the code: plain Python that draws with `matplotlib.pyplot` (it may import numpy, math, and the
like) and leaves its figure open. It needs no file path: the renderer takes the current pyplot figure (`plt.gcf()`,
the last one made or activated), sets it to the requested size in pixels at `dpi`, draws it with Agg and composites
it on white. `plt.show()` does nothing, `plt.savefig("x.png")` writes into the scratch directory, and
`if __name__ == "__main__":` blocks run. A figure made without pyplot (`matplotlib.figure.Figure()`) is not seen.
Code that leaves no figure open fails with a reason.
"""

from __future__ import annotations

from typing import Any

OPTIONS: dict[str, Any] = {"dpi": 100, "max_bytes": 200_000}
"""Defaults: `dpi` the figure is drawn at (it sets the size of text and lines relative to the image), and the
largest accepted source in bytes."""


class RenderRefused(ValueError):
    """The input was refused or produced no figure; the message is the reason reported to the caller."""


def read_roots() -> list[str]:
    """Directories the render child must read besides the Python installation: matplotlib's data and cache."""
    import matplotlib

    return [matplotlib.get_data_path(), matplotlib.get_cachedir()]


def warm_up() -> None:
    """Imports matplotlib (Agg), numpy and the submodules charts commonly touch, and draws a chart with text once."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates  # noqa: F401
    import matplotlib.patches  # noqa: F401
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401
    import numpy as np

    try:
        import mpl_toolkits.mplot3d  # noqa: F401  # 3-D axes are common in chart benchmarks
    except ImportError:
        pass
    fig, ax = plt.subplots()
    ax.bar(["a", "b"], [1, 2], label="bars")
    ax.plot(np.arange(3), np.arange(3), "o-", label="line")
    ax.set_title("Warm-up $x^2$")
    ax.legend()
    fig.tight_layout()
    fig.canvas.draw()
    plt.close("all")
    render("import matplotlib.pyplot as plt\nplt.plot([1, 2])\n", 32, 32, {})


def render(source: str, width: int, height: int, options: dict[str, Any]) -> bytes:
    """Runs chart code and rasterises its figure.

    Args:
        source: Python code that leaves a pyplot figure open.
        width: output width in pixels.
        height: output height in pixels.
        options: overrides of `OPTIONS`.

    Returns:
        `height * width * 3` bytes, RGB, row-major.
    """
    import builtins

    import matplotlib.pyplot as plt
    import numpy as np

    opts = {**OPTIONS, **options}
    if len(source.encode("utf-8", "surrogatepass")) > opts["max_bytes"]:
        raise RenderRefused(f"chart code refused: more than {opts['max_bytes']} bytes")
    plt.close("all")
    code = compile(source, "<chart>", "exec")
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    exec(code, namespace)
    if not plt.get_fignums():
        raise RenderRefused("chart code left no matplotlib figure open")
    fig = plt.gcf()
    dpi = float(opts["dpi"])
    fig.set_dpi(dpi)
    # Agg truncates the pixel size (2.55 in * 100 dpi = 254.999...): aim a hair above, then crop.
    fig.set_size_inches((width + 1e-3) / dpi, (height + 1e-3) / dpi)
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())[:height, :width]
    if rgba.shape[:2] != (height, width):
        raise RenderRefused(f"chart rendered at {rgba.shape[1]}x{rgba.shape[0]}, not {width}x{height}")
    alpha = rgba[..., 3:4].astype(np.uint16)
    # Composite on white. Agg's buffer is not premultiplied.
    rgb = (rgba[..., :3].astype(np.uint16) * alpha + 255 * (255 - alpha) + 127) // 255
    return rgb.astype(np.uint8).tobytes()
