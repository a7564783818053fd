"""Confinement of the sandbox's render children: the layers a child puts up before it looks at its input.

The layers, from the outside in, are listed in `rewards.render.sandbox`; this module holds their mechanics:

* network, System V IPC and secrets (layer 1, applied by the caller when it starts a worker): `ENV_KEEP` is all of
  the caller's environment a worker inherits (the namespaces are `rewards.render.isolation`'s probes);
* in the worker, once (`prepare`): the user to switch to, the scratch directory, the read-only roots, the Landlock
  ABI the kernel offers;
* in each render child (`confine_child`): descriptors, working and temporary directory, then the ruleset, the
  switch to `nobody` (layer 2), the rlimits (layer 3), Landlock (layer 4), the seccomp filter (layer 4b,
  `rewards.render.seccomp_filter`) and the audit hook (layer 5), in that order. Whatever fails to go up raises, and
  the child renders nothing (it fails closed).

The kernel calls (Landlock, the `nobody` user) are `rewards.render.isolation`'s, shared with the html worker's
browser. Imports only the standard library and its siblings at the top (the worker program imports this module
without the `rewards` package: see `rewards.render.sandbox`); ctypes, sysconfig, resource and pwd are imported where
the worker and its children use them, so the caller's process never loads them.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import isolation, seccomp_filter

RESULT_FD = 3
"""The render child's result pipe: after `confine_child`, the one descriptor open besides 0-2 (/dev/null)."""

REQUEST_FD = 4
"""A reused render child's request pipe (kinds whose input is data, such as SVG): open next to `RESULT_FD`."""

VIOLATION_EXIT = 3
"""Exit status of a render child that the audit hook stopped (after it reported the refusal on `RESULT_FD`)."""

_CAP_DAC_READ_SEARCH = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# Environment variables the worker inherits; everything else (tokens, keys, proxies) stays behind.
ENV_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "XDG_CACHE_HOME", "MPLCONFIGDIR", "FONTCONFIG_PATH", "FONTCONFIG_FILE")

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
        # What reaches the audit hook itself (its function, its frames) to switch it off: the collector's object
        # lists, tracers and profilers. Charts and CAD need none of them.
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "sys.settrace",
        "sys.setprofile",
        "sys._current_frames",
        "sys._current_exceptions",
        "sys.monitoring.register_callback",
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
# Modules untrusted code may not import: only those whose harm raises no audit event, i.e. foreign-function
# interfaces and C libraries with their own file and network I/O (already-imported ones raise no import event:
# see "What it cannot do"). Everything else may be imported (asyncio, smtplib, ssl, socket, multiprocessing,
# webbrowser, ...): using it to spawn, connect or write outside scratch raises an event refused above, and the
# kernel layers (network namespace, Landlock, rlimits) hold regardless. A longer list would refuse benign chart
# scripts for what they import (anything importing ssl, for one) without containing anything more.
_DENY_IMPORTS = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend", "cv2"})
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


@dataclass
class Confinement:
    """What the worker prepares once for every render child (`prepare`), and each child applies (`confine_child`)."""

    scratch: str
    read_roots: list[str]
    landlock_abi: int
    uid: int | None  # switch to this user in the child (None: stay)
    gid: int | None
    audit_hook: bool
    libc: Any
    seccomp: Any = None  # the children's filter, a `seccomp_filter.Prepared` (None: no filter; see `seccomp_missing`)
    seccomp_missing: str = ""  # why there is no filter ("" when there is one)


def prepare(
    scratch: str, renderer_read_roots: Sequence[str], *, audit_hook: bool, seccomp: bool = True
) -> Confinement:
    """In the worker, once: the user to become, the scratch directory, what may be read, the Landlock ABI.

    Args:
        scratch: the worker's scratch directory, made empty by the caller; the children's only writable place.
        renderer_read_roots: directories the renderer must read besides the Python installation (its `read_roots`).
        audit_hook: whether children install the audit hook.
        seccomp: whether children install the seccomp filter (where the kernel has seccomp; off only in tests of
            the other layers).

    Returns:
        The confinement every render child of this worker applies.
    """
    import sysconfig

    libc = isolation.libc()
    uid = gid = None
    if os.geteuid() == 0 and sys.platform == "linux":  # switching users keeps a capability: Linux only
        uid, gid = isolation.nobody()
    scratch = os.path.realpath(scratch)
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
    roots.update(isolation.SYSTEM_READ_ROOTS)  # shared libraries, fonts
    roots.update(renderer_read_roots)
    read_roots = sorted(os.path.realpath(r) for r in roots if r and os.path.exists(r))
    abi = isolation.landlock_abi(libc)
    program, missing = None, "switched off"
    if seccomp:
        missing = seccomp_filter.unavailable() or ""
        if not missing:  # built once here; each child only hands it to the kernel
            program = seccomp_filter.Prepared(
                seccomp_filter.program(seccomp_filter.RENDER_CHILD, seccomp_filter.machine())
            )
    return Confinement(scratch, read_roots, abi, uid, gid, audit_hook, libc, program, missing)


def confine_child(
    conf: Confinement,
    request: dict[str, Any],
    write_fd: int,
    report: Callable[[str], None],
    request_fd: int | None = None,
) -> None:
    """In a fresh render child, before it looks at its input: puts up every layer, or raises.

    Args:
        conf: from `prepare`, in the worker.
        request: the render request (`memory_mb`, `cpu_seconds`, `file_mb` set the limits).
        write_fd: the result pipe; it becomes `RESULT_FD`.
        report: sends an audit-hook refusal's reason to the worker (the child then exits with `VIOLATION_EXIT`).
        request_fd: a reused child's request pipe; it becomes `REQUEST_FD` (None: a one-render child).
    """
    import fcntl

    # Out of the way first (above 16), so that placing one on 3 or 4 cannot close the other.
    write_fd = fcntl.fcntl(write_fd, fcntl.F_DUPFD, 16)
    request_fd = fcntl.fcntl(request_fd, fcntl.F_DUPFD, 16) if request_fd is not None else None
    os.dup2(write_fd, RESULT_FD)
    keep = RESULT_FD
    if request_fd is not None:
        os.dup2(request_fd, REQUEST_FD)
        keep = REQUEST_FD
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the untrusted input's prints go nowhere
        os.dup2(devnull, fd)
    os.closerange(keep + 1, 1 << 16)  # the protocol pipes, the spare /dev/null: only 0-3 (0-4) stay open
    os.chdir(conf.scratch)
    tempfile.tempdir = conf.scratch
    sys.dont_write_bytecode = True  # a lazy import must not try to write .pyc files next to the source
    base = _address_space()  # 0 where /proc is missing: then no RLIMIT_AS (macOS does not enforce it anyway)
    memory_limit = base + int(request["memory_mb"]) * (1 << 20) if base else 0
    ruleset = _landlock_ruleset(conf) if conf.landlock_abi > 0 else -1
    _drop_privileges(conf)
    _set_limits(request, memory_limit)
    if ruleset >= 0:
        isolation.landlock_restrict(conf.libc, ruleset)
    if conf.seccomp is not None:  # no sockets, no System V IPC, no ptrace or namespaces: whatever Python does
        conf.seccomp.install()
    if conf.audit_hook:
        _install_audit_hook(conf.scratch, conf.read_roots, report)


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


def _drop_privileges(conf: Confinement) -> None:
    """As root: become `nobody`, keeping only CAP_DAC_READ_SEARCH (Landlock still decides what may be read)."""
    if conf.uid is None:
        return
    import ctypes

    libc = conf.libc
    if libc.prctl(isolation.PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_KEEPCAPS) failed")
    os.setgroups([])
    os.setgid(conf.gid)
    os.setuid(conf.uid)  # real, effective and saved ids: there is no way back to root
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    bit = 1 << _CAP_DAC_READ_SEARCH
    data = (ctypes.c_uint32 * 6)(bit, bit, 0, 0, 0, 0)  # {effective, permitted, inheritable} x 2 words
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    if os.getuid() != conf.uid or os.geteuid() != conf.uid:
        raise OSError("could not drop root")


def _landlock_ruleset(conf: Confinement) -> int:
    """The child's Landlock ruleset: read-only roots, a read-write scratch dir, no exec, no TCP, scoped signals.

    Built before the switch to `nobody`, while every root can still be opened.
    """
    scratch_rights = isolation.landlock_handled(conf.landlock_abi) & ~isolation.FS_EXECUTE
    entries = [(root, isolation.FS_READ) for root in conf.read_roots] + [(conf.scratch, scratch_rights)]
    rules = isolation.landlock_rules(entries)
    try:
        return isolation.landlock_ruleset(conf.libc, conf.landlock_abi, rules)
    finally:
        for _, fd in rules:
            os.close(fd)


def _install_audit_hook(scratch: str, read_roots: list[str], report: Callable[[str], None]) -> None:
    """Refuses, and ends the render on, any audited operation the untrusted input should not need.

    The refusal is handed to `report` (which sends it to the worker), then the child exits with `VIOLATION_EXIT`.

    The hook is a readable-reasons layer, not the containment (the kernel layers hold without it), but it is made
    hard to switch off: it and the verdict hold only what they captured here (the exit is `posix._exit` itself, not
    `os._exit` looked up when a refusal comes; builtins are bound once), so replacing a module's attribute changes
    nothing, and the ways to reach the hook's function or frames (the collector's object lists, tracers, profilers)
    are refused events. The exit comes even if `report` fails (a closed result pipe).
    """
    import posix

    verdict = audit_verdict(scratch, read_roots)

    def hook(
        event: str,
        args: tuple[Any, ...],
        _verdict: Callable[[str, tuple[Any, ...]], str] = verdict,
        _report: Callable[[str], None] = report,
        _exit: Callable[[int], Any] = posix._exit,
        _code: int = VIOLATION_EXIT,
        _error: type[BaseException] = BaseException,
        _deep: type[BaseException] = RecursionError,
    ) -> None:
        try:
            refused = _verdict(event, args)
        except _deep:  # at the recursion limit: raised from the hook, the operation does not happen either
            raise
        except _error:  # arguments we cannot make sense of: fail closed
            refused = f"{event} (arguments not understood)"
        if refused:
            try:
                _report(f"sandbox refused {refused}")
            finally:
                _exit(_code)

    sys.addaudithook(hook)


def audit_verdict(scratch: str, read_roots: Sequence[str]) -> Callable[[str, tuple[Any, ...]], str]:
    """The audit hook's judgement: `verdict(event, args)` is why the event is refused, "" where it is allowed.

    Paths are compared where they lead: a relative path is taken from `scratch` (the child's working directory), and
    every symlink on the way is followed (`os.path.realpath`), as the roots were followed in `prepare`. So a venv or
    a home reached through a link reads its own files, and a link in the scratch directory to a file outside is
    outside (Landlock, which sees the opened file, agrees).

    Args:
        scratch: the resolved scratch directory, the only place that may be written.
        read_roots: the resolved directories that may be read.
    """
    import posix

    scratch = os.path.realpath(scratch)
    scratch_roots = (scratch,)
    readable = (scratch, *(os.path.realpath(root) for root in read_roots))
    # Everything the verdict calls, bound now: replacing `os.path.realpath` or `builtins.any` later changes nothing
    # here. (realpath's own helpers are still posixpath's globals: the hook gives reasons, the kernel contains.)
    realpath, join, fspath, encoding = os.path.realpath, os.path.join, posix.fspath, sys.getfilesystemencoding()
    _isinstance, _str, _len, _tuple, _bool, _int, _bytes = isinstance, str, len, tuple, bool, int, bytes
    deny_events, deny_prefixes, deny_imports = _DENY_EVENTS, _DENY_PREFIXES, _DENY_IMPORTS
    write_args, read_args, write_flags, short = dict(_WRITE_PATH_ARGS), dict(_READ_PATH_ARGS), _WRITE_FLAGS, _short

    def within(path: str, roots: Sequence[str]) -> bool:
        for root in roots:
            if path == root or path.startswith(root.rstrip("/") + "/"):
                return True
        return False

    def resolve(path: object) -> str | None:
        if _isinstance(path, _int):
            return None  # an already-open descriptor: opening it was checked
        path = fspath(path)  # type: ignore[arg-type]
        if _isinstance(path, _bytes):
            path = path.decode(encoding, "surrogateescape")
        # realpath raises no audit event (lstat and readlink are not audited), so this cannot recurse into the hook.
        return realpath(join(scratch, path))

    def verdict(event: str, args: tuple[Any, ...]) -> str:
        if event == "open":
            path, mode, flags = (_tuple(args) + (None, None, 0))[:3]
            target = resolve(path)
            if target is None:
                return ""
            write = (_isinstance(mode, _str) and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or _bool(
                (flags or 0) & write_flags
            )
            if within(target, scratch_roots) or (not write and within(target, readable)):
                return ""
            return f"open({path!r}) for {'writing' if write else 'reading'} outside the sandbox"
        if event == "import":
            name = _str(args[0])
            if name in deny_imports or name.split(".")[0] in deny_imports:
                return f"import of {name!r}"
            return ""
        if event in deny_events or event.startswith(deny_prefixes):
            return f"{event}{short(args)}"
        for index in write_args.get(event, ()):
            target = resolve(args[index]) if index < _len(args) and args[index] is not None else scratch
            if target is not None and not within(target, scratch_roots):
                return f"{event}({args[index]!r}) outside the scratch directory"
        for index in read_args.get(event, ()):
            target = resolve(args[index]) if index < _len(args) and args[index] is not None else scratch
            if target is not None and not within(target, readable):
                return f"{event}({args[index]!r}) outside the sandbox"
        return ""

    return verdict


def _short(args: tuple[Any, ...]) -> str:
    try:
        text = repr(tuple(a for a in args if isinstance(a, str | bytes | int | float | tuple | list)))
    except Exception:
        return ""
    return text if len(text) <= 120 else text[:117] + "..."
