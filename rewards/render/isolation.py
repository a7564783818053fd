"""The kernel mechanisms the sandbox's layers are built from: namespaces, the `nobody` user, Landlock.

Two kinds of process put these up: every render child (`rewards.render.confine`) and the html worker's Chromium
(`rewards.render.chromium`); the caller probes the namespaces before it starts a worker (`rewards.render.pool`).
What each of them allows is theirs to say; this module only speaks to the kernel.

Landlock (Linux >= 5.13) is used in three steps, because a render child must open its rules' paths before it gives
up root, and Chromium's are opened in the worker before the fork: `landlock_rules` opens each path once (an
`O_PATH` descriptor), `landlock_ruleset` makes a ruleset of them that handles every right the kernel's ABI knows
(so whatever no rule grants is refused), and `landlock_restrict` applies it to the calling process for good.

Imports only the standard library at the top (the sandbox worker imports it without the `rewards` package);
ctypes and pwd are imported where they are used, so the caller's process loads neither for a namespace probe.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterable
from typing import Any

# linux/landlock.h. The three syscalls have the same numbers on every architecture.
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
FS_READ = FS_READ_FILE | FS_READ_DIR
FS_ALL = (1 << 16) - 1
"""Every file-system right up to ABI 5 (`landlock_ruleset` keeps those the kernel handles)."""
_FS_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV  # what a file can be granted

SYSTEM_READ_ROOTS = (
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
"""What every confined process may read besides its own files: shared libraries (a lazily imported extension module
may need one), fonts and their configuration. Nothing that holds user data."""

PR_SET_PDEATHSIG, PR_SET_KEEPCAPS, PR_SET_NO_NEW_PRIVS = 1, 8, 38
_NOBODY = 65534  # where the user database has no `nobody`

_UNSHARE_WORKS: dict[str, bool] = {}


def network_namespace_available() -> bool:
    """Whether `unshare -n` can start a process in a fresh network namespace here (needs root or CAP_SYS_ADMIN)."""
    return _unshare_works("-n")


def ipc_namespace_available() -> bool:
    """Whether `unshare -i` can start a process with its own System V IPC objects here (root or CAP_SYS_ADMIN)."""
    return _unshare_works("-i")


def _unshare_works(flag: str) -> bool:
    """Whether `unshare <flag> true` succeeds; asked once per process and flag."""
    if flag not in _UNSHARE_WORKS:
        unshare = shutil.which("unshare")
        try:
            ok = (
                unshare is not None
                and subprocess.run([unshare, flag, "true"], capture_output=True, timeout=20).returncode == 0
            )
        except (OSError, subprocess.SubprocessError):
            ok = False
        _UNSHARE_WORKS[flag] = ok
    return _UNSHARE_WORKS[flag]


def nobody() -> tuple[int, int]:
    """(uid, gid) of the user `nobody`, or 65534 twice where the user database has none."""
    import pwd

    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return _NOBODY, _NOBODY


def libc() -> Any:
    """The C library through ctypes, with `errno` kept for `ctypes.get_errno`."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def landlock_abi(lib: Any) -> int:
    """The Landlock ABI version the kernel offers (0: none; 0 off Linux, where the syscall numbers mean other calls).

    Args:
        lib: `libc()`.
    """
    if sys.platform != "linux":
        return 0
    import ctypes

    version = lib.syscall(
        ctypes.c_long(_LANDLOCK_CREATE_RULESET),
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION),
    )
    return max(int(version), 0)


def landlock_handled(abi: int) -> int:
    """The file-system rights a ruleset of ABI `abi` handles: every right that ABI knows."""
    handled = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        handled |= 1 << 13  # refer
    if abi >= 3:
        handled |= FS_TRUNCATE
    if abi >= 5:
        handled |= FS_IOCTL_DEV
    return handled


def landlock_rules(entries: Iterable[tuple[str, int]]) -> list[tuple[int, int]]:
    """Opens the paths of `(path, rights)` entries for a ruleset: `(rights, O_PATH descriptor)` each.

    A path that cannot be opened (absent on this machine) gets no rule, which grants nothing; a file's rights are
    cut to those a file can hold (the kernel refuses directory rights on one). The caller closes the descriptors.
    """
    rules = []
    for path, access in entries:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        rules.append((access if os.path.isdir(path) else access & _FS_FILE_RIGHTS, fd))
    return rules


def landlock_ruleset(lib: Any, abi: int, rules: Iterable[tuple[int, int]]) -> int:
    """A Landlock ruleset (its descriptor) that grants `rules` and refuses the rest.

    It handles every file-system right of `abi`, and from ABI 4 TCP bind and connect (no rule grants them: refused),
    from ABI 6 the scopes (no abstract UNIX socket connection to, nor signal to, a process outside the domain).

    Args:
        lib: `libc()`.
        abi: `landlock_abi(lib)`, at least 1.
        rules: `(rights, O_PATH descriptor)` pairs from `landlock_rules`; rights the ABI does not handle are dropped.

    Raises:
        OSError: The kernel refused the ruleset or one of its rules.
    """
    import ctypes

    handled = landlock_handled(abi)
    if abi >= 6:
        attr, size = struct.pack("<QQQ", handled, 0b11, 0b11), 24
    elif abi >= 4:
        attr, size = struct.pack("<QQ", handled, 0b11), 16
    else:
        attr, size = struct.pack("<Q", handled), 8
    buf = ctypes.create_string_buffer(attr, size)
    ruleset = lib.syscall(ctypes.c_long(_LANDLOCK_CREATE_RULESET), buf, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    for access, fd in rules:
        rule = ctypes.create_string_buffer(struct.pack("<Qi", access & handled, fd), 12)
        if lib.syscall(ctypes.c_long(_LANDLOCK_ADD_RULE), ruleset, _LANDLOCK_RULE_PATH_BENEATH, rule, 0) != 0:
            error = ctypes.get_errno()
            os.close(ruleset)
            raise OSError(error, f"landlock_add_rule failed for {_described(fd)}")
    return ruleset


def landlock_restrict(lib: Any, ruleset: int) -> None:
    """Restricts the calling process, and whatever it forks or executes, to `ruleset` for good; closes it.

    Raises:
        OSError: `PR_SET_NO_NEW_PRIVS` (which Landlock requires of an unprivileged process) or the restriction failed.
    """
    import ctypes

    if lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if lib.syscall(ctypes.c_long(_LANDLOCK_RESTRICT_SELF), ruleset, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(ruleset)


def _described(fd: int) -> str:
    """The path an `O_PATH` descriptor was opened on, for an error message."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"descriptor {fd}"
