"""The `html` render kind: benign pages render pixel-stable; hostile pages are contained, and the next page renders.

Hostile pages try to reach a local HTTP server started here (every way a page can make a request: sub-resources,
fetch, navigation, form posts, popups, frames), read a file outside the sandbox (`file:` images, frames and fetches,
also from inside `data:` frames), hang (an infinite loop), exhaust memory, or build a huge DOM. The pool here runs
*without* the network namespace, so the server is reachable in principle and what keeps the page off it is the
browser's own layers (request interception, CSP, proxy flags, Landlock's TCP rule, the seccomp filter's UDP rule);
`test_network_namespace_holds` checks the default pool too; `test_webrtc_...` check that a page's WebRTC sends no UDP
(the flags and the seccomp filter together, and the flags alone); `test_landlock_alone_...` checks the browser's
Landlock ruleset on its own (a `file:` page that an unconfined browser reads). No test touches the internet. Without Chromium every test skips, with the
reason.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmrl.cli import main
from rewards.render import RenderPool, chromium, html, isolation
from rewards.score_inputs import read_items

pytestmark = pytest.mark.skipif(html.unavailable() is not None, reason=str(html.unavailable()))

SIZE = 64
TIMEOUT = 3.0  # seconds per render meant to hang
SLOW = 30.0  # seconds per render meant to finish: a fresh context and renderer take seconds on a loaded 2-core box
SLACK = 10.0  # killing and reaping the browser, on a loaded two-core machine
BENIGN = (
    '<!doctype html><html><body style="margin:0;background:#fff">'
    '<div style="position:absolute;left:8px;top:16px;width:32px;height:24px;background:#ff0000"></div>'
    '<div style="position:absolute;left:40px;top:40px;width:16px;height:16px;border-radius:8px;background:#0000ff">'
    "</div><p style=\"position:absolute;left:2px;top:44px;margin:0;font:10px 'DejaVu Sans'\">Hi</p></body></html>"
)


@pytest.fixture(scope="module")
def pool():
    with RenderPool("html", workers=1, network_namespace=False) as p:
        yield p


@pytest.fixture(scope="module")
def server():
    """An HTTP server on 127.0.0.1 that records every request it sees."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _record(self):
            seen.append(f"{self.command} {self.path}")
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<body style='background:#00ff00'>reached</body>")

        do_GET = do_POST = _record  # noqa: N815

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()


@pytest.fixture
def open_folder():
    """A folder anyone may read (pytest's tmp_path is under a 0700 folder): file modes must not be what keeps the
    browser (which runs as `nobody` when the tests run as root) out; the browser's own layers must."""
    folder = Path(tempfile.mkdtemp(prefix="mmrl-html-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _render(pool, source, timeout=TIMEOUT):
    start = time.monotonic()
    result = pool.render_batch([source], SIZE, timeout=timeout)[0]
    return result, time.monotonic() - start


def _green(image: torch.Tensor) -> bool:
    """Any clearly green pixel: what the server's page, or a page that read a secret, paints."""
    r, g, b = image[..., 0].int(), image[..., 1].int(), image[..., 2].int()
    return bool(((g > 200) & (r < 80) & (b < 80)).any())


def _next_render_is_fine(pool, reference):
    result, _ = _render(pool, BENIGN, timeout=SLOW)
    assert result.image is not None, result.reason
    assert torch.equal(result.image, reference)


@pytest.fixture(scope="module")
def reference(pool):
    result, _ = _render(pool, BENIGN, timeout=SLOW)  # the first render also starts the worker and the browser
    assert result.image is not None, result.reason
    return result.image


def test_benign_page_renders_what_it_draws_and_is_pixel_stable(pool, reference):
    assert reference.shape == (SIZE, SIZE, 3) and reference.dtype == torch.uint8
    assert reference[28, 24].tolist() == [255, 0, 0]  # inside the red box
    assert reference[48, 48].tolist() == [0, 0, 255]  # the blue disc's centre
    assert reference[4, 60].tolist() == [255, 255, 255]  # background
    again = pool.render_batch([BENIGN, BENIGN], SIZE, timeout=SLOW)
    assert all(r.image is not None and torch.equal(r.image, reference) for r in again)


def test_scripts_that_draw_at_load_are_rendered(pool):
    page = (
        "<body style='margin:0'><canvas id='c' width='64' height='64'></canvas><script>"
        "addEventListener('load', () => { const g = document.getElementById('c').getContext('2d');"
        "g.fillStyle = '#00ff00'; g.fillRect(0, 0, 64, 32); });</script></body>"
    )
    result, _ = _render(pool, page, timeout=SLOW)
    assert result.image is not None, result.reason
    assert result.image[16, 32].tolist() == [0, 255, 0]
    assert result.image[48, 32].tolist() == [255, 255, 255]


def test_network_requests_never_leave_the_browser(pool, server, reference):
    url, seen = server
    page = f"""<body style="margin:0">
    <img src="{url}/img.png"><link rel="stylesheet" href="{url}/style.css"><script src="{url}/x.js"></script>
    <iframe src="{url}/frame"></iframe><iframe srcdoc="<img src='{url}/srcdoc.png'>"></iframe>
    <video src="{url}/v.mp4"></video><object data="{url}/object"></object>
    <script>
      fetch("{url}/fetch").then(() => document.body.style.background = "#00ff00").catch(() => 0);
      try {{ const x = new XMLHttpRequest(); x.open("GET", "{url}/xhr"); x.send(); }} catch (e) {{}}
      try {{ new WebSocket("{url.replace("http", "ws")}/ws"); }} catch (e) {{}}
      try {{ new EventSource("{url}/events"); }} catch (e) {{}}
      try {{ navigator.sendBeacon("{url}/beacon", "x"); }} catch (e) {{}}
      try {{ new Worker("{url}/worker.js"); }} catch (e) {{}}
      try {{ window.open("{url}/popup"); }} catch (e) {{}}
      new Image().src = "http://localhost:{url.rsplit(":", 1)[1]}/localhost.png";
    </script></body>"""
    result, seconds = _render(pool, page, timeout=SLOW)
    assert seconds < SLOW + SLACK
    assert result.image is not None, result.reason
    assert not _green(result.image)
    time.sleep(0.5)  # a request in flight would have arrived by now
    assert seen == []
    _next_render_is_fine(pool, reference)


@pytest.mark.parametrize(
    "script",
    [
        'location = "{url}/away";',
        'location.replace("{url}/replace");',
        'document.write(\'<meta http-equiv="refresh" content="0;url={url}/refresh">\'); document.close();',
        'const f = document.createElement("form"); f.method = "POST"; f.action = "{url}/post";'
        "document.body.appendChild(f); f.submit();",
    ],
    ids=["location", "replace", "meta_refresh", "form_post"],
)
def test_navigation_away_fails_and_sends_nothing(pool, server, reference, script):
    url, seen = server
    page = f"<body><script>{script.format(url=url)}</script></body>"
    result, seconds = _render(pool, page, timeout=SLOW)
    assert seconds < SLOW + SLACK
    assert result.image is None or not _green(result.image)
    if result.image is None:
        assert "navigated away" in result.reason
    time.sleep(0.3)
    assert seen == []
    _next_render_is_fine(pool, reference)


def test_files_outside_the_sandbox_cannot_be_read(pool, open_folder, reference):
    tmp_path = open_folder
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    green_page = tmp_path / "green.html"
    green_page.write_text("<body style='background:#00ff00'>secret</body>")
    green_png = tmp_path / "green.png"
    green_png.write_bytes(_png_green())
    page = f"""<body style="margin:0">
    <img src="file://{green_png}" style="position:absolute;left:0;top:0;width:64px;height:64px">
    <iframe src="file://{green_page}" style="position:absolute;left:0;top:0;border:0"></iframe>
    <iframe src="data:text/html,<img src='file://{green_png}' style='width:64px;height:64px'>"></iframe>
    <link rel="stylesheet" href="file://{tmp_path}/style.css">
    <script>
      for (const u of ["file://{secret}", "file:///etc/passwd"]) {{
        fetch(u).then(r => r.text())
          .then(t => {{ if (t) document.body.style.background = "#00ff00"; }}).catch(() => 0);
        try {{ const x = new XMLHttpRequest(); x.open("GET", u, false); x.send();
               if (x.responseText) document.body.style.background = "#00ff00"; }} catch (e) {{}}
      }}
    </script></body>"""
    result, _ = _render(pool, page, timeout=SLOW)
    assert result.image is not None, result.reason
    assert not _green(result.image)
    _next_render_is_fine(pool, reference)


@pytest.mark.parametrize(
    ("page", "reason", "timeout"),
    [
        ("<script>while (true) {}</script>", "timeout", TIMEOUT),
        ("<body><script>setTimeout(() => { for (;;) {} }, 10)</script></body>", "timeout", TIMEOUT),
        (
            "<script>const a = []; for (;;) a.push(new Float64Array(1 << 20).fill(1));</script>",
            "memory|crash|timeout",
            TIMEOUT,
        ),
        ("<script>let s = 'x'; for (;;) s = s + s;</script>", "memory|crash|timeout", TIMEOUT),
        (
            "<body><script>for (let i = 0; i < 100000; i++) document.body.appendChild(document.createElement('i'))"
            "</script></body>",
            "DOM nodes",
            SLOW,
        ),
        ("<p>" + "<b>x</b>" * 60_000, "DOM nodes", SLOW),
    ],
    ids=["infinite_loop", "loop_in_timer", "array_bomb", "string_bomb", "huge_dom_by_script", "huge_dom_in_source"],
)
def test_hostile_page_fails_within_its_limits(pool, reference, page, reason, timeout):
    result, seconds = _render(pool, page, timeout=timeout)
    assert seconds < timeout + SLACK
    if result.image is not None:  # a bomb V8 refuses at once (RangeError) leaves an ordinary page: contained too
        assert "bomb" in reason or "s + s" in page or "Float64Array" in page
    else:
        assert re.search(reason, result.reason), result.reason
    _next_render_is_fine(pool, reference)


def test_oversized_source_is_refused_before_the_browser(pool):
    result, _ = _render(pool, "<p>" + "x" * (html.OPTIONS["max_bytes"] + 1))
    assert result.image is None and "bytes" in result.reason


def test_network_namespace_holds(server):
    """The default pool (network namespace where available): the page cannot reach the host's loopback."""
    url, seen = server
    with RenderPool("html", workers=1) as pool:
        page = f"<img src='{url}/netns.png'><script>fetch('{url}/f')</script>"
        result = pool.render_batch([page], SIZE, timeout=SLOW)[0]
    assert result.image is not None, result.reason
    time.sleep(0.3)
    assert seen == []


# A page that gathers ICE candidates against a STUN server on the host's loopback, then holds the main thread for
# 1.5 s so that gathering has run before the capture; a gathered candidate turns the page green.
WEBRTC = (
    "<!doctype html><body style='margin:0;background:#fff'><script>"
    "const pc = new RTCPeerConnection({iceServers: [{urls: 'stun:127.0.0.1:PORT'}]});"
    "pc.createDataChannel('x');"
    "pc.onicecandidate = e => { if (e.candidate) document.body.style.background = '#00ff00'; };"
    "pc.createOffer().then(o => pc.setLocalDescription(o))"
    ".then(() => { const t = Date.now(); while (Date.now() - t < 1500) {} });"
    "</script></body>"
)


def _webrtc_sends(pool: RenderPool) -> tuple[list[bytes], list[int]]:
    """Renders `WEBRTC` against a UDP socket on 127.0.0.1; what arrived there (waited for 2 s), and a pixel."""
    import socket

    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        udp.bind(("127.0.0.1", 0))
        udp.settimeout(0.1)
        page = WEBRTC.replace("PORT", str(udp.getsockname()[1]))
        result = pool.render_batch([page], SIZE, timeout=SLOW)[0]
        assert result.image is not None, result.reason
        got = []
        end = time.monotonic() + 2.0
        while time.monotonic() < end and len(got) < 8:
            try:
                got.append(udp.recv(2048))
            except TimeoutError:
                pass
        return got, result.image[SIZE // 2, SIZE // 2].tolist()
    finally:
        udp.close()


def test_webrtc_sends_no_udp_without_the_network_namespace(pool):
    # Without the namespace (this module's pool) the review's page sent a STUN packet to the host (issue 53). Now the
    # flags allow no unproxied UDP and the seccomp filter refuses UDP sockets: no candidate, nothing sent.
    sent, pixel = _webrtc_sends(pool)
    assert pool.isolation["seccomp"] is True and pool.isolation["network_namespace"] is False
    assert sent == [] and pixel == [255, 255, 255]


def test_webrtc_flags_alone_send_no_udp():
    # The browser's flags on their own (seccomp filter off, as where the kernel has none).
    with RenderPool("html", workers=1, network_namespace=False, ipc_namespace=False, seccomp=False) as pool:
        sent, pixel = _webrtc_sends(pool)
        assert pool.isolation["seccomp"] is False
    assert sent == [] and pixel == [255, 255, 255]


def _png_green() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (0, 255, 0)).save(buf, format="PNG")
    return buf.getvalue()


def test_mmrl_score_takes_html_files_and_inline_html(tmp_path, capsys):
    """`.html` predictions and targets are rendered in the sandbox; inline HTML is recognised by `--render auto`."""
    (tmp_path / "pred").mkdir()
    (tmp_path / "target").mkdir()
    blue = "<body style='margin:0;background:#0000ff'></body>"
    (tmp_path / "pred" / "same.html").write_text(BENIGN)
    (tmp_path / "target" / "same.html").write_text(BENIGN)
    (tmp_path / "pred" / "other.html").write_text(blue)
    (tmp_path / "target" / "other.html").write_text(BENIGN)
    out = tmp_path / "scores.jsonl"
    argv = ["score", str(tmp_path), "--metrics", "pixel", "--size", "64", "--workers", "1", "--timeout", "30"]
    assert main([*argv, "--out", str(out)]) == 0
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["same"]["pixel"] == pytest.approx(1.0) and rows["same"]["reason"] == ""
    assert rows["other"]["pixel"] < 0.7
    items = read_items(_jsonl(tmp_path, [{"prediction": "<!DOCTYPE html><p>x</p>", "target": {"html": blue}}]))
    assert items[0].pred_kind == "html" and items[0].target_render == "html"


def _jsonl(folder, rows):
    path = folder / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


@pytest.mark.skipif(isolation.landlock_abi(isolation.libc()) == 0, reason="no Landlock in this kernel")
def test_landlock_alone_keeps_the_browser_out_of_other_files(open_folder):
    """The browser opened on a `file:` page (no interception, no CSP): Landlock refuses the read; without the ruleset
    the same browser reads it, so the test can tell."""
    tmp_path = open_folder
    page = tmp_path / "green.html"
    page.write_text("<body style='background:#00ff00'>secret</body>")
    colours = {}
    for confined in (True, False):
        profile = tmp_path / f"profile-{confined}"
        profile.mkdir()
        uid = gid = None
        if os.geteuid() == 0:
            uid, gid = isolation.nobody()
            os.chown(profile, uid, gid)
        binary = html.browser_path()
        abi = isolation.landlock_abi(isolation.libc()) if confined else 0
        rules = chromium.landlock_rules(binary, str(profile)) if confined else None
        shot = profile / "shot.png"
        cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}"]
        cmd += [f"--screenshot={shot}", "--window-size=64,64", f"file://{page}"]
        pipes = [*os.pipe(), *os.pipe()]
        try:
            pid = chromium.spawn(
                cmd, {"PATH": os.defpath, "HOME": str(profile)}, str(profile), pipes[0], pipes[3], uid, gid, rules, abi
            )
            os.waitpid(pid, 0)
        finally:
            for fd in pipes + [fd for _, fd in rules or ()]:
                os.close(fd)
        colours[confined] = Image.open(shot).convert("RGB").getpixel((32, 32)) if shot.exists() else None
    assert colours[False] == (0, 255, 0)  # unconfined, the browser reads the page
    assert colours[True] != (0, 255, 0)  # confined, it cannot
