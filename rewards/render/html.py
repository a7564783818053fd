"""HTML: model-written pages rendered to RGB by a warm headless Chromium, driven over the DevTools protocol on a pipe.

Imports only the standard library and its siblings at the top (the sandbox worker imports it without the `rewards`
package); Pillow (to decode the screenshot) is imported in `warm_up`. Chromium is `$MMRL_CHROMIUM` (the browser
binary itself; Debian's shell launcher `/usr/bin/chromium` is replaced by the binary it runs), else Debian's
`/usr/lib/chromium/chromium`, else `chromium` / `chromium-browser` / `google-chrome` on `PATH` (`make setup-browser`
installs it); `browser_path()` says which, `unavailable()` why there is none. This module drives the browser;
`rewards.render.chromium` starts it confined (layer 2 below).

The contract for the source: one HTML document with inline CSS, inline scripts and inline `data:` images and fonts.
It is shown in a `width` x `height` viewport at device scale 1, scroll bars hidden, on white; the image is what the
viewport shows once the load event has fired and `settle_frames` animation frames have been drawn. Nothing outside
the document is loaded: the page renders as if offline. Timers that fire later than that are not waited for (not
fast-forwarded in virtual time either: under it Chromium may never draw the frame a screenshot waits for). The same
page renders the same pixels on the same machine (tests/rewards/test_html.py checks it).

Why not the sandbox's render child
----------------------------------
The render child of `rewards.render.sandbox` forbids `execve`, threads and most of the file system, and Chromium
needs all three. So the `html` worker forks no child per render: it keeps one Chromium process tree warm (started
on its first request, restarted after any render it had to kill) and `serve`s each request itself, in a fresh browser
context (a new in-memory profile: no cookies, storage or cache shared with any earlier page; its own renderer
process), disposed of afterwards. A one-shot `chromium --headless --screenshot` per page costs a new browser each
time; `bench/html_render.py` measures both (BENCHMARKS.md, "HTML renders per second").

Layers, from the outside in
---------------------------
1. **The worker** (as for every kind, `rewards.render.pool`): a separate process with a stripped environment (no
   tokens or keys), in its own session, in a fresh network namespace (`unshare -n`: no interface but a loopback that
   is down) where that works; the caller kills the whole session if it stops answering. Chromium inherits the
   namespace. Chromium never talks to the caller: the worker validates what it sends, and only pixels go back.
2. **Chromium's process** is forked by the worker into its own session, as `nobody` when the worker is root, with
   `PR_SET_PDEATHSIG` (it dies with the worker, and exits when its DevTools pipe closes), under a Landlock ruleset
   (Linux >= 5.13) that lets it read only the system's libraries, `/usr/share` (fonts), the font configuration,
   `/proc`, `/sys` and `/dev`, write only beneath its profile (in the worker's scratch directory) and `/dev/shm`,
   execute only its own installation (and the ELF loader), (ABI >= 4) neither bind nor connect TCP, and (ABI >= 6)
   neither connect to abstract UNIX sockets nor signal processes outside the browser's own tree; then a
   seccomp filter (`rewards.render.seccomp_filter.BROWSER`, where the kernel has seccomp) that refuses UDP, raw and
   packet sockets, System V IPC, ptrace, namespaces and the like to the browser and every process it starts. A
   `file:` page or a compromised renderer cannot read the repository, data sets, `/tmp` or `/root`, and without the
   network namespace it still has no TCP and no UDP (WebRTC's STUN packets included). Whatever fails to go up fails
   the launch: the browser never runs unconfined (`rewards.render.chromium`).
3. **Chromium's flags** (`FLAGS`): `--proxy-server=127.0.0.1:9` with `--proxy-bypass-list=<-loopback>` (every
   http(s) request, loopback included, goes to a closed port), `--host-resolver-rules` mapping every name to
   NOTFOUND, `--disable-quic`, WebRTC restricted to proxied UDP (`--force-webrtc-ip-handling-policy`), no
   background networking, component updates, sync, extensions, crash reporter or
   first run; `--headless --disable-gpu --no-sandbox` (Chromium's own sandbox is off: see below); a V8 heap limit
   (`--js-flags=--max-old-space-size=256`: a JS heap bomb kills its renderer, not the machine); a fresh profile.
4. **The page** is not a file: it is served from `PAGE_URL` (an `http://*.invalid` address) by intercepting the
   request in the browser (the DevTools `Fetch` domain) and answering with the source and a Content-Security-Policy
   (`CSP`) that allows inline scripts and styles and `data:`/`blob:` images, fonts, media and frames only
   (`connect-src 'none'`, `form-action 'none'`, `base-uri 'none'`, no workers). Every other request of the page is
   failed in the browser before any network code sees it; an http page may not load `file:` URLs at all
   (Chromium's rule), so `file:` images, frames and fetches fail, from inside `data:` frames too. A main-frame
   navigation away from `PAGE_URL` (`location = ...`, a form post, a meta refresh) fails the render at once;
   popups are blocked (`--block-new-web-contents`) and would get no network anyway.
5. **Limits per render**: the source's size (`max_bytes`); the wall clock (`timeout`: an infinite loop never lets
   the page finish, so the whole browser process group is killed and restarted for the next render); memory (the
   worker watches the anonymous resident memory of Chromium's process group every 0.1 s and kills it past
   `memory_mb` above its idle level; the V8 heap limit ends JS bombs first); the DOM (`Memory.getDOMCounters` after
   the page settled: more than `max_nodes` nodes fails the render).

What it does not contain
------------------------
* Chromium's own sandbox (seccomp-bpf and namespaces per renderer) is off (`--no-sandbox`): it needs privileges or
  user namespaces that containers often lack. A renderer exploit runs with the browser's rights, i.e. those of
  layers 1-2 (no network, Landlock's file and TCP rules, `nobody`). Without Landlock (old kernels, some
  containers), the `file:` rule of layer 4 and the `nobody` user are what keep files out of reach, and without the
  network namespace (not root) Landlock's TCP rule, the seccomp filter's UDP rule, the flags and request
  interception are what keep the network out; without seccomp too, WebRTC's UDP rests on the flags alone.
* No CPU-time limit: RLIMIT_CPU would end the long-lived browser; the wall clock bounds each render, and a render
  may burn its CPU until then. No disk quota: the profile lives in scratch, removed with the worker.
* Pages render with the machine's fonts: pixel-stable on one machine, not necessarily across machines.
* Each render pays a new browser context and a new renderer process (BENCHMARKS.md, "HTML renders per second").
  Reusing one context for every page (a new tab each time) would cost less, but pages would then share cookies and
  storage, so it is not done.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import time
from dataclasses import dataclass
from typing import Any

from . import chromium, isolation, seccomp_filter

OPTIONS: dict[str, Any] = {"max_bytes": 500_000, "max_nodes": 20_000, "settle_frames": 2}
"""Defaults: the largest accepted source in bytes, the most DOM nodes a loaded page may hold, and the animation
frames the page is given after its load event before the capture."""

PAGE_URL = "http://page.mmrl-render.invalid/"
"""Where the page seems to come from (it is answered from memory; no request leaves the browser)."""

CSP = (
    "default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline' data:; "
    "img-src data: blob:; font-src data:; media-src data: blob:; frame-src data: blob:; connect-src 'none'; "
    "form-action 'none'; base-uri 'none'; worker-src 'none'; manifest-src 'none'; object-src 'none'"
)
"""The Content-Security-Policy the page is served with."""

LAUNCH_TIMEOUT = 8.0
"""Seconds Chromium may take to start; not counted in a render's timeout (the pool's grace period covers it)."""

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-breakpad",
    "--disable-crash-reporter",
    "--disable-quic",
    # WebRTC: no UDP that does not go through the proxy (the closed port above), so no host or STUN candidates;
    # the seccomp filter (layer 2) refuses the UDP sockets themselves.
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--enforce-webrtc-ip-permission-check",
    "--disable-features=Translate,MediaRouter,OptimizationHints,AutofillServerCommunication",
    "--metrics-recording-only",
    "--mute-audio",
    "--hide-scrollbars",
    "--force-color-profile=srgb",
    "--font-render-hinting=none",
    "--block-new-web-contents",
    "--proxy-server=127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost",
    "--js-flags=--max-old-space-size=256",
    "--remote-debugging-pipe",
)
"""Chromium's command-line flags besides `--user-data-dir` (see layer 3 in the module docstring)."""

_DEBIAN_BINARY = "/usr/lib/chromium/chromium"
_CANDIDATES = (_DEBIAN_BINARY, "chromium", "chromium-browser", "google-chrome")


class RenderRefused(ValueError):
    """The page was refused or did not render; the message is the reason reported to the caller."""


def browser_path() -> str | None:
    """The Chromium executable: `$MMRL_CHROMIUM`, else the first of the usual places that exists; None if none."""
    chosen = os.environ.get("MMRL_CHROMIUM")
    if chosen:
        if os.path.realpath(chosen) == "/usr/bin/chromium" and os.access(_DEBIAN_BINARY, os.X_OK):
            return _DEBIAN_BINARY  # Debian's shell launcher: the binary it runs (the confinement execs nothing else)
        return chosen if os.path.isfile(chosen) and os.access(chosen, os.X_OK) else None
    for name in _CANDIDATES:
        path = name if os.path.isabs(name) else shutil.which(name)
        if path and os.access(path, os.X_OK):
            return path
    return None


def unavailable() -> str | None:
    """Why html renders cannot run here (no Chromium), or None when they can."""
    if browser_path() is not None:
        return None
    where = os.environ.get("MMRL_CHROMIUM") or ", ".join(_CANDIDATES)
    return f"headless Chromium not found ({where}); install it with `make setup-browser` or set MMRL_CHROMIUM"


def check_options(options: dict[str, Any]) -> None:
    """Raises ValueError on an option value out of range (run in the caller, on the merged options)."""
    for name in ("max_bytes", "max_nodes", "settle_frames"):
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"html option {name} must be an int >= 0, got {value!r}")


def read_roots() -> list[str]:
    """Nothing beyond the Python installation: Chromium's own roots are its Landlock rules, not the render child's."""
    return []


def warm_up() -> None:
    """Imports what a render needs (Pillow decodes the screenshots); Chromium itself starts on the first request,
    when the scratch directory for its profile is known."""
    import io  # noqa: F401

    import PIL.Image  # noqa: F401
    import PIL.PngImagePlugin  # noqa: F401

    if browser_path() is None:
        raise RuntimeError("no Chromium found (set MMRL_CHROMIUM or run scripts/setup_browser.sh)")


def render(source: str, width: int, height: int, options: dict[str, Any]) -> bytes:
    """Not used: the worker calls `serve` (the browser must outlive one render, so there is no child to run it in)."""
    raise RenderRefused("html renders run in the worker's browser (serve), not in a render child")


# ======================================================================================================= the worker

_browser: _Browser | None = None


def serve(request: dict[str, Any], scratch: str, *, seccomp: bool = True) -> tuple[dict[str, Any], bytes]:
    """Renders one request on the worker's warm browser (started or restarted as needed); never raises.

    Args:
        request: the render request (`source`, `width`, `height`, `timeout`, `memory_mb`, `options`).
        scratch: the worker's scratch directory (Chromium's profile lives in it).
        seccomp: confine the browser with the seccomp filter (the worker says False where the kernel has none, or
            where a test turned it off).

    Returns:
        The reply header (`ok`, and `reason` when not ok) and the `height * width * 3` RGB bytes (or b"").
    """
    global _browser
    width, height = int(request["width"]), int(request["height"])
    options = {**OPTIONS, **request.get("options", {})}
    source = request["source"]
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > options["max_bytes"]:
        return {"ok": False, "reason": f"html refused: {size} bytes, more than {options['max_bytes']}"}, b""
    if _browser is None or not _browser.alive():
        if _browser is not None:
            _browser.kill()
        try:
            _browser = _Browser(scratch, int(request["memory_mb"]), seccomp=seccomp)
        except (OSError, RuntimeError, TimeoutError) as e:
            _browser = None
            return {"ok": False, "reason": f"chromium did not start: {e}"}, b""
    _browser.memory_limit = int(request["memory_mb"]) << 20
    deadline = time.monotonic() + float(request["timeout"])
    try:
        pixels = _browser.render(source, width, height, options, deadline)
    except RenderRefused as e:
        return {"ok": False, "reason": str(e)}, b""
    except _BrowserLost as e:  # hung, over its memory, crashed, or spoke nonsense: start afresh next time
        _browser.kill()
        _browser = None
        reason = str(e)
        if reason == "wall-clock timeout":
            reason = f"wall-clock timeout after {float(request['timeout']):g} s (the browser was killed)"
        return {"ok": False, "reason": reason}, b""
    return {"ok": True}, pixels


class _BrowserLost(Exception):
    """The browser must be killed (timeout, memory, crash, protocol error); the message is the render's reason."""


@dataclass
class _Page:
    """The page being rendered, as `_Browser.handle` needs it."""

    session: str  # its DevTools session
    frame: str  # its main frame's id (the target's)
    body: str  # the source, base64
    served: bool = False
    loaded: bool = False


class _Browser:
    """One Chromium process tree and its DevTools pipe, owned by the worker."""

    def __init__(self, scratch: str, memory_mb: int, *, seccomp: bool = True):
        binary = browser_path()
        if binary is None:
            raise RuntimeError("no Chromium found (set MMRL_CHROMIUM or run scripts/setup_browser.sh)")
        self.profile = os.path.join(scratch, f"chromium-{os.urandom(4).hex()}")
        os.mkdir(self.profile, 0o700)
        uid = gid = None
        if os.geteuid() == 0:
            uid, gid = isolation.nobody()
            for path in (scratch, self.profile):  # the worker's `confine.prepare` made scratch nobody's already
                os.chown(path, uid, gid)
        self.memory_limit = memory_mb << 20
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        self.landlock = isolation.landlock_abi(isolation.libc())
        rules = chromium.landlock_rules(binary, self.profile) if self.landlock > 0 else None
        self.seccomp = seccomp_filter.program(seccomp_filter.BROWSER, seccomp_filter.machine()) if seccomp else None
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": self.profile, "LANG": "C.UTF-8"}
        env.update(TMPDIR=self.profile, XDG_CONFIG_HOME=self.profile, XDG_CACHE_HOME=self.profile)
        cmd = [binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"]
        self.pid: int | None = None
        try:
            self.pid = chromium.spawn(
                cmd, env, self.profile, to_browser_r, from_browser_w, uid, gid, rules, self.landlock, self.seccomp
            )
        except BaseException:
            self.kill()
            raise
        finally:
            for fd in [to_browser_r, from_browser_w, *(fd for _, fd in rules or ())]:
                os.close(fd)
        self.buf = bytearray()
        self.next_id = 0
        self.page: _Page | None = None  # the page being rendered
        self.baseline = 0
        self.checked = 0.0  # when memory() last ran
        try:
            self.call("Target.setDiscoverTargets", {"discover": False}, deadline=time.monotonic() + LAUNCH_TIMEOUT)
        except _BrowserLost as e:
            self.kill()
            raise TimeoutError(f"no answer within {LAUNCH_TIMEOUT:g} s ({e})") from None
        self.baseline = self.memory()

    # -------------------------------------------------------------------------------------------- the protocol

    def alive(self) -> bool:
        if self.pid is None:
            return False
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            done = self.pid
        if done:
            self.pid = None
        return self.pid is not None

    def kill(self) -> None:
        """Kills the whole process group (browser, renderers, helpers) and removes the profile."""
        if self.pid is not None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = None
        for fd in (self.to_browser, self.from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.to_browser, view) :]
        except OSError as e:
            raise _BrowserLost(f"chromium went away ({e})") from None
        return self.next_id

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None, *, deadline: float
    ) -> dict[str, Any]:
        """Sends one command and waits for its answer (events that arrive meanwhile go to `handle`)."""
        want = self.send(method, params, session)
        while True:
            message = self.receive(deadline)
            if message.get("id") == want:
                if "error" in message:
                    raise RenderRefused(f"html render failed: {method}: {message['error'].get('message', '')}")
                return message.get("result", {})
            if "method" in message:
                self.handle(message)

    def handle(self, event: dict[str, Any]) -> None:
        """Answers what the current page asks of the browser: its document once, a failure for every other request;
        fails the render (raises) when the page navigates away or its renderer crashes."""
        page = self.page
        method, params = event.get("method"), event.get("params") or {}
        if page is None or event.get("sessionId") != page.session:
            return
        if method == "Fetch.requestPaused":
            request = params.get("request") or {}
            if not page.served and request.get("url") == PAGE_URL and params.get("resourceType") == "Document":
                page.served = True
                headers = [
                    {"name": "Content-Type", "value": "text/html; charset=utf-8"},
                    {"name": "Content-Security-Policy", "value": CSP},
                    {"name": "Cache-Control", "value": "no-store"},
                ]
                reply = {"requestId": params["requestId"], "responseCode": 200, "responseHeaders": headers}
                self.send("Fetch.fulfillRequest", {**reply, "body": page.body}, page.session)
            else:
                failed = {"requestId": params["requestId"], "errorReason": "BlockedByClient"}
                self.send("Fetch.failRequest", failed, page.session)
        elif method in ("Page.frameRequestedNavigation", "Page.frameStartedNavigating", "Page.frameNavigated"):
            frame = params.get("frame") or params
            if frame.get("frameId", frame.get("id")) == page.frame and frame.get("url") != PAGE_URL:
                # location = ..., a form post, a refresh: fail at once (the request itself was failed above)
                raise RenderRefused(f"html refused: the page navigated away (to {_quote(frame.get('url'))})")
        elif method == "Page.loadEventFired":
            page.loaded = True
        elif method == "Inspector.targetCrashed":
            raise _BrowserLost("the page crashed its renderer (out of memory?)")

    def receive(self, deadline: float) -> dict[str, Any]:
        """The next message from the browser; raises _BrowserLost past the deadline, at end of file, or on garbage."""
        while True:
            end = self.buf.find(b"\0")
            if end >= 0:
                raw = bytes(self.buf[:end])
                del self.buf[: end + 1]
                try:
                    message = json.loads(raw)
                except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                    raise _BrowserLost("chromium sent a malformed message") from None
                if not isinstance(message, dict):
                    raise _BrowserLost("chromium sent a malformed message")
                return message
            if len(self.buf) > _MAX_MESSAGE:
                raise _BrowserLost("chromium sent an oversized message")
            now = time.monotonic()
            if now >= deadline:
                raise _BrowserLost("wall-clock timeout")
            if self.baseline and now - self.checked >= _WATCH_EVERY:  # also while the browser keeps talking
                self.checked = now
                if self.memory() - self.baseline > self.memory_limit:
                    raise _BrowserLost(f"memory limit of {self.memory_limit >> 20} MB exceeded (chromium killed)")
            readable, _, _ = select.select([self.from_browser], [], [], min(deadline - now, _WATCH_EVERY))
            if readable:
                chunk = os.read(self.from_browser, 1 << 20)
                if not chunk:
                    raise _BrowserLost("chromium exited")
                self.buf += chunk

    def memory(self) -> int:
        """Anonymous resident memory of the browser's process group, in bytes (what a page's allocations grow)."""
        total = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if int(fields[2]) != self.pid:  # field 5, the process group
                    continue
                with open(f"/proc/{entry}/status", "rb") as f:
                    for line in f:
                        if line.startswith(b"RssAnon:"):
                            total += int(line.split()[1]) << 10
                            break
            except (OSError, ValueError, IndexError):
                continue
        return total

    # ---------------------------------------------------------------------------------------------- one render

    def render(self, source: str, width: int, height: int, options: dict[str, Any], deadline: float) -> bytes:
        """Loads the page in a fresh browser context, lets it settle, checks it and takes its screenshot."""
        context = self.call("Target.createBrowserContext", {"disposeOnDetach": True}, deadline=deadline)
        context_id = context["browserContextId"]
        try:
            pixels = self._render_in(context_id, source, width, height, options, deadline)
        except _BrowserLost:
            self.page = None
            raise  # the browser is killed, its contexts with it
        except BaseException:
            self.dispose(context_id)
            raise
        self.dispose(context_id)
        return pixels

    def dispose(self, context_id: str) -> None:
        """Drops a context (its pages, renderer, storage); a browser that cannot is killed (restarted next time)."""
        self.page = None
        try:
            self.call("Target.disposeBrowserContext", {"browserContextId": context_id}, deadline=time.monotonic() + 5)
        except (_BrowserLost, RenderRefused):
            self.kill()

    def _render_in(
        self, context_id: str, source: str, width: int, height: int, options: dict[str, Any], deadline: float
    ) -> bytes:
        import io

        from PIL import Image

        created = self.call(
            "Target.createTarget",
            {"url": "about:blank", "browserContextId": context_id},  # a small window would count as hidden: no frames
            deadline=deadline,
        )
        attached = self.call(
            "Target.attachToTarget", {"targetId": created["targetId"], "flatten": True}, deadline=deadline
        )
        session = attached["sessionId"]
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.call("Emulation.setDeviceMetricsOverride", metrics, session, deadline=deadline)
        self.call("Page.bringToFront", {}, session, deadline=deadline)  # a page in the background draws no frames
        self.call("Fetch.enable", {"patterns": [{"urlPattern": "*"}]}, session, deadline=deadline)
        self.call("Page.enable", {}, session, deadline=deadline)
        self.call("Inspector.enable", {}, session, deadline=deadline)  # for Inspector.targetCrashed
        self.page = _Page(
            session, created["targetId"], base64.b64encode(source.encode("utf-8", "surrogatepass")).decode()
        )
        navigation = self.send("Page.navigate", {"url": PAGE_URL}, session)  # answered once the page is served
        while not self.page.loaded:
            message = self.receive(deadline)
            if message.get("id") == navigation and "error" in message:
                raise RenderRefused(f"html render failed: {message['error'].get('message', '')}")
            if "method" in message:
                self.handle(message)
        # Two animation frames after the load event, awaited in a world of our own (the page's scripts cannot
        # replace its requestAnimationFrame): the page has been laid out and painted, and the capture has a frame.
        world = self.call("Page.createIsolatedWorld", {"frameId": self.page.frame}, session, deadline=deadline)
        settle = {
            "expression": _SETTLE.replace("FRAMES", str(int(options["settle_frames"]))),
            "contextId": world["executionContextId"],
            "awaitPromise": True,
        }
        self.call("Runtime.evaluate", settle, session, deadline=deadline)
        counters = self.call("Memory.getDOMCounters", {}, session, deadline=deadline)
        if int(counters.get("nodes", 0)) > options["max_nodes"]:
            raise RenderRefused(f"html refused: {counters['nodes']} DOM nodes, more than {options['max_nodes']}")
        shot = self.call(
            "Page.captureScreenshot",
            {"format": "png", "fromSurface": True, "captureBeyondViewport": False, "optimizeForSpeed": True},
            session,
            deadline=deadline,
        )
        try:
            png = base64.b64decode(shot["data"], validate=True)
            with Image.open(io.BytesIO(png)) as image:
                if image.format != "PNG" or image.size != (width, height):
                    raise _BrowserLost(f"chromium sent a {image.size} screenshot, not {width}x{height}")
                if image.mode in ("RGBA", "LA", "P"):
                    image = Image.alpha_composite(Image.new("RGBA", image.size, "white"), image.convert("RGBA"))
                return image.convert("RGB").tobytes()
        except (KeyError, ValueError, OSError, Image.DecompressionBombError) as e:
            raise _BrowserLost(f"chromium sent a bad screenshot ({type(e).__name__})") from None


def _quote(url: object) -> str:
    text = str(url)
    return repr(text if len(text) <= 60 else text[:57] + "...")


_SETTLE = (  # FRAMES animation frames, then resolve
    "new Promise(done => { let n = FRAMES; "
    "const tick = () => n-- > 0 ? requestAnimationFrame(tick) : done(); tick(); })"
)
_MAX_MESSAGE = 64 << 20  # the largest DevTools message taken (a 4096 x 4096 PNG screenshot in base64 fits)
_WATCH_EVERY = 0.1  # seconds between memory checks while waiting on the browser
