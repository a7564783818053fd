"""Sandboxed rendering: SVG and chart renders come out right, batches keep their order, workers recover.

The module-level `render` / `render_batch` use the process-wide pools, which stay warm across tests (and test
modules), so worker start-up is paid once per kind per session.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import zlib

import pytest
import torch

pytest.importorskip("cairosvg")

from rewards.render import RenderPool, render, render_batch, render_similarity, stack_renders  # noqa: E402
from rewards.render.svg import RenderRefused, check_svg  # noqa: E402

NS = 'xmlns="http://www.w3.org/2000/svg"'


def svg(body: str, width: int = 40, height: int = 30, extra: str = "") -> str:
    return f'<svg {NS} {extra} width="{width}" height="{height}" viewBox="0 0 {width} {height}">{body}</svg>'


def tiny_png(rgb: tuple[int, int, int]) -> bytes:
    """A 2x2 PNG of one colour, built by hand (no PIL needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    rows = b"".join(b"\x00" + bytes(rgb) * 2 for _ in range(2))
    header = (2).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def test_import_rewards_needs_only_torch():
    code = (
        "import sys, rewards, rewards.render, rewards.image, rewards.ocr\n"
        "heavy = ['cairosvg', 'matplotlib', 'cv2', 'rapidocr_onnxruntime', 'skimage', 'transformers', 'sim', 'mmrl']\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_svg_render_pixels_and_size():
    body = '<rect x="0" y="0" width="20" height="30" fill="#ff0000"/><rect x="20" width="20" height="30" fill="blue"/>'
    result = render("svg", svg(body), size=(40, 30))
    assert result.reason == "" and result.ok
    image = result.image
    assert image.dtype == torch.uint8 and image.shape == (30, 40, 3)  # [H, W, 3] for size (W, H)
    assert image[15, 5].tolist() == [255, 0, 0]
    assert image[15, 35].tolist() == [0, 0, 255]
    # Scaled to the requested size; transparent areas come out white.
    scaled = render("svg", svg('<rect width="20" height="30" fill="black"/>'), size=(80, 60)).image
    assert (
        scaled.shape == (60, 80, 3) and scaled[30, 10].tolist() == [0, 0, 0] and scaled[30, 70].tolist() == [255] * 3
    )


def test_svg_gradients_opacity_text_and_inline_png():
    body = (
        '<defs><linearGradient id="g"><stop offset="0" stop-color="red"/><stop offset="1" stop-color="blue"/>'
        '</linearGradient></defs><rect width="40" height="15" fill="url(#g)" opacity="0.5"/>'
        '<text x="2" y="28" font-family="DejaVu Sans" font-size="10">Hi</text><use href="#g"/>'
    )
    result = render("svg", svg(body), size=64)
    assert result.ok, result.reason
    data = base64.b64encode(tiny_png((0, 200, 0))).decode()
    image = render("svg", svg(f'<image href="data:image/png;base64,{data}" width="40" height="30"/>'), size=40).image
    assert image is not None and image[20, 20].tolist() == [0, 200, 0]


def test_chart_render():
    code = (
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots()\n"
        "ax.bar(['a', 'b', 'c'], [3, 1, 2], color='red')\n"
        "ax.set_title('Sales')\n"
        "plt.savefig('copy.png')  # writes into the scratch dir, which is allowed\n"
        "if __name__ == '__main__':\n"
        "    ax.set_facecolor('black')\n"
    )
    result = render("chart", code, size=(96, 64), timeout=30)
    assert result.ok, result.reason
    image = result.image
    assert image.shape == (64, 96, 3)
    red = (image[..., 0] > 200) & (image[..., 1] < 60) & (image[..., 2] < 60)
    black = (image < 30).all(-1)
    assert red.sum() > 20 and black.sum() > 100  # the bars, and the __main__ block ran
    missing = render("chart", "x = 1", size=32, timeout=30)
    assert missing.image is None and "no matplotlib figure" in missing.reason


def test_chart_scripts_may_import_harmless_modules():
    """Importing is not using: ssl, smtplib, asyncio, multiprocessing and webbrowser load; their use is refused
    (tests/rewards/test_hostile.py). Only modules whose harm raises no audit event stay refused at import."""
    imports = "import asyncio, csv, json, multiprocessing, smtplib, ssl, statistics, urllib.request, webbrowser\n"
    result = render("chart", imports + "import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0])\n", size=32)
    assert result.ok, result.reason
    refused = render("chart", "import cffi\n", size=32)
    assert not refused.ok and ("import of 'cffi'" in refused.reason or "No module named" in refused.reason)


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs a virtual environment to reach through a link")
def test_chart_renders_with_the_venv_reached_through_a_symlink(tmp_path):
    # The interpreter's own files are then opened under the link's path, while the read roots are the resolved ones;
    # the audit hook must compare like with like. savefig's PNG writer imports PIL plugins inside the render child.
    link = tmp_path / "venv"
    link.symlink_to(os.path.realpath(sys.prefix), target_is_directory=True)
    python = link / "bin" / os.path.basename(sys.executable)
    code = (
        "import sys\n"
        "from rewards.render import render\n"
        "chart = \"import matplotlib.pyplot as plt\\nplt.bar(['a'], [1], color='red')\\nplt.savefig('copy.png')\\n\"\n"
        "result = render('chart', chart, size=(32, 32), timeout=30)\n"
        "print(sys.prefix, result.ok, result.reason)\n"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    prefix, ok, reason = (done.stdout.strip().splitlines()[-1].split(" ", 2) + [""])[:3]
    assert prefix == str(link)  # the link was the interpreter's prefix, so the case is the one that failed
    assert ok == "True", reason


def test_render_batch_keeps_order_and_mixes_failures():
    colors = ["#ff0000", "#00ff00", "#0000ff", "#ffff00", "#00ffff"]
    sources: list = [svg(f'<rect width="40" height="30" fill="{c}"/>') for c in colors]
    sources[1] = "<svg"  # malformed
    sources.append(123)  # not a string
    results = render_batch("svg", sources, size=16)
    assert [r.ok for r in results] == [True, False, True, True, True, False]
    assert "not well-formed" in results[1].reason and "not str" in results[5].reason
    for i in (0, 2, 3, 4):
        expected = [int(colors[i][k : k + 2], 16) for k in (1, 3, 5)]
        assert results[i].image[8, 8].tolist() == expected
    images, ok = stack_renders(results, 16)
    assert images.shape == (6, 16, 16, 3) and ok.tolist() == [True, False, True, True, True, False]
    assert images[1].sum() == 0


def test_render_similarity_scores_failures_zero():
    good = svg('<circle cx="20" cy="15" r="10" fill="purple"/>')
    target = render("svg", good, size=32).image
    targets = torch.stack([target, target, target])
    other = svg('<rect width="40" height="30" fill="yellow"/>')
    scores, reasons = render_similarity("svg", [good, other, "nope"], targets, metric="ssim")
    assert scores[0].item() == pytest.approx(1.0) and scores[1].item() < 0.9 and scores[2].item() == 0.0
    assert reasons[0] == "" and reasons[1] == "" and "not well-formed" in reasons[2]


def test_bad_arguments_are_programming_errors():
    with pytest.raises(ValueError, match="unknown render kind"):
        render("pdf", "%PDF")
    with pytest.raises(TypeError, match="unknown svg render options"):
        render("svg", svg(""), max_things=3)
    with pytest.raises(ValueError, match="render size"):
        render("svg", svg(""), size=0)


def test_dead_worker_is_restarted():
    with RenderPool("svg", workers=1) as pool:
        first = pool.render_batch([svg('<rect width="9" height="9"/>')], 16)[0]
        assert first.ok and pool.isolation["pid"]
        os.killpg(pool.isolation["pid"], signal.SIGKILL)  # the worker dies between renders
        again = pool.render_batch([svg('<rect width="9" height="9"/>')] * 3, 16)
        assert all(r.ok for r in again), [r.reason for r in again]
        # Dead for sure before the next request: writing it breaks the pipe, and a fresh worker takes the requests.
        os.killpg(pool.isolation["pid"], signal.SIGKILL)
        pool._workers[0].proc.wait(timeout=10)
        again = pool.render_batch([svg('<rect width="9" height="9"/>')] * 3, 16)
        assert all(r.ok for r in again), [r.reason for r in again]


def test_sandbox_layers_are_up():
    with RenderPool("svg", workers=1) as pool:
        assert pool.render_batch([svg("")], 8)[0].ok
        info = pool.isolation
    if sys.platform != "linux":
        pytest.skip("the kernel layers are Linux's")
    assert set(info) >= {"network_namespace", "landlock_abi", "user"}
    if os.geteuid() == 0:
        assert info["user"] not in (None, 0)  # render children drop root


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ('<!DOCTYPE svg [<!ENTITY a "b">]><svg/>', "DOCTYPE"),
        (f"<svg {NS}><!ENTITY a 'b'></svg>", "not well-formed"),  # a declaration outside the DOCTYPE is not XML
        ('<!DOCTYPE svg [<!ENTITY xxe SYSTEM "file:///etc/passwd">]><svg/>', "DOCTYPE"),
        ('<!DOCTYPE svg [<!ENTITY % p SYSTEM "http://x/p.dtd"> %p;]><svg/>', "DOCTYPE"),
        ('<!DOCTYPE svg [<!ENTITY i SYSTEM "x.png" NDATA png>]><svg/>', "DOCTYPE"),
        (f'<!DOCTYPE svg SYSTEM "http://x/a.dtd"><svg {NS}><text>&nbsp;</text></svg>', "undeclared entity"),
        # A default attribute from the internal subset is checked like a written one.
        (f'<!DOCTYPE svg [<!ATTLIST image href CDATA "file:///etc/passwd">]><svg {NS}><image/></svg>', "external"),
        ('<?xml version="1.0" encoding="UTF-16"?><svg/>', "UTF-8"),
        ('<?xml-stylesheet href="http://x/s.css"?><svg/>', "style sheets"),
        ("<html/>", "not <svg>"),
        (f'<svg {NS} width="1e9" height="10"/>', "width"),
        (f'<svg {NS} viewBox="0 0 10 inf"/>', "viewBox height"),
        (f'<svg {NS}><image href="file:///etc/passwd"/></svg>', "external reference"),
        (f'<svg {NS}><image href="http://example.com/a.png"/></svg>', "external reference"),
        (f'<svg {NS}><image href="secret.png"/></svg>', "external reference"),
        (f'<svg {NS}><use href="other.svg#a"/></svg>', "external reference"),
        (f'<svg {NS}><image href="data:image/svg+xml;base64,PHN2Zy8+"/></svg>', "external reference"),
        (f'<svg {NS}><rect href="data:image/png;base64,AAAA"/></svg>', "external reference"),  # data: only on <image>
        (f'<svg {NS}><rect fill="url(http://x/#g)"/></svg>', "external reference"),
        (f'<svg {NS}><rect style="fill: url(file:///etc/passwd)"/></svg>', "external reference"),
        (f"<svg {NS}><style>@import url(#x);</style></svg>", "@import"),
        (f"<svg {NS}><style>rect {{ fill: url('/etc/passwd') }}</style></svg>", "external reference"),
        (f"<svg {NS}>" + "<g>" * 100 + "</g>" * 100 + "</svg>", "nested deeper"),
        (f"<svg {NS}>" + "<rect/>" * 20_001 + "</svg>", "more than 20000 elements"),
        ("<svg " + "x" * 1_000_001, "bytes"),
    ],
)
def test_check_svg_refuses(source, reason):
    with pytest.raises(RenderRefused, match=reason):
        check_svg(source)


@pytest.mark.parametrize("size", ['width="40" height="20" ', ""], ids=["sized", "unsized"])
def test_a_huge_viewbox_is_a_coordinate_system_not_a_huge_canvas(size):
    # Public SVGs (maps, plots in data units) use viewBoxes far wider than 20000 units; the canvas is the render size.
    body = (
        '<rect width="50000" height="50000" fill="#ff0000"/><rect x="50000" width="50000" height="50000" fill="blue"/>'
    )
    result = render("svg", f'<svg {NS} {size}viewBox="0 0 100000 50000">{body}</svg>', size=(40, 20))
    assert result.ok, result.reason
    assert result.image[10, 5].tolist() == [255, 0, 0] and result.image[10, 35].tolist() == [0, 0, 255]


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (f'<svg {NS} width="40" height="1e6" viewBox="0 0 40 30"/>', "height '1e6' is larger than 20000"),
        (f'<svg {NS} width="30000" height="20" viewBox="0 0 100000 50000"/>', "width '30000' is larger than 20000"),
    ],
)
def test_a_huge_width_or_height_is_still_refused_whatever_the_viewbox(source, reason):
    with pytest.raises(RenderRefused, match=reason):
        check_svg(source)


SVG11_DOCTYPE = '<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN" "http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd">'


@pytest.mark.parametrize(
    "doctype", ["<!DOCTYPE svg>", SVG11_DOCTYPE, '<!DOCTYPE svg [<!ATTLIST rect fill CDATA "green">]>']
)
def test_a_doctype_without_entities_renders_as_without_it(doctype):
    body = '<rect width="20" height="30" fill="#ff0000"/><rect x="20" width="20" height="30"/>'
    plain = render("svg", svg(body), size=(40, 30))
    declared = render(
        "svg", '<?xml version="1.0" encoding="utf-8" standalone="no"?>\n' + doctype + svg(body), (40, 30)
    )
    assert plain.ok and declared.ok, declared.reason
    if "ATTLIST" in doctype:  # the declared default fills the second rect, as in any XML parser
        assert declared.image[15, 30].tolist() == [0, 128, 0] and plain.image[15, 30].tolist() == [0, 0, 0]
    else:
        assert torch.equal(declared.image, plain.image)


def test_matplotlib_svg_renders_in_the_sandbox_as_outside():
    """An SVG as matplotlib writes it (XML declaration, the SVG 1.1 DOCTYPE, CSS, clip paths, text as paths)."""
    import io

    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rewards.render import svg as svg_module

    figure, axes = plt.subplots(figsize=(2, 1.5), dpi=72)
    axes.plot([0, 1, 2], [1, 0, 2], color="tab:red")
    axes.set_title("ok")
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    plt.close(figure)
    source = buffer.getvalue()
    assert "<!DOCTYPE svg PUBLIC" in source
    sandboxed = render("svg", source, size=(144, 108))
    assert sandboxed.ok, sandboxed.reason
    outside = svg_module.render(source, 144, 108, {})  # the same rasteriser, in this process, no sandbox
    assert sandboxed.image.flatten().tolist() == list(outside)
    assert (sandboxed.image < 250).any()  # something was drawn


def test_check_svg_accepts_internal_references():
    body = '<defs><linearGradient id="g"/></defs><rect fill="url(#g)" style="stroke:url( \'#g\' )"/><use href="#g"/>'
    assert check_svg(svg(body)).startswith(b"<svg")
    with pytest.raises(RenderRefused, match="at most|deeper"):
        check_svg(svg("<g><g><g></g></g></g>"), {"max_depth": 3})


# ------------------------------------------------------------------------------------------- warm render children
def _warm_children(worker_pid: int) -> list[int]:
    """The worker's live children (its warm render child), from /proc."""
    path = f"/proc/{worker_pid}/task/{worker_pid}/children"
    if not os.path.exists(path):
        pytest.skip("this kernel does not list a process's children in /proc")
    with open(path) as f:
        return [int(pid) for pid in f.read().split()]


def test_a_warm_child_renders_exactly_what_fresh_children_do():
    gradient = '<defs><linearGradient id="g"><stop offset="0" stop-color="red"/><stop offset="1" stop-color="blue"/>'
    gradient += '</linearGradient></defs><rect width="40" height="30" fill="url(#g)" opacity="0.6"/>'
    sources = [
        svg(gradient),
        svg('<text x="2" y="20" font-family="DejaVu Sans" font-size="12">Ab</text>'),
        "<svg",  # malformed: refused by the checks, the warm child stays
        svg('<image href="file:///etc/passwd" width="9" height="9"/>'),  # refused reference
        svg('<circle cx="20" cy="15" r="12" fill="teal" fill-opacity="0.5" stroke="black"/>'),
        svg('<path d="M2 2 C 20 40 30 -10 38 28" stroke="navy" stroke-width="3" fill="none"/>'),
        svg(gradient, extra='preserveAspectRatio="none"'),
    ]
    with RenderPool("svg", workers=1, renders_per_child=1) as fresh, RenderPool("svg", workers=1) as warm:
        expected = fresh.render_batch(sources * 2, 48)
        got = warm.render_batch(sources * 2, 48)
    assert [r.ok for r in got] == [r.ok for r in expected] == [True, True, False, False, True, True, True] * 2
    assert [r.reason for r in got] == [r.reason for r in expected]
    for a, b in zip(expected, got):
        assert (a.image is None and b.image is None) or torch.equal(a.image, b.image)


def test_a_warm_child_is_reused_then_retired():
    with RenderPool("svg", workers=1, renders_per_child=2) as pool:
        pool.render_batch([svg("")], 8)
        worker = pool.isolation["pid"]
        first = _warm_children(worker)
        pool.render_batch([svg("")], 8)  # its second render: the same child
        assert _warm_children(worker) == first and len(first) == 1
        pool.render_batch([svg("")], 8)  # past its two: a new child
        assert len(_warm_children(worker)) == 1 and _warm_children(worker) != first
        pool.render_batch([svg("")], 8, memory_mb=512)  # other limits: a child confined with them
        assert _warm_children(worker) not in ([], first)


def test_a_warm_child_that_fails_gives_way_to_a_fresh_child():
    big = svg('<rect width="40" height="30" fill="orange"/>')
    with RenderPool("svg", workers=1, renders_per_child=1) as fresh, RenderPool("svg", workers=1) as warm:
        # A memory budget too small for a 1024 px image: the warm child fails, the fresh retry gives the verdict.
        expected = fresh.render_batch([big], 1024, memory_mb=1)[0]
        got = warm.render_batch([big], 1024, memory_mb=1)[0]
        assert not expected.ok and got.reason == expected.reason
        assert "memory" in got.reason
        after = warm.render_batch([big], 16)[0]  # and the next render is fine
    assert after.ok and after.image[8, 8].tolist() == [255, 165, 0]
