"""A real-world corpus of render inputs, to check the sandbox refuses nothing benign and renders what it renders
exactly as the same rasteriser does outside it (a refusal of a benign file is a wrong zero reward).

* `package_svgs()`: every `.svg` file shipped inside the installed Python packages (matplotlib's toolbar icons,
  pygame's, Ray's dashboard logo, ...), files written by other people's tools.
* `CHART_SCRIPTS`: matplotlib scripts in the styles seen in chart collections (standard-library imports, numpy,
  dates, patches, annotations, subplots, images, 3-D axes, log scales, hatches, LaTeX-like mathtext).
* `matplotlib_svgs()`: the SVG files matplotlib itself writes for those scripts (XML declaration, the SVG 1.1
  public DOCTYPE, CSS, clip paths, glyph definitions), as users export them.

`check(kind, sources, size)` renders each source in the sandbox and unsandboxed (the same module's `render`, run in
this process), and returns one `CorpusResult` per source: refused (with the reason), or rendered and pixel-equal
or not. Only for trusted inputs: the unsandboxed render runs chart code in this process.

    python bench/render_corpus.py        # the whole corpus, a line per refusal or difference
"""

from __future__ import annotations

import glob
import io
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from rewards.render import chart as chart_module
from rewards.render import render_batch
from rewards.render import svg as svg_module

CHART_SCRIPTS: dict[str, str] = {
    "line_stdlib": (
        "import math, random, statistics, datetime, collections, itertools, json, csv, io, textwrap\n"
        "import matplotlib.pyplot as plt\n"
        "random.seed(0)\n"
        "xs = list(range(30))\n"
        "ys = [math.sin(x / 4) + random.gauss(0, 0.1) for x in xs]\n"
        "plt.plot(xs, ys, label=f'mean {statistics.mean(ys):.2f}')\n"
        "plt.legend(); plt.title(textwrap.shorten('A noisy sine wave with a long title', 30))\n"
    ),
    "bars_numpy": (
        "import numpy as np\nimport matplotlib.pyplot as plt\n"
        "labels = ['Q1', 'Q2', 'Q3', 'Q4']\n"
        "a, b = np.array([3, 5, 2, 6]), np.array([2, 2, 4, 1])\n"
        "fig, ax = plt.subplots()\n"
        "ax.bar(labels, a, label='A', hatch='//')\nax.bar(labels, b, bottom=a, label='B')\n"
        "for i, v in enumerate(a + b):\n    ax.annotate(str(v), (i, v), ha='center', va='bottom')\n"
        "ax.set_ylabel('Revenue ($M)'); ax.legend()\n"
    ),
    "dates": (
        "import datetime as dt\nimport matplotlib.pyplot as plt\nimport matplotlib.dates as mdates\n"
        "days = [dt.date(2024, 1, 1) + dt.timedelta(days=7 * i) for i in range(12)]\n"
        "fig, ax = plt.subplots()\nax.plot(days, [i * i for i in range(12)], marker='o')\n"
        "ax.xaxis.set_major_formatter(mdates.DateFormatter('%b %d')); fig.autofmt_xdate()\n"
    ),
    "scatter_colorbar": (
        "import numpy as np\nimport matplotlib.pyplot as plt\n"
        "rng = np.random.default_rng(0)\nx, y = rng.normal(size=(2, 200))\n"
        "sc = plt.scatter(x, y, c=x * y, cmap='viridis', s=12)\nplt.colorbar(sc, label='x * y')\n"
        "plt.xlabel(r'$\\alpha_i$'); plt.ylabel(r'$\\sqrt{\\beta}$')\n"
    ),
    "subplots_pie_hist": (
        "import numpy as np\nimport matplotlib.pyplot as plt\n"
        "fig, (a, b) = plt.subplots(1, 2, figsize=(6, 3))\n"
        "a.pie([30, 20, 50], labels=['x', 'y', 'z'], autopct='%1.0f%%')\n"
        "b.hist(np.random.default_rng(1).normal(size=500), bins=20, color='tab:orange', edgecolor='k')\n"
        "fig.suptitle('Two panels'); fig.tight_layout()\n"
    ),
    "image_heatmap": (
        "import numpy as np\nimport matplotlib.pyplot as plt\n"
        "z = np.add.outer(np.arange(8), np.arange(8)) % 5\n"
        "fig, ax = plt.subplots()\nim = ax.imshow(z, cmap='magma')\n"
        "for (i, j), v in np.ndenumerate(z):\n    ax.text(j, i, int(v), ha='center', va='center', color='w', fontsize=6)\n"
    ),
    "patches_log": (
        "import matplotlib.pyplot as plt\nimport matplotlib.patches as mpatches\n"
        "fig, ax = plt.subplots()\nax.set_yscale('log')\nax.plot([1, 10, 100], [1, 100, 10000])\n"
        "ax.add_patch(mpatches.FancyBboxPatch((10, 10), 30, 90, boxstyle='round,pad=2', alpha=0.3))\n"
        "ax.grid(True, which='both', linestyle=':')\n"
    ),
    "three_d": (
        "import numpy as np\nimport matplotlib.pyplot as plt\n"
        "ax = plt.figure().add_subplot(projection='3d')\n"
        "t = np.linspace(0, 4 * np.pi, 100)\nax.plot(np.cos(t), np.sin(t), t)\n"
    ),
    "stdlib_network_modules_imported_only": (
        "import asyncio, smtplib, ssl, urllib.request, multiprocessing, webbrowser, uuid, hashlib, pathlib\n"
        "import matplotlib.pyplot as plt\n"
        "plt.barh(['a', 'b'], [len(hashlib.sha1(b'x').hexdigest()), len(str(pathlib.PurePath('x/y')))])\n"
    ),
}


@dataclass
class CorpusResult:
    name: str
    kind: str
    refused: str  # the sandbox's reason, "" when it rendered
    equal: bool | None  # pixel-equal to the unsandboxed render (None when refused)
    # A refusal of an input the rasteriser renders outside the sandbox, without our checks (cairosvg with
    # unsafe=False for SVG; the chart code run in this process). A refused input it cannot render either (a
    # template with {placeholders} shipped as .svg, say) is a true refusal, with `outside` saying why.
    false_refusal: bool = False
    outside: str = ""


def package_svgs() -> dict[str, str]:
    """Every `.svg` file under the installed packages (purelib and platlib), by its path there."""
    found: dict[str, str] = {}
    for root in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for path in sorted(glob.glob(str(Path(root) / "**" / "*.svg"), recursive=True)):
            try:
                found[str(Path(path).relative_to(root))] = Path(path).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
    return found


def matplotlib_svgs(scripts: dict[str, str] | None = None) -> dict[str, str]:
    """The SVG matplotlib writes (`savefig(format="svg")`) for each chart script, run in this process."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = {}
    for name, source in (scripts or CHART_SCRIPTS).items():
        plt.close("all")
        exec(compile(source, f"<{name}>", "exec"), {"__name__": "__main__"})
        buffer = io.StringIO()
        plt.gcf().savefig(buffer, format="svg")
        plt.close("all")
        out[f"{name}.svg"] = buffer.getvalue()
    return out


def check(kind: str, sources: dict[str, str], size: int = 96) -> list[CorpusResult]:
    """Each source rendered in the sandbox and outside it with the same rasteriser; see the module docstring."""
    local = {"svg": svg_module.render, "chart": chart_module.render}[kind]
    names = list(sources)
    sandboxed = render_batch(kind, [sources[n] for n in names], size=size, timeout=60)
    results = []
    for name, result in zip(names, sandboxed, strict=True):
        if result.image is None:
            why = _renders_outside(kind, sources[name], size)
            results.append(CorpusResult(name, kind, result.reason, None, false_refusal=why == "", outside=why))
            continue
        outside = local(sources[name], size, size, {})
        results.append(CorpusResult(name, kind, "", result.image.flatten().tolist() == list(outside)))
    return results


def _renders_outside(kind: str, source: str, size: int) -> str:
    """ "" if the rasteriser renders `source` outside the sandbox and without our input checks, else why not."""
    try:
        if kind == "svg":
            import cairosvg

            cairosvg.svg2png(bytestring=source.encode("utf-8"), output_width=size, output_height=size, unsafe=False)
        else:
            chart_module.render(source, size, size, {})
    except Exception as e:  # noqa: BLE001 - whatever stops the renderer itself makes the input invalid
        return f"{type(e).__name__}: {e}"[:200]
    return ""


def main() -> int:
    """Checks the whole corpus; prints every refusal (false or not) and difference, and a total; exit 1 on a false
    refusal or a difference."""
    results = check("svg", package_svgs()) + check("svg", matplotlib_svgs()) + check("chart", CHART_SCRIPTS)
    for r in results:
        if r.refused:
            kind = "FALSE REFUSAL" if r.false_refusal else f"refused, and outside the sandbox too ({r.outside})"
            print(f"{r.kind:5s} {r.name}: {kind}: {r.refused}")
        elif not r.equal:
            print(f"{r.kind:5s} {r.name}: differs from the unsandboxed render")
    counts = {kind: sum(r.kind == kind for r in results) for kind in ("svg", "chart")}
    false = sum(r.false_refusal for r in results)
    print(f"{len(results)} inputs ({counts['svg']} SVG files, {counts['chart']} chart scripts): "
          f"{sum(bool(r.refused) for r in results)} refused, of which {false} false; "
          f"{sum(r.equal is False for r in results)} differ")  # fmt: skip
    return 1 if false or any(r.equal is False for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
