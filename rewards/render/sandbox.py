"""Sandboxed rendering of model-written code: warm worker processes, one fresh forked child per render.

Model-written SVG, chart code and CAD scripts are untrusted (docs: DESIGN.md, "Model-generated code is
untrusted"). This module renders them without letting them hang, exhaust, read, write or reach anything they should
not, and without ever raising into the caller: every failure is a `RenderResult` with `image=None` and a reason.

Processes
---------
::

    caller (trainer, `mmrl score`)      RenderPool: N workers, requests spread over them, parent-side timeouts
       |  stdin/stdout pipes, length-prefixed JSON frames + raw RGB bytes (never pickle: see below)
    worker ("zygote"), one per slot     `python -I sandbox.py`, under `unshare -n` when that works; imports the
       |                                renderer once (cairosvg, matplotlib + numpy, or build123d) and renders a
       |                                warm-up image
       |  fork() per render, result over a private pipe
    render child                        drops privileges, sets limits, confines itself, runs the untrusted input,
                                        writes one result, `_exit`s. The next render gets a fresh copy of the warm
                                        worker, so nothing one render does (monkeypatching, pyplot state, files,
                                        leaked threads) reaches another.

Layers, from the outside in (the child applies them in this order before it looks at the input):

1. **No network, no secrets**: the worker starts in a fresh network namespace (`unshare -n`: no interfaces but a
   loopback that is down), probed once per process. Without it (not root, no `unshare`), Landlock's TCP rule
   (ABI >= 4) and the audit hook still refuse connections, but UDP then rests on the audit hook alone. The worker's
   environment keeps only `PATH`, `HOME`, `LANG`/`LC_ALL` and cache/font settings: no tokens or keys.
2. **Own user**: as root, the child switches to `nobody` (keeping only CAP_DAC_READ_SEARCH, so that it can still
   read a Python installed under `/root`); it can then neither signal nor trace the caller or the worker, and
   RLIMIT_NPROC (root is exempt from it) applies. As a normal user, it stays that user.
3. **Limits** (`resource.setrlimit`): RLIMIT_CPU (the kernel sends SIGXCPU, then SIGKILL one second later),
   RLIMIT_AS (the memory budget on top of the worker's own address space: big allocations fail with MemoryError),
   RLIMIT_NPROC = 0 (no fork, no threads), RLIMIT_FSIZE (largest file it may write), RLIMIT_NOFILE, RLIMIT_CORE = 0.
   The worker also kills the child at the wall-clock timeout, and the caller kills and restarts a worker that
   does not answer within the timeout plus a grace period.
4. **Landlock** (Linux >= 5.13, kernel-enforced, not reversible by the process): reads only beneath the Python
   installation (stdlib, site-packages), the renderer's data (matplotlib's fonts), `/usr/lib*`, `/lib*`,
   `/usr/share`, the font configuration; reads and writes only beneath its scratch directory; no `execve` at all;
   no TCP bind/connect (ABI >= 4); no signals to, or abstract-socket connections with, processes outside the
   sandbox (ABI >= 6). The scratch directory is the child's cwd and `tempfile` directory and is emptied after
   every render.
5. **Audit hook** (`sys.addaudithook`, PEP 578), installed last, so it only sees the untrusted part: refuses
   `open` outside the allowed roots (and any write outside scratch), `os.system`, `os.exec*`, `os.fork`,
   `os.posix_spawn`, `subprocess.Popen`, socket creation, `ctypes`, `os.kill`, `os.chdir`, links, and importing
   a denylist of modules (ctypes, cffi, multiprocessing, cv2, ...). A refusal ends the render at once with the
   reason, so a `try/except` in the untrusted code cannot swallow it.
6. **Input checks** (SVG, in `svg.py`): size cap, no DOCTYPE/ENTITY (so no entity expansion or XXE), caps on
   element count, nesting depth and width/height, and no references but `#fragment`s and inline PNG/JPEG
   `data:` images; cairosvg runs with `unsafe=False` and a url_fetcher that refuses everything else.

What it cannot do
-----------------
* Audit hooks are not a security boundary on their own: code can reach already-imported modules through
  `sys.modules`, call C functions that raise no audit event (`_posixsubprocess.fork_exec`, `posix.write` to an
  inherited fd), or open files from C. Layers 1-4 are what hold then: fork fails on RLIMIT_NPROC, exec and
  out-of-scope reads and writes fail in Landlock, the network does not exist. Without Landlock (kernel < 5.13,
  some containers) file confinement rests on the audit hook alone; `RenderPool.isolation` says which layers are
  up.
* A render can forge its own result (it is its own process) but nothing else: the worker validates what the child
  sends, and the caller validates what the worker sends; neither side unpickles anything (a pickle from a
  compromised process would run code in the reader).
* Everything readable beneath the allowed roots is readable (e.g. other packages' data in site-packages). Keep data
  sets and targets outside the Python installation (the repository itself is not an allowed root).
* Disk use is bounded per file (RLIMIT_FSIZE) and by the CPU time, not by a quota; the scratch directory is emptied
  after each render.
* Children of concurrent renders run as the same `nobody` user; Landlock scoping (ABI >= 6) and the audit hook keep
  them from signalling each other.
* Denial of service within the limits is possible by design: a render may burn its whole CPU and memory budget.
* Threads are refused too (RLIMIT_NPROC counts them), so chart code that needs a thread pool fails.
* Cost: the fork, the confinement and the copy-on-write faults of a fresh child add about 4-6 ms to each render
  (measured on a trivial SVG: 7 ms per render through the pool against 3 ms in-process), small next to the
  30-40 ms of a 150-element SVG at 256 px.

Recovery: a worker that dies while a render is in flight (killed from outside: renders themselves run in children)
gets the request once more on a fresh worker; one that stops answering for the timeout plus `GRACE` is killed and
restarted and the render fails with the reason. A worker that cannot start makes the renders fail with its reason
(e.g. cairosvg not installed) rather than hang. A renderer is a module next to this one (`svg.py`, `chart.py`,
`cad.py`) with `OPTIONS`, `warm_up`, `read_roots` and `render`, and optionally `check_options` (run in the caller on
the merged options of each batch, so a bad option value raises there instead of failing every render).

This file is also the worker's program: the worker runs it by path (`python -I`), so it imports only the standard
library at the top, and loads `svg.py`, `chart.py` or `cad.py` next to it by path, without importing the `rewards`
package (and torch).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

KINDS = ("svg", "chart", "cad")
"""Renderers this sandbox runs: `svg` (cairosvg), `chart` (matplotlib code) and `cad` (build123d scripts)."""

MAX_SOURCE_BYTES = 1 << 20
"""Inputs larger than this (UTF-8) are refused in the caller, before any worker sees them."""

MAX_SIDE = 4096
"""Largest output width or height, in pixels."""

START_TIMEOUT = 120.0
"""Seconds a worker may take to start (imports and warm-up render; slow on a loaded machine)."""

GRACE = 10.0
"""Seconds past a render's timeout after which the caller gives up on the worker itself and restarts it."""

_FRAME = struct.Struct(">I")
_MAX_HEADER = 1 << 16
_MAX_REASON = 300
_VIOLATION_EXIT = 3
_NOBODY = 65534

# Landlock (linux/landlock.h). The three syscalls have the same numbers on every architecture.
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 14, 1 << 15
_FS_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_PR_SET_KEEPCAPS, _PR_SET_NO_NEW_PRIVS = 8, 38
_CAP_DAC_READ_SEARCH = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# Read-only roots besides the Python installation and the renderer's own: shared libraries (a lazily imported
# extension module may need one), fonts and their configuration. Nothing that holds user data.
_SYSTEM_READ_ROOTS = (
    "/usr/lib",
    "/usr/lib64",
    "/usr/lib32",
    "/lib",
    "/lib64",
    "/usr/share",
    "/usr/local/share/fonts",
    "/etc/ld.so.cache",
    "/etc/fonts",
    "/var/cache/fontconfig",
)

# Environment variables the worker inherits; everything else (tokens, keys, proxies) stays behind.
_ENV_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "XDG_CACHE_HOME", "MPLCONFIGDIR", "FONTCONFIG_PATH", "FONTCONFIG_FILE")

# Audit events refused outright, by exact name or by prefix.
_DENY_EVENTS = frozenset(
    {
        "os.system",
        "os.fork",
        "os.forkpty",
        "os.kill",
        "os.killpg",
        "os.chdir",
        "os.fchdir",
        "os.chroot",
        "os.symlink",
        "os.link",
        "os.mknod",
        "os.mkfifo",
        "os.startfile",
        "pty.spawn",
        "signal.pthread_kill",
        "sys.addaudithook",
        "shutil.make_archive",
        "shutil.unpack_archive",
        "webbrowser.open",
    }
)
_DENY_PREFIXES = (
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "subprocess.",
    "socket.",
    "ctypes.",
    "resource.",
    "urllib.",
    "http.",
    "ftplib.",
    "smtplib.",
    "poplib.",
    "imaplib.",
    "nntplib.",
    "telnetlib.",
    "_winapi.",
    "winreg.",
    "msvcrt.",
)
# Modules untrusted code may not import (already-imported ones raise no import event: see "What it cannot do").
_DENY_IMPORTS = frozenset(
    {
        "ctypes",
        "_ctypes",
        "cffi",
        "_cffi_backend",
        "multiprocessing",
        "_multiprocessing",
        "subprocess",
        "_posixsubprocess",
        "pty",
        "socket",
        "_socket",
        "ssl",
        "_ssl",
        "resource",
        "cv2",
        "requests",
        "urllib3",
        "httpx",
        "aiohttp",
        "paramiko",
        "webbrowser",
    }
)
# Path-taking events: which arguments are paths, and whether the event reads or writes them.
_WRITE_PATH_ARGS = {
    "os.mkdir": (0,),
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.rename": (0, 1),
    "os.replace": (0, 1),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.chflags": (0,),
    "os.lchflags": (0,),
    "os.utime": (0,),
    "os.truncate": (0,),
    "os.setxattr": (0,),
    "os.removexattr": (0,),
    "shutil.copyfile": (1,),
    "shutil.copymode": (1,),
    "shutil.copystat": (1,),
    "shutil.copytree": (1,),
    "shutil.rmtree": (0,),
    "shutil.move": (0, 1),
}
_READ_PATH_ARGS = {
    "os.listdir": (0,),
    "os.scandir": (0,),
    "os.listxattr": (0,),
    "os.getxattr": (0,),
    "glob.glob": (0,),
    "glob.glob/2": (0,),
    "shutil.copyfile": (0,),
    "shutil.copytree": (0,),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


# ===================================================================================================== CALLER SIDE


@dataclass(frozen=True)
class RenderResult:
    """One render: the image, or None and the reason.

    Attributes:
        image: `[H, W, 3]` uint8 RGB (transparent areas composited on white), or None if the render failed.
        reason: why `image` is None; "" on success.
        seconds: wall-clock seconds from sending the request to receiving the answer (0.0 for inputs refused
            before any worker saw them).
    """

    image: torch.Tensor | None
    reason: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.image is not None


def as_size(size: int | tuple[int, int] | Sequence[int]) -> tuple[int, int]:
    """`256` -> `(256, 256)`; `(W, H)` -> `(W, H)`, each in `[1, MAX_SIDE]`."""
    if isinstance(size, int):
        width = height = size
    else:
        width, height = (int(v) for v in size)
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise ValueError(f"render size must be in [1, {MAX_SIDE}] per side, got {(width, height)}")
    return width, height


def network_namespace_available() -> bool:
    """Whether `unshare -n` can start a process in a fresh network namespace here (needs root or CAP_SYS_ADMIN)."""
    global _NETNS
    if _NETNS is None:
        unshare = shutil.which("unshare")
        try:
            ok = (
                unshare is not None
                and subprocess.run([unshare, "-n", "true"], capture_output=True, timeout=20).returncode == 0
            )
        except (OSError, subprocess.SubprocessError):
            ok = False
        _NETNS = ok
    return _NETNS


_NETNS: bool | None = None


class _Worker:
    """One warm worker process as the caller sees it: a pipe pair, a read buffer and a state."""

    def __init__(self, kind: str, *, network_namespace: bool, audit_hook: bool):
        self.kind = kind
        self.network_namespace = network_namespace
        self.audit_hook = audit_hook
        self.proc: subprocess.Popen | None = None
        self.buf = bytearray()
        self.state = "down"  # down -> starting -> idle <-> busy; any -> down on death or kill
        self.deadline = 0.0
        self.job: tuple[int, str, float] | None = None  # (index in the batch, request id, send time)
        self.info: dict[str, Any] = {}
        self.scratch: str | None = None  # the worker's scratch directory, made and removed here
        self.last_error = ""

    def start(self) -> None:
        # The caller makes the scratch directory, so it can remove it whatever becomes of the worker.
        self.scratch = tempfile.mkdtemp(prefix=f"mmrl-render-{self.kind}-")
        config = json.dumps({"kind": self.kind, "audit_hook": self.audit_hook, "scratch": self.scratch})
        cmd = [sys.executable, "-I", str(Path(__file__).resolve()), config]
        if self.network_namespace:
            cmd = [shutil.which("unshare") or "unshare", "-n", *cmd]
        env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
        env.update(MPLBACKEND="Agg", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        env.setdefault("PATH", os.defpath)
        env.setdefault("LANG", "C.UTF-8")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True, close_fds=True
        )
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.buf.clear()
        self.state = "starting"
        self.deadline = time.monotonic() + START_TIMEOUT
        self.job = None

    def fileno(self) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout.fileno()

    def send(self, request: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        body = json.dumps(request).encode()
        self.proc.stdin.write(_FRAME.pack(len(body)) + body)
        self.proc.stdin.flush()

    def read(self) -> bool:
        """Reads what the pipe has; False at end of file (the worker is gone)."""
        while True:
            try:
                chunk = os.read(self.fileno(), 1 << 20)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            self.buf += chunk

    def frame(self, max_payload: int) -> tuple[dict[str, Any], bytes] | None:
        """Takes one complete frame off the buffer; raises ValueError on a malformed one."""
        return _take_frame(self.buf, max_payload)

    def kill(self, why: str = "") -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the worker and its render child (same process group)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()
                except (OSError, ValueError):
                    pass
        self.proc = None
        self.state = "down"
        self.job = None
        if self.scratch is not None:  # a killed worker cannot clean up after itself
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
        if why:
            self.last_error = why

    def stop(self) -> None:
        """Asks the worker to exit (end of file on its input), then makes sure it has."""
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=2)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self.kill()


class RenderPool:
    """A small pool of warm sandbox workers for one kind of input.

    >>> with RenderPool("svg", workers=2) as pool:  # doctest: +SKIP
    ...     results = pool.render_batch(['<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"/>'], 64)
    >>> results[0].image.shape  # doctest: +SKIP
    torch.Size([64, 64, 3])

    Workers start on first use (about a second each; imports and a warm-up render) and stay warm. A worker that
    dies or stops answering is killed and restarted; the render it held fails with the reason. Calls are
    serialised by a lock, so one pool may be shared between threads.

    Args:
        kind: one of `KINDS`.
        workers: number of worker processes (renders run in parallel across them).
        network_namespace: start workers under `unshare -n`; None probes whether that works here.
        audit_hook: install the audit-hook layer in render children. Turn it off only to test that the
            kernel-enforced layers hold on their own.
    """

    def __init__(self, kind: str, workers: int = 2, *, network_namespace: bool | None = None, audit_hook: bool = True):
        if kind not in KINDS:
            raise ValueError(f"unknown render kind {kind!r}; valid: {', '.join(KINDS)}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if network_namespace is None:
            network_namespace = network_namespace_available()
        self.kind = kind
        self.options, self._check_options = _renderer_options(kind)
        self._workers = [
            _Worker(kind, network_namespace=network_namespace, audit_hook=audit_hook) for _ in range(workers)
        ]
        self._lock = threading.Lock()
        self._closed = False
        self._start_failures = 0

    @property
    def isolation(self) -> dict[str, Any]:
        """Which sandbox layers the workers report (empty until a worker has started)."""
        info = next((w.info for w in self._workers if w.info), {})
        return {"network_namespace": self._workers[0].network_namespace, **info}

    def render_batch(
        self,
        sources: Sequence[str],
        size: int | tuple[int, int] = 256,
        *,
        timeout: float = 10.0,
        memory_mb: int = 1024,
        file_mb: int = 16,
        **options: Any,
    ) -> list[RenderResult]:
        """Renders every source; never raises for a bad source.

        Args:
            sources: R sources (SVG text, Python code that leaves a matplotlib figure open, or a build123d
                script).
            size: output `(W, H)` in pixels, or one int for a square.
            timeout: wall-clock seconds per render; the CPU-time limit is the same number of seconds, rounded up.
            memory_mb: address space a render may add to the warm worker's own.
            file_mb: largest file a render may write in its scratch directory.
            **options: renderer options (`svg.OPTIONS` / `chart.OPTIONS` / `cad.OPTIONS`, e.g. `max_elements` for
                SVG, `views` for CAD).

        Returns:
            R results, in the order of `sources`.

        Raises:
            TypeError: an unknown option (the message names the valid ones).
            ValueError: a bad size, timeout or option value.
        """
        width, height = as_size(size)
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise TypeError(f"unknown {self.kind} render options {unknown}; valid: {sorted(self.options)}")
        if not timeout > 0 or not math.isfinite(timeout):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        if self._check_options is not None:
            self._check_options({**self.options, **options})
        base = {
            "width": width,
            "height": height,
            "timeout": float(timeout),
            "cpu_seconds": max(1, math.ceil(timeout)),
            "memory_mb": int(memory_mb),
            "file_mb": int(file_mb),
            "options": {**self.options, **options},
        }
        with self._lock:
            if self._closed:
                raise RuntimeError("this RenderPool is closed")
            return self._run(list(sources), base, width * height * 3)

    def _run(self, sources: list[Any], base: dict[str, Any], nbytes: int) -> list[RenderResult]:
        results: list[RenderResult | None] = [None] * len(sources)
        queue: deque[int] = deque()
        for i, source in enumerate(sources):
            if not isinstance(source, str):
                results[i] = RenderResult(None, f"source is {type(source).__name__}, not str", 0.0)
            elif len(source) > MAX_SOURCE_BYTES or len(source.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES:
                results[i] = RenderResult(None, f"source is larger than {MAX_SOURCE_BYTES} bytes", 0.0)
            else:
                queue.append(i)
        self._start_failures = 0
        retried: dict[int, int] = {}
        while queue or any(w.state == "busy" for w in self._workers):
            for w in self._workers:
                if w.state == "down" and queue and self._start_failures < 2 * len(self._workers):
                    try:
                        w.start()
                    except OSError as e:
                        w.kill(f"could not start a {self.kind} worker: {e}")
                        self._start_failures += 1
                while w.state == "idle" and queue:
                    i = queue.popleft()
                    request_id = os.urandom(8).hex()
                    try:
                        w.send({**base, "id": request_id, "source": sources[i]})
                    except (OSError, ValueError) as e:
                        w.kill(f"worker pipe broke: {e}")
                        queue.appendleft(i)  # the request never reached a worker; give it to the next one
                        self._start_failures += 1
                        break
                    w.state = "busy"
                    w.job = (i, request_id, time.monotonic())
                    w.deadline = w.job[2] + base["timeout"] + GRACE
            active = [w for w in self._workers if w.state in ("starting", "busy")]
            if not active:
                reason = next((w.last_error for w in self._workers if w.last_error), "no worker could start")
                for i in queue:
                    results[i] = RenderResult(None, f"{self.kind} renderer unavailable: {reason}", 0.0)
                break
            wait = max(0.0, min(w.deadline for w in active) - time.monotonic())
            readable, _, _ = select.select(active, [], [], wait)
            for w in readable:
                if w.proc is None:
                    continue
                alive = w.read()
                try:
                    while w.proc is not None and (frame := w.frame(nbytes)) is not None:
                        self._accept(w, frame, results, base, nbytes)
                except ValueError as e:
                    self._fail(w, results, f"worker sent a malformed answer ({e}); restarted")
                    continue
                if not alive and w.proc is not None:
                    code = w.proc.wait()
                    if w.state == "starting":
                        self._start_failures += 1
                        w.kill(f"worker exited during start-up (exit status {code})")
                    elif w.job is not None and retried.get(w.job[0], 0) == 0:
                        # Renders run in forked children, so a worker's own death is not the input's doing (it was
                        # killed from outside, say): give the request one more try on a fresh worker.
                        retried[w.job[0]] = 1
                        queue.appendleft(w.job[0])
                        w.kill(f"worker died (exit status {code})")
                    else:
                        self._fail(w, results, f"worker died (exit status {code}); restarted")
            now = time.monotonic()
            for w in active:
                if w.proc is None or now <= w.deadline:
                    continue
                if w.state == "starting":
                    self._start_failures += 1
                    w.kill(f"worker did not start within {START_TIMEOUT:g} s")
                elif w.state == "busy":
                    self._fail(w, results, f"worker did not answer within {base['timeout'] + GRACE:g} s; restarted")
        return [r if r is not None else RenderResult(None, "not rendered", 0.0) for r in results]

    def _accept(
        self,
        w: _Worker,
        frame: tuple[dict[str, Any], bytes],
        results: list[RenderResult | None],
        base: dict[str, Any],
        nbytes: int,
    ) -> None:
        header, payload = frame
        if w.state == "starting":
            if header.get("ready") is True:
                w.state = "idle"
                w.info = {k: header.get(k) for k in ("landlock_abi", "user", "pid")}
                w.last_error = ""
            else:
                self._start_failures += 1
                w.kill(_clean_reason(header.get("fatal", "worker failed to start")))
            return
        if w.job is None or header.get("id") != w.job[1]:
            raise ValueError("answer to a request that is not in flight")
        i, _, sent = w.job
        seconds = time.monotonic() - sent
        if header.get("ok") is True:
            if len(payload) != nbytes:
                raise ValueError(f"image of {len(payload)} bytes, expected {nbytes}")
            import torch  # the caller side has torch; the worker side never imports this branch

            image = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(base["height"], base["width"], 3)
            results[i] = RenderResult(image, "", seconds)
        else:
            results[i] = RenderResult(None, _clean_reason(header.get("reason", "render failed")), seconds)
        w.state = "idle"
        w.job = None

    def _fail(self, w: _Worker, results: list[RenderResult | None], reason: str) -> None:
        if w.job is not None:
            i, _, sent = w.job
            results[i] = RenderResult(None, reason, time.monotonic() - sent)
        w.kill(reason)

    def close(self) -> None:
        """Stops the workers. A closed pool refuses further renders."""
        with self._lock:
            self._closed = True
            for w in self._workers:
                w.stop()

    def __enter__(self) -> RenderPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            for w in self._workers:
                w.kill()
        except Exception:  # interpreter shutdown: modules may be gone already
            pass


_POOLS: dict[str, RenderPool] = {}
_POOLS_LOCK = threading.Lock()
DEFAULT_WORKERS = 2


def default_pool(kind: str) -> RenderPool:
    """The process-wide pool for `kind` (`DEFAULT_WORKERS` workers), created on first use, closed at exit."""
    with _POOLS_LOCK:
        pool = _POOLS.get(kind)
        if pool is None or pool._closed:
            pool = _POOLS[kind] = RenderPool(kind, DEFAULT_WORKERS)
        return pool


def shutdown_pools() -> None:
    """Stops the process-wide pools' workers (they restart on the next render)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()


atexit.register(shutdown_pools)


def _renderer_options(kind: str) -> tuple[dict[str, Any], Any]:
    """The renderer's default options and its `check_options` (None if it has none), for the caller side."""
    if __package__:  # imported as rewards.render.sandbox: import the sibling module the normal way
        import importlib

        module = importlib.import_module(f"{__package__}.{kind}")
    else:
        module = _load_renderer(kind)
    return dict(module.OPTIONS), getattr(module, "check_options", None)


# ======================================================================================================== FRAMING


def _take_frame(buf: bytearray, max_payload: int) -> tuple[dict[str, Any], bytes] | None:
    """Removes and returns one `[length][JSON header][payload]` frame from `buf`, or None if it is incomplete.

    The header's `nbytes` gives the payload length. Raises ValueError on anything malformed or oversized, so a
    reader never waits for, or allocates, more than `max_payload` plus a small header.
    """
    if len(buf) < _FRAME.size:
        return None
    (length,) = _FRAME.unpack_from(buf)
    if length > _MAX_HEADER:
        raise ValueError(f"header of {length} bytes")
    if len(buf) < _FRAME.size + length:
        return None
    try:
        header = json.loads(bytes(buf[_FRAME.size : _FRAME.size + length]))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:  # deep nesting: RecursionError
        raise ValueError("header is not JSON") from e
    if not isinstance(header, dict):
        raise ValueError("header is not an object")
    nbytes = header.get("nbytes", 0)
    if type(nbytes) is not int or not 0 <= nbytes <= max_payload:
        raise ValueError(f"payload size {nbytes!r}")
    end = _FRAME.size + length + nbytes
    if len(buf) < end:
        return None
    payload = bytes(buf[_FRAME.size + length : end])
    del buf[:end]
    return header, payload


def _frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    body = json.dumps({**header, "nbytes": len(payload)}).encode()
    return _FRAME.pack(len(body)) + body + payload


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _clean_reason(reason: object) -> str:
    text = str(reason)
    text = "".join(c if c.isprintable() else " " for c in text)
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


# ===================================================================================================== WORKER SIDE


def _load_renderer(kind: str):
    """Loads `svg.py`, `chart.py` or `cad.py` from this directory by path (no `rewards` package, so no torch)."""
    import importlib.util

    if kind not in KINDS:
        raise ValueError(f"unknown render kind {kind!r}")
    name = f"_mmrl_render_{kind}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{kind}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class _Context:
    """What the worker prepares once for every render child."""

    renderer: Any
    scratch: str
    read_roots: list[str]
    landlock_abi: int
    uid: int | None  # switch to this user in the child (None: stay)
    gid: int | None
    audit_hook: bool
    libc: Any


def _worker_main(argv: list[str]) -> int:
    config = json.loads(argv[0])
    proto_in, proto_out = os.dup(0), os.dup(1)
    # The protocol gets private descriptors; stray prints of the worker go to stderr, stdin reads /dev/null.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    try:
        ctx = _prepare(config)
    except BaseException as e:  # report why, so the caller can say it rather than "worker died"
        _write_all(proto_out, _frame({"fatal": _clean_reason(f"{type(e).__name__}: {e}")}))
        return 1
    ready = {
        "ready": True,
        "landlock_abi": ctx.landlock_abi,
        "user": ctx.uid,
        "pid": os.getpid(),
    }
    _write_all(proto_out, _frame(ready))
    while True:
        head = _read_exact(proto_in, _FRAME.size)
        if head is None:  # the caller closed the pipe (or died): clean up and leave quietly
            shutil.rmtree(ctx.scratch, ignore_errors=True)
            return 0
        (length,) = _FRAME.unpack(head)
        body = _read_exact(proto_in, length)
        if body is None:
            return 0
        request = json.loads(body)
        try:
            header, payload = _serve(ctx, request)
        except Exception as e:  # a bug here must cost one render, not the warm worker
            header, payload = {"ok": False, "reason": _clean_reason(f"worker error: {type(e).__name__}: {e}")}, b""
        _write_all(proto_out, _frame({**header, "id": request.get("id")}, payload))


def _prepare(config: dict[str, Any]) -> _Context:
    import ctypes
    import sysconfig

    renderer = _load_renderer(config["kind"])
    renderer.warm_up()  # imports, font caches, lazy submodules: paid once here rather than in every child
    libc = ctypes.CDLL(None, use_errno=True)
    uid = gid = None
    if os.geteuid() == 0 and sys.platform == "linux":  # switching users keeps a capability: Linux only
        import pwd

        try:
            entry = pwd.getpwnam("nobody")
            uid, gid = entry.pw_uid, entry.pw_gid
        except KeyError:
            uid = gid = _NOBODY
    scratch = os.path.realpath(config["scratch"])
    if not os.path.isdir(scratch) or os.listdir(scratch):
        raise ValueError(f"scratch directory {scratch!r} is not an empty directory")
    os.chmod(scratch, 0o700)
    if uid is not None:
        os.chown(scratch, uid, gid)
    roots = {sys.prefix, sys.exec_prefix}
    for paths in (
        sysconfig.get_paths(),
        sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix}),
    ):
        roots.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    roots.update(_SYSTEM_READ_ROOTS)
    roots.update(renderer.read_roots())
    read_roots = sorted(os.path.realpath(r) for r in roots if r and os.path.exists(r))
    abi = 0
    if sys.platform == "linux":  # the syscall numbers mean something else elsewhere
        abi = libc.syscall(
            ctypes.c_long(_LANDLOCK_CREATE_RULESET),
            None,
            ctypes.c_size_t(0),
            ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION),
        )
    import gc

    gc.collect()
    gc.freeze()  # the warm heap stays out of the children's collections: fewer copy-on-write page faults per render
    return _Context(
        renderer, scratch, read_roots, max(int(abi), 0), uid, gid, bool(config.get("audit_hook", True)), libc
    )


def _serve(ctx: _Context, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """Renders one request in a forked child, under a wall-clock timeout; returns the reply header and pixels."""
    width, height, timeout = int(request["width"]), int(request["height"]), float(request["timeout"])
    nbytes = width * height * 3
    read_fd, write_fd = os.pipe()
    start = time.monotonic()
    try:
        pid = os.fork()
    except OSError as e:
        os.close(read_fd)
        os.close(write_fd)
        return {"ok": False, "reason": f"could not fork a render process: {e}"}, b""
    if pid == 0:  # ------------------------------------------------------------ the render child; never returns
        os.close(read_fd)
        _child(ctx, request, write_fd)
    os.close(write_fd)
    # Wait for both the end of the result pipe and the child's exit, under the deadline: a child that closes its
    # pipe and then sleeps must not hold the worker (it burns no CPU, so RLIMIT_CPU would never end it).
    pidfd = _pidfd_open(pid)
    data = bytearray()
    timed_out = overflow = eof = False
    status: int | None = None
    while not eof or status is None:
        remaining = start + timeout - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        watch = ([] if eof else [read_fd]) + ([pidfd] if pidfd is not None and status is None else [])
        readable, _, _ = select.select(watch, [], [], remaining if watch else min(remaining, 0.002))
        if read_fd in readable:
            chunk = os.read(read_fd, 1 << 20)
            eof = not chunk
            data += chunk
            if len(data) > _FRAME.size + _MAX_HEADER + nbytes:
                overflow = True
                break
        if status is None and (pidfd is None or pidfd in readable):
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                status = wait_status
    if status is None:  # timed out, overflowed: end it
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
    os.close(read_fd)
    if pidfd is not None:
        os.close(pidfd)
    _empty(ctx.scratch)
    if timed_out:
        return {"ok": False, "reason": f"wall-clock timeout after {timeout:g} s"}, b""
    if overflow:
        return {"ok": False, "reason": "render process sent more than an image"}, b""
    try:
        frame = _take_frame(data, nbytes)
    except ValueError as e:
        frame = None
        bad = str(e)
    else:
        bad = ""
    if frame is not None:
        header, payload = frame
        if header.get("ok") is True and len(payload) == nbytes:
            return {"ok": True}, payload
        if header.get("ok") is False:
            return {"ok": False, "reason": _clean_reason(header.get("reason", "render failed"))}, b""
        bad = "inconsistent result"
    return {"ok": False, "reason": _exit_reason(status, request, bad)}, b""


def _pidfd_open(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits (Linux >= 5.3), or None (then the worker polls)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _exit_reason(status: int, request: dict[str, Any], bad: str) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return f"cpu time limit of {request['cpu_seconds']} s exceeded"
        if sig == signal.SIGKILL:
            return f"render process killed (SIGKILL; cpu or memory limit of {request['memory_mb']} MB?)"
        if sig == signal.SIGXFSZ:
            return f"file size limit of {request['file_mb']} MB exceeded"
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return f"render process crashed ({name}; memory limit of {request['memory_mb']} MB?)"
    code = os.WEXITSTATUS(status)
    if bad:
        return f"render process sent a malformed result ({bad}; exit status {code})"
    if code == _VIOLATION_EXIT:
        return "sandbox refused an operation"
    return f"render process exited with status {code} without a result"


def _empty(directory: str) -> None:
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass


def _child(ctx: _Context, request: dict[str, Any], write_fd: int) -> None:
    """The render child: confine, render, send one frame, exit. Never returns."""
    code = 70
    try:
        os.dup2(write_fd, 3)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the untrusted code's prints go nowhere
            os.dup2(devnull, fd)
        os.closerange(4, 1 << 16)  # the protocol pipes, the spare /dev/null: only 0-3 stay open
        os.chdir(ctx.scratch)
        tempfile.tempdir = ctx.scratch
        sys.dont_write_bytecode = True  # a lazy import must not try to write .pyc files next to the source
        base = _address_space()  # 0 where /proc is missing: then no RLIMIT_AS (macOS does not enforce it anyway)
        memory_limit = base + int(request["memory_mb"]) * (1 << 20) if base else 0
        ruleset = _landlock_ruleset(ctx) if ctx.landlock_abi > 0 else -1
        _drop_privileges(ctx)
        _set_limits(request, memory_limit)
        if ruleset >= 0:
            if ctx.libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
            if ctx.libc.syscall(_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
                raise OSError(ctypes_errno(), "landlock_restrict_self failed")
            os.close(ruleset)
        if ctx.audit_hook:
            _install_audit_hook(ctx.scratch, ctx.read_roots)
    except BaseException as e:  # fail closed: no confinement, no render
        _send(3, {"ok": False, "reason": f"sandbox setup failed: {type(e).__name__}: {e}"})
        os._exit(code)
    refused = getattr(ctx.renderer, "RenderRefused", ())
    try:
        width, height = int(request["width"]), int(request["height"])
        pixels = ctx.renderer.render(request["source"], width, height, request["options"])
        if not isinstance(pixels, bytes | bytearray) or len(pixels) != width * height * 3:
            raise RuntimeError("renderer returned a wrong-sized image")
        _send(3, {"ok": True}, bytes(pixels))
        code = 0
    except MemoryError:
        _send(3, {"ok": False, "reason": f"memory limit of {request['memory_mb']} MB exceeded (MemoryError)"})
    except refused as e:
        _send(3, {"ok": False, "reason": str(e)})
    except RecursionError:
        _send(3, {"ok": False, "reason": "RecursionError: maximum recursion depth exceeded"})
    except BaseException as e:  # SyntaxError, NameError, SystemExit, ... in the untrusted code: all are its failure
        _send(3, {"ok": False, "reason": f"{type(e).__name__}: {e}"})
    finally:
        os._exit(code)


def ctypes_errno() -> int:
    import ctypes

    return ctypes.get_errno()


def _send(fd: int, header: dict[str, Any], payload: bytes = b"") -> None:
    try:
        if "reason" in header:
            header = {**header, "reason": _clean_reason(header["reason"])}
        _write_all(fd, _frame(header, payload))
    except OSError:
        pass


def _address_space() -> int:
    """This process's virtual memory size in bytes (0 if unknown)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _set_limits(request: dict[str, Any], memory_limit: int) -> None:
    import resource

    cpu = int(request["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the soft limit, SIGKILL at the hard one
    if memory_limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(request["file_mb"]) << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    # No fork, no thread. Root would be exempt: _drop_privileges has switched to another user by now.
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))


def _drop_privileges(ctx: _Context) -> None:
    """As root: become `nobody`, keeping only CAP_DAC_READ_SEARCH (Landlock still decides what may be read)."""
    if ctx.uid is None:
        return
    import ctypes

    libc = ctx.libc
    if libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_KEEPCAPS) failed")
    os.setgroups([])
    os.setgid(ctx.gid)
    os.setuid(ctx.uid)  # real, effective and saved ids: there is no way back to root
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    bit = 1 << _CAP_DAC_READ_SEARCH
    data = (ctypes.c_uint32 * 6)(bit, bit, 0, 0, 0, 0)  # {effective, permitted, inheritable} x 2 words
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    if os.getuid() != ctx.uid or os.geteuid() != ctx.uid:
        raise OSError("could not drop root")


def _landlock_ruleset(ctx: _Context) -> int:
    """Builds the Landlock ruleset: read-only roots, a read-write scratch dir, no exec, no TCP, scoped signals."""
    import ctypes

    abi = ctx.landlock_abi
    fs = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        fs |= 1 << 13  # refer
    if abi >= 3:
        fs |= _FS_TRUNCATE
    if abi >= 5:
        fs |= _FS_IOCTL_DEV
    if abi >= 6:  # + net (bind and connect TCP), + scoped (abstract unix sockets, signals)
        attr, size = struct.pack("<QQQ", fs, 0b11, 0b11), 24
    elif abi >= 4:
        attr, size = struct.pack("<QQ", fs, 0b11), 16
    else:
        attr, size = struct.pack("<Q", fs), 8
    libc = ctx.libc
    buf = ctypes.create_string_buffer(attr, size)
    ruleset = libc.syscall(ctypes.c_long(_LANDLOCK_CREATE_RULESET), buf, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    read = _FS_READ_FILE | _FS_READ_DIR
    rules = [(root, read) for root in ctx.read_roots] + [(ctx.scratch, fs & ~_FS_EXECUTE)]
    for path, access in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not os.path.isdir(path):
                access &= _FS_FILE_RIGHTS
            rule = ctypes.create_string_buffer(struct.pack("<Qi", access, fd), 12)
            if libc.syscall(ctypes.c_long(_LANDLOCK_ADD_RULE), ruleset, _LANDLOCK_RULE_PATH_BENEATH, rule, 0) != 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
        finally:
            os.close(fd)
    return ruleset


def _install_audit_hook(scratch: str, read_roots: list[str]) -> None:
    """Refuses, and ends the render on, any audited operation the untrusted input should not need."""

    def within(path: str, roots: Sequence[str]) -> bool:
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)

    scratch_roots = (scratch,)
    readable = (scratch, *read_roots)

    def resolve(path: object) -> str | None:
        if isinstance(path, int):
            return None  # an already-open descriptor: opening it was checked
        return os.path.normpath(os.path.join(scratch, os.fsdecode(os.fspath(path))))  # type: ignore[arg-type]

    def verdict(event: str, args: tuple[Any, ...]) -> str:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, 0))[:3]
            target = resolve(path)
            if target is None:
                return ""
            write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
            if within(target, scratch_roots) or (not write and within(target, readable)):
                return ""
            return f"open({path!r}) for {'writing' if write else 'reading'} outside the sandbox"
        if event == "import":
            name = str(args[0])
            if name in _DENY_IMPORTS or name.split(".")[0] in _DENY_IMPORTS:
                return f"import of {name!r}"
            return ""
        if event in _DENY_EVENTS or event.startswith(_DENY_PREFIXES):
            return f"{event}{_short(args)}"
        for index in _WRITE_PATH_ARGS.get(event, ()):
            target = resolve(args[index]) if index < len(args) and args[index] is not None else scratch
            if target is not None and not within(target, scratch_roots):
                return f"{event}({args[index]!r}) outside the scratch directory"
        for index in _READ_PATH_ARGS.get(event, ()):
            target = resolve(args[index]) if index < len(args) and args[index] is not None else scratch
            if target is not None and not within(target, readable):
                return f"{event}({args[index]!r}) outside the sandbox"
        return ""

    def hook(event: str, args: tuple[Any, ...]) -> None:
        try:
            refused = verdict(event, args)
        except BaseException:  # arguments we cannot make sense of: fail closed
            refused = f"{event} (arguments not understood)"
        if refused:
            _send(3, {"ok": False, "reason": f"sandbox refused {refused}"})
            os._exit(_VIOLATION_EXIT)

    sys.addaudithook(hook)


def _short(args: tuple[Any, ...]) -> str:
    try:
        text = repr(tuple(a for a in args if isinstance(a, str | bytes | int | float | tuple | list)))
    except Exception:
        return ""
    return text if len(text) <= 120 else text[:117] + "..."


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
