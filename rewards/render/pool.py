"""The caller's side of the render sandbox: `RenderPool`, its warm worker processes, and the process-wide pools.

A `RenderPool` starts `DEFAULT_WORKERS` (or as many as asked) copies of the worker program (`sandbox.py`, run by
path under `python -I`, in a fresh network namespace when `unshare -n` works), spreads a batch of sources over
them, and turns every answer, silence or death into a `RenderResult`: an image, or None and the reason. It never
raises because of what a source contains. What the workers and their render children enforce is documented in
`rewards.render.sandbox`; the frames exchanged with them are `rewards.render.framing`'s.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rewards.render import cad, chart, html, svg
from rewards.render.confine import ENV_KEEP
from rewards.render.framing import FRAME, KINDS, clean_reason, take_frame
from rewards.render.isolation import ipc_namespace_available, network_namespace_available

__all__ = [
    "DEFAULT_WORKERS",
    "GRACE",
    "KINDS",
    "MAX_SIDE",
    "MAX_SOURCE_BYTES",
    "START_TIMEOUT",
    "RenderPool",
    "RenderResult",
    "as_size",
    "default_pool",
    "ipc_namespace_available",
    "network_namespace_available",
    "shutdown_pools",
]


MAX_SOURCE_BYTES = 1 << 20
"""Inputs larger than this (UTF-8) are refused in the caller, before any worker sees them."""

MAX_SIDE = 4096
"""Largest output width or height, in pixels."""

START_TIMEOUT = 120.0
"""Seconds a worker may take to start (imports and warm-up render; slow on a loaded machine)."""

GRACE = 10.0
"""Seconds past a render's timeout after which the caller gives up on the worker itself and restarts it."""


_WORKER_PROGRAM = Path(__file__).resolve().with_name("sandbox.py")  # run by path: no `rewards` package, no torch
_RENDERERS = {"svg": svg, "chart": chart, "cad": cad, "html": html}  # OPTIONS and check_options, caller side


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


class _Worker:
    """One warm worker process as the caller sees it: a pipe pair, a read buffer and a state."""

    def __init__(
        self,
        kind: str,
        *,
        network_namespace: bool,
        audit_hook: bool,
        renders_per_child: int | None = None,
        ipc_namespace: bool = False,
        seccomp: bool = True,
    ):
        self.kind = kind
        self.renders_per_child = renders_per_child
        self.network_namespace = network_namespace
        self.ipc_namespace = ipc_namespace
        self.audit_hook = audit_hook
        self.seccomp = seccomp
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
        config = json.dumps(
            {
                "kind": self.kind,
                "audit_hook": self.audit_hook,
                "seccomp": self.seccomp,
                "scratch": self.scratch,
                "renders_per_child": self.renders_per_child,
            }
        )
        cmd = [sys.executable, "-I", str(_WORKER_PROGRAM), config]
        # A fresh network namespace (no interfaces) and a fresh System V IPC namespace (segments, semaphores and
        # queues that die with the worker): both need root, and each is added where the pool found it works.
        namespaces = (["-n"] if self.network_namespace else []) + (["-i"] if self.ipc_namespace else [])
        if namespaces:
            cmd = [shutil.which("unshare") or "unshare", *namespaces, *cmd]
        env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
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
        self.proc.stdin.write(FRAME.pack(len(body)) + body)
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
        return take_frame(self.buf, max_payload)

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
        ipc_namespace: start workers under `unshare -i` (their own System V IPC objects); None probes.
        audit_hook: install the audit-hook layer in render children. Turn it off only to test that the
            kernel-enforced layers hold on their own.
        seccomp: install the seccomp filter in render children (and Chromium) where the kernel has seccomp. Turn
            it off only to test the other layers on their own.
        renders_per_child: how many renders one confined child may serve before a fresh one replaces it, for
            kinds whose input is data (SVG: up to `svg.RENDERS_PER_CHILD`); None takes the renderer's own
            number, 1 gives every render a fresh child. Code (charts, CAD) always gets a fresh child.
    """

    def __init__(
        self,
        kind: str,
        workers: int = 2,
        *,
        network_namespace: bool | None = None,
        audit_hook: bool = True,
        renders_per_child: int | None = None,
        ipc_namespace: bool | None = None,
        seccomp: bool = True,
    ):
        if kind not in KINDS:
            raise ValueError(f"unknown render kind {kind!r}; valid: {', '.join(KINDS)}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if renders_per_child is not None and renders_per_child < 1:
            raise ValueError(f"renders_per_child must be >= 1, got {renders_per_child}")
        if network_namespace is None:
            network_namespace = network_namespace_available()
        if ipc_namespace is None:
            ipc_namespace = ipc_namespace_available()
        self.kind = kind
        self.options, self._check_options = _renderer_options(kind)
        self._workers = [
            _Worker(
                kind,
                network_namespace=network_namespace,
                audit_hook=audit_hook,
                renders_per_child=renders_per_child,
                ipc_namespace=ipc_namespace,
                seccomp=seccomp,
            )
            for _ in range(workers)
        ]
        self._lock = threading.Lock()
        self._closed = False
        self._start_failures = 0

    @property
    def isolation(self) -> dict[str, Any]:
        """Which sandbox layers the workers report (empty until a worker has started).

        `network_namespace` and `ipc_namespace` are the pool's; `landlock_abi`, `seccomp` (and `seccomp_missing`,
        why not), `user` and `pid` a worker's; `missing` lists each absent layer with what its absence leaves open.
        """
        info = next((w.info for w in self._workers if w.info), {})
        found = {
            "network_namespace": self._workers[0].network_namespace,
            "ipc_namespace": self._workers[0].ipc_namespace,
            **info,
        }
        return {**found, "missing": missing_layers(self.kind, found)} if info else found

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
                        if retried.get(i, 0) == 0:  # the worker died while idle (killed from outside): not a
                            retried[i] = 1  # failure to start, once per request
                        else:
                            self._start_failures += 1
                        break
                    w.state = "busy"
                    w.job = (i, request_id, time.monotonic())
                    w.deadline = w.job[2] + base["timeout"] + GRACE
            active = [w for w in self._workers if w.state in ("starting", "busy")]
            if not active and queue and self._start_failures < 2 * len(self._workers):
                if any(w.state == "down" for w in self._workers):
                    continue  # an idle worker's pipe broke (it died between requests): start a fresh one
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
                w.info = {k: header.get(k) for k in ("landlock_abi", "seccomp", "seccomp_missing", "user", "pid")}
                w.last_error = ""
                _warn_missing(self.kind, self.isolation.get("missing", []))
            else:
                self._start_failures += 1
                w.kill(clean_reason(header.get("fatal", "worker failed to start")))
            return
        if w.job is None or header.get("id") != w.job[1]:
            raise ValueError("answer to a request that is not in flight")
        i, _, sent = w.job
        seconds = time.monotonic() - sent
        if header.get("ok") is True:
            if len(payload) != nbytes:
                raise ValueError(f"image of {len(payload)} bytes, expected {nbytes}")
            image = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(base["height"], base["width"], 3)
            results[i] = RenderResult(image, "", seconds)
        else:
            results[i] = RenderResult(None, clean_reason(header.get("reason", "render failed")), seconds)
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


def missing_layers(kind: str, found: dict[str, Any]) -> list[str]:
    """Each kernel layer a pool's workers lack (from `RenderPool.isolation`), with what its absence leaves open.

    Layers switched off on purpose (`seccomp=False`, `network_namespace=False`) are listed too: what matters is what
    stands, not why.
    """
    missing = []
    seccomp = found.get("seccomp")
    if not found.get("network_namespace"):
        missing.append(
            "network namespace (off, or unavailable: not root or no unshare): the network is kept out by "
            + ("Landlock's TCP rule and the seccomp filter's socket rule" if seccomp else "Landlock's TCP rule alone")
        )
    if not found.get("ipc_namespace"):
        missing.append(
            "IPC namespace (off, or unavailable: not root or no unshare): "
            + ("the seccomp filter refuses System V IPC" if seccomp else "System V IPC objects could outlive a render")
        )
    if not seccomp:
        why = found.get("seccomp_missing") or "unknown"
        missing.append(
            f"seccomp filter ({why}): UNIX-socket connections, UDP"
            + (" (WebRTC)" if kind == "html" else "")
            + " and System V IPC then rest on the namespaces and the audit hook"
        )
    if not found.get("landlock_abi"):
        missing.append("Landlock (kernel < 5.13): file confinement rests on the audit hook and the user switch")
    return missing


_WARNED: set[str] = set()


def _warn_missing(kind: str, missing: list[str]) -> None:
    """Says once per process, at a worker's start-up, which kernel layers are missing (they weaken the sandbox)."""
    import warnings

    for layer in missing:
        if layer not in _WARNED:
            _WARNED.add(layer)
            warnings.warn(f"render sandbox ({kind}): missing layer: {layer}", RuntimeWarning, stacklevel=5)


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
    module = _RENDERERS[kind]
    return dict(module.OPTIONS), getattr(module, "check_options", None)
