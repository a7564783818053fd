"""Sandboxed rendering of model-written code: warm worker processes, confined forked children that render.

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

Code (charts, CAD) always gets that fresh child. SVG is data, not code: nothing in it runs, so its renderer sets
`RENDERS_PER_CHILD` and one confined child serves up to that many SVGs, each read from a request pipe
(`confine.REQUEST_FD`) after the confinement is up, each under the wall-clock timeout and the input checks. The child
stays only after a render that succeeded or that the input checks refused; after anything else (MemoryError, a
crash, an audit refusal) it is killed and that SVG is rendered again in a fresh child, so reuse changes what a render
costs, never its result. A child confined with other limits (`memory_mb`, `file_mb`, `timeout`) is replaced.

Layers, from the outside in (the child applies them in this order before it looks at the input):

1. **No network, no shared IPC, no secrets**: the worker starts in a fresh network namespace (`unshare -n`: no
   interfaces but a loopback that is down) and a fresh System V IPC namespace (`unshare -i`: shared-memory segments,
   semaphores and message queues die with the worker), each probed once per process. Without them (not root, no
   `unshare`), the seccomp filter (4b) refuses every socket and all System V IPC, and Landlock's TCP rule (ABI >= 4)
   still holds. The worker's environment keeps only `PATH`, `HOME`, `LANG`/`LC_ALL` and cache/font settings: no
   tokens or keys.
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
4b. **seccomp filter** (`rewards.render.seccomp_filter.RENDER_CHILD`, kernel-enforced, irreversible, inherited):
   `socket` of every family refused (no connection to a UNIX socket on the host, which Landlock does not cover; no
   UDP, netlink or packet socket), `socketpair` but a UNIX stream pair, io_uring, System V IPC and POSIX message
   queues, `ptrace`, `process_vm_*`, `kexec_*`, `mount`, `unshare`, `setns`, namespace clones, `bpf`,
   `perf_event_open`, the key ring; a system call of a foreign architecture kills the child. Refused calls fail with
   EPERM. Where the kernel has no seccomp (or the machine is neither x86_64 nor aarch64) the pool warns at start-up and
   `RenderPool.isolation["missing"]` says what that leaves open.
5. **Audit hook** (`sys.addaudithook`, PEP 578), installed last, so it only sees the untrusted part; the layer that
   gives readable reasons, not the one that contains (the kernel layers above hold with it switched off, and
   tests/rewards/test_hostile.py checks that they do).
   It holds only what it captured at install time (its exit is `posix._exit`, its builtins bound once), and the ways
   to reach it (`gc.get_objects`/`get_referrers`/`get_referents`, tracers, profilers) are refused events. It refuses
   `open` outside the allowed roots (and any write outside scratch), `os.system`, `os.exec*`, `os.fork`,
   `os.posix_spawn`, `subprocess.Popen`, socket creation, `ctypes`, `os.kill`, `os.chdir`, links, and importing
   the modules whose harm raises no audit event (ctypes, cffi, cv2); any other module may be imported, since what
   it could do with the network, processes or files raises a refused event. A refusal ends the render at once with the
   reason, so a `try/except` in the untrusted code cannot swallow it.
6. **Input checks** (SVG, in `svg.py`): size cap, no ENTITY declaration or undeclared entity (found by
   parsing, so no entity expansion or XXE; a DOCTYPE without entities is fine), caps on
   element count, nesting depth and width/height, and no references but `#fragment`s and inline PNG/JPEG
   `data:` images; cairosvg runs with `unsafe=False` and a url_fetcher that refuses everything else.

What it cannot do
-----------------
* Audit hooks are not a security boundary on their own: code can reach already-imported modules through
  `sys.modules`, call C functions that raise no audit event (`_posixsubprocess.fork_exec`, `posix.write` to an
  inherited fd), or open files from C, and code that reaches the hook could switch it off. Layers 1-4b are what
  hold then: fork fails on RLIMIT_NPROC, exec and out-of-scope reads and writes fail in Landlock, sockets and System
  V IPC fail in the seccomp filter, the network does not exist. Without Landlock (kernel < 5.13, some containers)
  file confinement rests on the audit hook alone; `RenderPool.isolation` says which layers are up, and its
  `missing` entry what each absent one leaves open (the pool also warns once at start-up). The hook's path
  resolution still goes through `posixpath`'s module globals, which code in the render can replace: that weakens the
  hook's reasons, not the containment.
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
* Cost: the fork, the confinement and the copy-on-write faults of a fresh child add a few milliseconds to each
  render (BENCHMARKS.md, "SVG renders scored per second"), a small part of a typical SVG's render time; a warm SVG
  child pays it once per `RENDERS_PER_CHILD` renders.
* A warm SVG child is one process for several inputs: a renderer bug that one SVG could exploit (cairo and cairosvg
  run no code from the SVG, but they are C and Python parsers) could carry over to the next SVGs that child renders,
  up to `RENDERS_PER_CHILD` of them, inside the same confinement. `RenderPool(renders_per_child=1)` gives every SVG
  its own child.

Recovery: a worker that dies while a render is in flight (killed from outside: renders themselves run in children)
gets the request once more on a fresh worker; one that stops answering for the timeout plus `GRACE` is killed and
restarted and the render fails with the reason. A worker that cannot start makes the renders fail with its reason
(e.g. cairosvg not installed) rather than hang. A renderer is a module next to this one (`svg.py`, `chart.py`,
`cad.py`) with `OPTIONS`, `warm_up`, `read_roots` and `render`, and optionally `check_options` (run in the caller on
the merged options of each batch, so a bad option value raises there instead of failing every render).

Where it lives
--------------
* `rewards.render.pool`: the caller's side (`RenderPool`, its `_Worker`s, timeouts, restarts, the process-wide
  pools);
* `rewards.render.framing`: the frames exchanged between the caller, the workers and the render children;
* `rewards.render.confine`: the layers above, as the worker prepares them and each render child puts them up;
* `rewards.render.isolation`: the kernel mechanisms the layers use (namespaces, the `nobody` user, Landlock);
* this file: the worker's program. The caller runs it by path (`python -I`), so it imports only the standard library
  at the top; it makes its directory a package of its own (`_mmrl_render`, whose `__init__` never runs), so that
  `framing.py`, `confine.py`, `isolation.py` and `svg.py`, `chart.py`, `cad.py` or `html.py` import one another
  relatively, as inside `rewards.render`, without importing the `rewards` package (and torch).
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

if not __package__:  # the worker program, run by path (`python -I sandbox.py`)
    # This directory becomes the package `_mmrl_render` without running `rewards/__init__.py` (no torch), so that
    # the modules next to this one import each other relatively here as they do inside `rewards.render` (PEP 366).
    _package = ModuleType("_mmrl_render")
    _package.__path__ = [os.path.dirname(os.path.abspath(__file__))]
    sys.modules[_package.__name__] = _package
    __package__ = _package.__name__

from . import confine, framing  # noqa: E402


def _load_renderer(kind: str) -> ModuleType:
    """The renderer module of `kind` (`svg.py`, `chart.py`, `cad.py` or `html.py` next to this file)."""
    if kind not in framing.KINDS:
        raise ValueError(f"unknown render kind {kind!r}")
    return importlib.import_module(f"{__package__}.{kind}")


@dataclass
class _WarmChild:
    """A confined render child that serves several renders (kinds whose input is data: `RENDERS_PER_CHILD` > 1)."""

    pid: int
    pidfd: int | None
    request_fd: int  # the worker's end of the child's request pipe
    result_fd: int  # the worker's end of the child's result pipe
    limits: tuple[int, int, int]  # (memory_mb, file_mb, cpu_seconds) it was confined with
    served: int = 0
    reaped: bool = False


@dataclass
class _Context:
    """What the worker prepares once for every render child."""

    renderer: Any
    confinement: confine.Confinement
    renders_per_child: int = 1  # 1: a fresh child per render; more: a warm child serves up to that many
    warm: _WarmChild | None = None


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
        framing.write_all(proto_out, framing.frame({"fatal": framing.clean_reason(f"{type(e).__name__}: {e}")}))
        return 1
    ready = {
        "ready": True,
        "landlock_abi": ctx.confinement.landlock_abi,
        "seccomp": ctx.confinement.seccomp is not None,
        "seccomp_missing": ctx.confinement.seccomp_missing,
        "user": ctx.confinement.uid,
        "pid": os.getpid(),
    }
    framing.write_all(proto_out, framing.frame(ready))
    while True:
        head = framing.read_exact(proto_in, framing.FRAME.size)
        if head is None:  # the caller closed the pipe (or died): clean up and leave quietly
            _end_warm(ctx)
            shutil.rmtree(ctx.confinement.scratch, ignore_errors=True)
            return 0
        (length,) = framing.FRAME.unpack(head)
        body = framing.read_exact(proto_in, length)
        if body is None:
            return 0
        request = json.loads(body)
        try:
            header, payload = _serve(ctx, request)
        except Exception as e:  # a bug here must cost one render, not the warm worker
            reason = framing.clean_reason(f"worker error: {type(e).__name__}: {e}")
            header, payload = {"ok": False, "reason": reason}, b""
        framing.write_all(proto_out, framing.frame({**header, "id": request.get("id")}, payload))


def _prepare(config: dict[str, Any]) -> _Context:
    renderer = _load_renderer(config["kind"])
    renderer.warm_up()  # imports, font caches, lazy submodules: paid once here rather than in every child
    confinement = confine.prepare(
        config["scratch"],
        renderer.read_roots(),
        audit_hook=bool(config.get("audit_hook", True)),
        seccomp=bool(config.get("seccomp", True)),
    )
    # Code (charts, CAD) always gets a fresh child; data (SVG) may be served by a warm one, if the renderer says so.
    allowed = max(1, int(getattr(renderer, "RENDERS_PER_CHILD", 1)))
    asked = config.get("renders_per_child")
    renders_per_child = allowed if asked is None else max(1, min(int(asked), allowed))
    gc.collect()
    gc.freeze()  # the warm heap stays out of the children's collections: fewer copy-on-write page faults per render
    return _Context(renderer, confinement, renders_per_child)


def _serve(ctx: _Context, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """Renders one request in a confined child, under a wall-clock timeout; returns the reply header and pixels.

    With `renders_per_child` > 1 the request goes to the warm child (started if there is none); whatever that child
    cannot answer as the input's own verdict (it crashed, ran out of memory, died) is rendered again in a fresh
    child, so a reused child never changes a result, only its cost.
    """
    if hasattr(ctx.renderer, "serve"):  # html: the worker drives its own confined browser (rewards.render.html)
        return ctx.renderer.serve(request, ctx.confinement.scratch, seccomp=ctx.confinement.seccomp is not None)
    start = time.monotonic()
    if ctx.renders_per_child > 1:
        reply = _serve_warm(ctx, request, start)
        if reply is not None:
            return reply
    return _serve_fresh(ctx, request, start)


def _serve_fresh(ctx: _Context, request: dict[str, Any], start: float) -> tuple[dict[str, Any], bytes]:
    """Renders one request in a freshly forked child that exits after it."""
    width, height, timeout = int(request["width"]), int(request["height"]), float(request["timeout"])
    nbytes = width * height * 3
    read_fd, write_fd = os.pipe()
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
            if len(data) > framing.FRAME.size + framing.MAX_HEADER + nbytes:
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
    _empty(ctx.confinement.scratch)
    if timed_out:
        return {"ok": False, "reason": f"wall-clock timeout after {timeout:g} s"}, b""
    if overflow:
        return {"ok": False, "reason": "render process sent more than an image"}, b""
    try:
        frame = framing.take_frame(data, nbytes)
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
            return {"ok": False, "reason": framing.clean_reason(header.get("reason", "render failed"))}, b""
        bad = "inconsistent result"
    return {"ok": False, "reason": _exit_reason(status, request, bad)}, b""


def _serve_warm(ctx: _Context, request: dict[str, Any], start: float) -> tuple[dict[str, Any], bytes] | None:
    """Renders one request in the warm child; None when it must be rendered again in a fresh child."""
    width, height, timeout = int(request["width"]), int(request["height"]), float(request["timeout"])
    nbytes = width * height * 3
    limits = (int(request["memory_mb"]), int(request["file_mb"]), int(request["cpu_seconds"]))
    warm = ctx.warm
    if warm is not None and (warm.limits != limits or warm.served >= ctx.renders_per_child):
        _end_warm(ctx)
        warm = None
    if warm is None:
        warm = _start_warm(ctx, request, limits)
        if warm is None:
            return None
    work = framing.frame(
        {"width": width, "height": height, "options": request["options"]},
        request["source"].encode("utf-8", "surrogatepass"),
    )
    try:
        framing.write_all(warm.request_fd, work)
    except OSError:  # the child is gone
        _end_warm(ctx)
        return None
    warm.served += 1
    data = bytearray()
    frame = None
    while frame is None:
        remaining = start + timeout - time.monotonic()
        if remaining <= 0:
            _end_warm(ctx)
            _empty(ctx.confinement.scratch)
            return {"ok": False, "reason": f"wall-clock timeout after {timeout:g} s"}, b""
        watch = [warm.result_fd] + ([warm.pidfd] if warm.pidfd is not None else [])
        readable, _, _ = select.select(watch, [], [], min(remaining, 0.05) if warm.pidfd is None else remaining)
        if warm.result_fd in readable:
            chunk = os.read(warm.result_fd, 1 << 20)
            if not chunk:  # it closed its pipe: dead or dying
                break
            data += chunk
            try:
                frame = framing.take_frame(data, nbytes)
            except ValueError:
                break
        elif warm.pidfd in readable:
            break  # it exited without a whole answer (reaped in _end_warm)
        elif warm.pidfd is None and os.waitpid(warm.pid, os.WNOHANG)[0]:
            warm.reaped = True  # its pid may be reused now: _end_warm must not signal it
            break
    _empty(ctx.confinement.scratch)
    if frame is not None:
        header, payload = frame
        if header.get("ok") is True and len(payload) == nbytes and not data:
            return {"ok": True}, payload
        if header.get("ok") is False and header.get("refused") is True and not data:
            return {"ok": False, "reason": framing.clean_reason(header.get("reason", "render refused"))}, b""
    _end_warm(ctx)  # anything else (a crash, MemoryError, an audit refusal, a malformed answer): a fresh child decides
    return None


def _start_warm(ctx: _Context, request: dict[str, Any], limits: tuple[int, int, int]) -> _WarmChild | None:
    """Forks a child that confines itself once and then serves renders from its request pipe."""
    request_read, request_write = os.pipe()
    result_read, result_write = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        for fd in (request_read, request_write, result_read, result_write):
            os.close(fd)
        return None
    if pid == 0:  # ------------------------------------------------------------ the warm child; never returns
        os.close(request_write)
        os.close(result_read)
        _warm_child(ctx, request, result_write, request_read)
    os.close(request_read)
    os.close(result_write)
    ctx.warm = _WarmChild(pid, _pidfd_open(pid), request_write, result_read, limits)
    return ctx.warm


def _end_warm(ctx: _Context) -> None:
    """Kills and reaps the warm child, if any."""
    warm, ctx.warm = ctx.warm, None
    if warm is None:
        return
    if not warm.reaped:  # unreaped, its pid cannot belong to another process yet
        try:
            os.kill(warm.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(warm.pid, 0)
        except ChildProcessError:
            pass
    for fd in (warm.request_fd, warm.result_fd, warm.pidfd):
        if fd is not None:
            os.close(fd)


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
    if code == confine.VIOLATION_EXIT:
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
        confine.confine_child(ctx.confinement, request, write_fd, _report_refusal)
    except BaseException as e:  # fail closed: no confinement, no render
        _send({"ok": False, "reason": f"sandbox setup failed: {type(e).__name__}: {e}"})
        os._exit(code)
    refused = getattr(ctx.renderer, "RenderRefused", ())
    try:
        width, height = int(request["width"]), int(request["height"])
        pixels = ctx.renderer.render(request["source"], width, height, request["options"])
        if not isinstance(pixels, bytes | bytearray) or len(pixels) != width * height * 3:
            raise RuntimeError("renderer returned a wrong-sized image")
        _send({"ok": True}, bytes(pixels))
        code = 0
    except MemoryError:
        _send({"ok": False, "reason": f"memory limit of {request['memory_mb']} MB exceeded (MemoryError)"})
    except refused as e:
        _send({"ok": False, "reason": str(e)})
    except RecursionError:
        _send({"ok": False, "reason": "RecursionError: maximum recursion depth exceeded"})
    except BaseException as e:  # SyntaxError, NameError, SystemExit, ... in the untrusted code: all are its failure
        _send({"ok": False, "reason": f"{type(e).__name__}: {e}"})
    finally:
        os._exit(code)


def _warm_child(ctx: _Context, request: dict[str, Any], write_fd: int, request_fd: int) -> None:
    """A reused render child: confine once, then render each request from `REQUEST_FD` until told to stop.

    Its CPU-time limit covers all the renders it may serve (the worker's wall-clock timeout bounds each one). It
    stays up only after a render that succeeded or that the renderer's input checks refused; after anything else
    it exits, and the worker renders that input again in a fresh child.
    """
    cpu = int(request["cpu_seconds"]) * (ctx.renders_per_child + 1)
    try:
        confine.confine_child(ctx.confinement, {**request, "cpu_seconds": cpu}, write_fd, _report_refusal, request_fd)
    except BaseException as e:  # fail closed: no confinement, no render
        _send({"ok": False, "reason": f"sandbox setup failed: {type(e).__name__}: {e}"})
        os._exit(70)
    refused = getattr(ctx.renderer, "RenderRefused", ())
    while True:
        head = framing.read_exact(confine.REQUEST_FD, framing.FRAME.size)
        if head is None:  # the worker closed the pipe
            os._exit(0)
        (length,) = framing.FRAME.unpack(head)
        body = framing.read_exact(confine.REQUEST_FD, length)
        if body is None:
            os._exit(0)
        work = json.loads(body)
        source = framing.read_exact(confine.REQUEST_FD, int(work["nbytes"])) if work["nbytes"] else b""
        if source is None:
            os._exit(0)
        try:
            width, height = int(work["width"]), int(work["height"])
            pixels = ctx.renderer.render(source.decode("utf-8", "surrogatepass"), width, height, work["options"])
            if not isinstance(pixels, bytes | bytearray) or len(pixels) != width * height * 3:
                raise RuntimeError("renderer returned a wrong-sized image")
        except refused as e:
            _send({"ok": False, "refused": True, "reason": str(e)})
            continue
        except BaseException as e:  # MemoryError, a crash in the renderer: the worker retries in a fresh child
            _send({"ok": False, "reason": f"{type(e).__name__}: {e}"})
            os._exit(1)
        _send({"ok": True}, bytes(pixels))


def _send(header: dict[str, Any], payload: bytes = b"") -> None:
    """The render child's one answer to the worker, on its result pipe."""
    framing.send(confine.RESULT_FD, header, payload)


def _report_refusal(reason: str) -> None:
    """What the audit hook calls before it ends the child: the refusal is the render's result."""
    _send({"ok": False, "reason": reason})


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
