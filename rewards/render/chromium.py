"""The html worker's Chromium, started confined: layer 2 of `rewards.render.html`.

`spawn` forks the browser into its own session and, between fork and exec, puts up what it runs under (`_confine`):
`nobody` when the worker is root, death with the worker (`PR_SET_PDEATHSIG`), a Landlock ruleset
(`landlock_rules`: read only the system's libraries, fonts, `/proc`, `/sys` and `/dev`; execute only its own
installation and the ELF loader; write only beneath its profile and `/dev/shm`; from ABI 4 no TCP, from ABI 6 no
abstract sockets or signals outside its own tree), then the seccomp filter `rewards.render.seccomp_filter.BROWSER`.
Whatever fails to go up fails the launch: the browser never runs unconfined.

The browser cannot use the render child's confinement (`rewards.render.confine`): that forbids `execve`, threads
and most of the file system, and Chromium needs all three. The kernel calls are the same ones
(`rewards.render.isolation`).

Imports only the standard library and its siblings at the top (the sandbox worker imports it without the `rewards`
package).
"""

from __future__ import annotations

import os
import signal

from . import isolation, seccomp_filter

# What Chromium may read besides its own installation: libraries, fonts, locale and time-zone data, ICU, the
# kernel's views of itself; what it may write besides its profile: shared memory and the null and random devices.
_READ_ROOTS = (
    *isolation.SYSTEM_READ_ROOTS,
    "/etc/localtime",
    "/etc/passwd",
    "/etc/nsswitch.conf",
    "/etc/chromium",
    "/proc",
    "/sys",
    "/dev",
)
_WRITE_ROOTS = ("/dev/shm", "/dev/null", "/dev/urandom", "/dev/random")
_LOADER_GLOBS = ("/lib64/ld-linux*.so*", "/lib/ld-linux*.so*", "/lib/*/ld-linux*.so*", "/usr/lib/*/ld-linux*.so*")
_STDERR = os.devnull  # where Chromium's log goes (a file, to debug a browser that does not start)


def landlock_rules(binary: str, profile: str) -> list[tuple[int, int]]:
    """(rights, O_PATH descriptor) per rule, opened in the worker so the child only has to add them.

    Args:
        binary: the browser executable (its directory is its installation).
        profile: the browser's profile directory, the one place besides shared memory it may write.
    """
    install = os.path.dirname(os.path.realpath(binary))
    writable = isolation.FS_ALL & ~isolation.FS_EXECUTE  # make, remove, rename, truncate: a profile, shared memory
    read, execute = isolation.FS_READ, isolation.FS_EXECUTE
    return isolation.landlock_rules(
        [(root, read) for root in _READ_ROOTS]
        + [(install, read | execute)]
        + [(loader, isolation.FS_READ_FILE | execute) for loader in _loaders()]  # exec opens the ELF interpreter
        + [(root, writable) for root in _WRITE_ROOTS]
        + [(profile, writable)]
    )


def _loaders() -> list[str]:
    """The dynamic loaders (ELF interpreters) on this machine, resolved."""
    import glob

    found = {os.path.realpath(p) for pattern in _LOADER_GLOBS for p in glob.glob(pattern)}
    return sorted(p for p in found if os.path.isfile(p))


def spawn(
    cmd: list[str],
    env: dict[str, str],
    cwd: str,
    read_fd: int,
    write_fd: int,
    uid: int | None,
    gid: int | None,
    rules: list[tuple[int, int]] | None,
    abi: int,
    seccomp: bytes | None = None,
) -> int:
    """Forks and execs Chromium, confined (`_confine`), with the DevTools pipe on its fds 3 and 4; returns its pid.

    A plain fork (the worker has no threads), because the pipe must land on fixed descriptors and the confinement
    must go up between fork and exec. A failure before exec is reported back on a close-on-exec pipe and raises
    here: the browser never runs unconfined.

    Args:
        cmd: the browser's command line.
        env: its whole environment.
        cwd: its working directory.
        read_fd: the pipe it reads DevTools commands from (its fd 3).
        write_fd: the pipe it writes DevTools messages to (its fd 4).
        uid: the user it runs as (None: the worker's).
        gid: the group it runs as.
        rules: `landlock_rules` (None: no Landlock); the caller closes them.
        abi: the kernel's Landlock ABI (`isolation.landlock_abi`).
        seccomp: a `seccomp_filter.program` to install last (None: none).

    Raises:
        RuntimeError: The confinement or the exec failed in the child (its reason).
    """
    import fcntl

    report_r, report_w = os.pipe()  # close-on-exec: end of file without a word means exec succeeded
    pid = os.fork()
    if pid == 0:  # ------------------------------------------------------------------ the child; never returns
        try:
            os.close(report_r)
            # Everything we still need goes above 10 first, so that placing the pipe on 3 and 4 clobbers none of it.
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (read_fd, write_fd, report_w)]
            if rules is not None:
                rules = [(access, fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)) for access, fd in rules]
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1):
                os.dup2(devnull, fd)
            os.dup2(os.open(_STDERR, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), 2)
            os.dup2(high[0], 3)  # dup2 clears close-on-exec: these two survive the exec
            os.dup2(high[1], 4)
            keep = {3, 4, high[2], *(fd for _, fd in rules or ())}
            for fd in os.listdir("/proc/self/fd"):
                if int(fd) > 4 and int(fd) not in keep:
                    try:
                        os.close(int(fd))
                    except OSError:
                        pass
            os.setsid()
            os.chdir(cwd)
            _confine(uid, gid, rules, abi, seccomp)
            os.execve(cmd[0], cmd, env)
        except BaseException as e:
            try:
                os.write(high[2] if "high" in locals() else report_w, f"{type(e).__name__}: {e}".encode()[:300])
            finally:
                os._exit(127)
    os.close(report_w)
    with os.fdopen(report_r, "rb") as report:
        failure = report.read()
    if failure:
        os.waitpid(pid, 0)
        raise RuntimeError(failure.decode(errors="replace"))
    return pid


def _confine(
    uid: int | None, gid: int | None, rules: list[tuple[int, int]] | None, abi: int, seccomp: bytes | None = None
) -> None:
    """`nobody` (when root), death with the worker, Landlock, the seccomp filter: in the child, before exec."""
    import ctypes

    libc = isolation.libc()
    parent = os.getppid()
    if uid is not None and gid is not None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)  # real, effective and saved: no way back
    # After the switch: changing credentials clears the parent-death signal.
    if libc.prctl(isolation.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the worker died before the signal was armed
        raise OSError("the worker is gone")
    if rules is not None:
        isolation.landlock_restrict(libc, isolation.landlock_ruleset(libc, abi, rules))
    if seccomp is not None:  # last: it outlives the exec, and Chromium (--no-sandbox) installs no filter of its own
        seccomp_filter.install_program(seccomp)
