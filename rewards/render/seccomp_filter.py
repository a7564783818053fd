"""A seccomp-bpf filter for the sandbox's render children and its browser: system calls refused by the kernel.

The audit hook (`rewards.render.confine`) sees only what Python audits, and code that switches it off (it is a
Python object in the same process) sees none of it. This filter is the kernel's version of the refusals that matter
most: once installed (after `PR_SET_NO_NEW_PRIVS`), it holds for the process and everything it executes, and nothing
the process does can take it off. A refused call fails with EPERM (the code sees a PermissionError and the render
fails with it); a system call of a foreign architecture (the 32-bit entry on x86_64, x32) kills the process, since
the numbers below would not mean the same thing there.

Two profiles (`RENDER_CHILD`, `BROWSER`), each a list of `Rule`s:

* render children (charts, CAD, SVG) need no socket: `socket` of every family is refused (so no UNIX-domain
  connection to the host's sockets, no UDP, no netlink, no packet sockets), `socketpair` but for a UNIX stream pair,
  and io_uring (it can open and connect sockets without the `socket` system call);
* both refuse System V IPC (`shmget`, `semget`, `msgget` and the calls on their objects: segments would outlive
  the process), POSIX message queues (`mq_open`, also persistent), `ptrace`, `process_vm_readv/writev`, `kexec_*`,
  `mount` and the new mount API, `unshare`, `setns`, `clone` with namespace flags (`clone3`, whose flags the filter
  cannot read, answers ENOSYS, so the C library falls back to `clone`), `bpf`, `perf_event_open`, the key-ring calls,
  `userfaultfd`, module loading, `pidfd_getfd`;
* Chromium needs UNIX-domain sockets (its own IPC) but never UDP, raw or packet sockets here: `BROWSER` refuses
  `socket(AF_INET or AF_INET6, SOCK_DGRAM or SOCK_RAW)`, `AF_PACKET` and io_uring, so WebRTC's STUN packets cannot
  leave even where there is no network namespace (TCP is Landlock's, ABI >= 4).

Imports only the standard library (the worker loads this file by path); ctypes where the filter is installed.
Linux on x86_64 and aarch64 only: elsewhere `unavailable()` says why and nothing is installed.
"""

from __future__ import annotations

import os
import platform
import struct
import sys
from dataclasses import dataclass

# linux/audit.h
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT = 0x40000000

# linux/filter.h, linux/seccomp.h
_BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_BPF_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_BPF_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_BPF_ALU_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
_BPF_RET_K = 0x06  # BPF_RET | BPF_K
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_OFF_NR, _OFF_ARCH, _OFF_ARGS = 0, 4, 16  # struct seccomp_data; args[i] low word at 16 + 8 i (little-endian)
_PR_SET_NO_NEW_PRIVS, _PR_GET_SECCOMP, _PR_SET_SECCOMP = 38, 21, 22
_SECCOMP_MODE_FILTER = 2
_SECCOMP_GET_ACTION_AVAIL = 2
_EPERM, _ENOSYS = 1, 38

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET = 1, 2, 10, 16, 17
SOCK_STREAM, SOCK_DGRAM, SOCK_RAW = 1, 2, 3
_SOCK_TYPE_MASK = 0xF  # the type without SOCK_NONBLOCK / SOCK_CLOEXEC
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80

# The system calls the profiles name, per architecture (asm/unistd_64.h; asm-generic/unistd.h for aarch64).
_SYSCALLS = {
    "x86_64": {
        "socket": 41, "socketpair": 53, "clone": 56, "ptrace": 101,
        "shmget": 29, "shmat": 30, "shmctl": 31, "semget": 64, "semop": 65, "semctl": 66, "shmdt": 67,
        "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "semtimedop": 220,
        "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244,
        "mq_getsetattr": 245,
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
        "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
        "add_key": 248, "request_key": 249, "keyctl": 250, "perf_event_open": 298, "bpf": 321,
        "process_vm_readv": 310, "process_vm_writev": 311, "userfaultfd": 323,
    },
    "aarch64": {
        "socket": 198, "socketpair": 199, "clone": 220, "ptrace": 117,
        "shmget": 194, "shmat": 196, "shmctl": 195, "semget": 190, "semop": 193, "semctl": 191, "shmdt": 197,
        "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "semtimedop": 192,
        "mq_open": 180, "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184,
        "mq_getsetattr": 185,
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
        "add_key": 217, "request_key": 218, "keyctl": 219, "perf_event_open": 241, "bpf": 280,
        "process_vm_readv": 270, "process_vm_writev": 271, "userfaultfd": 282,
    },
}  # fmt: skip
# Numbered alike on every architecture since Linux 5.1 (the unified table from 403 on).
_COMMON = {
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_getfd": 438, "clone3": 435,
    "mount_setattr": 442, "open_tree_attr": 467,
}  # fmt: skip
for _table in _SYSCALLS.values():
    _table.update(_COMMON)
_SECCOMP_SYSCALL = {"x86_64": 317, "aarch64": 277}


@dataclass(frozen=True)
class Rule:
    """Refuse system call `name` with `errno`, always, or only where argument `arg` (masked) is in `values`.

    With `arg` set: the call is refused when `(args[arg] & mask) in values` (the low 32 bits), or, with `negate`,
    when it is not; or, with `any_bit`, when `args[arg] & mask` is non-zero. `also` narrows further: a second
    (arg, mask, values) that must match too.
    """

    name: str
    errno: int = _EPERM
    arg: int | None = None
    mask: int = 0xFFFFFFFF
    values: tuple[int, ...] = ()
    any_bit: bool = False
    negate: bool = False
    also: tuple[int, int, tuple[int, ...]] | None = None


_IPC = (
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd", "msgrcv",
    "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
)  # fmt: skip
_PRIVILEGED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kexec_load", "kexec_file_load", "mount", "umount2",
    "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "open_tree_attr", "unshare", "setns", "bpf", "perf_event_open", "add_key", "request_key", "keyctl",
    "init_module", "finit_module", "delete_module", "userfaultfd", "pidfd_getfd",
)  # fmt: skip
_COMMON_RULES = (
    *(Rule(name) for name in _IPC + _PRIVILEGED),
    Rule("clone", arg=0, mask=_CLONE_NAMESPACES, any_bit=True),
    Rule("clone3", errno=_ENOSYS),
    *(Rule(name) for name in ("io_uring_setup", "io_uring_enter", "io_uring_register")),
)

RENDER_CHILD = (
    Rule("socket"),
    Rule("socketpair", arg=0, values=(AF_UNIX,), negate=True),
    Rule("socketpair", arg=1, mask=_SOCK_TYPE_MASK, values=(SOCK_STREAM,), negate=True),
    *_COMMON_RULES,
)
"""Render children (charts, CAD, SVG): no `socket` at all, and the common refusals. A UNIX stream `socketpair`
stays (asyncio's event loop makes one): a connected stream pair can reach nothing outside (connect and sendto with an
address fail on it), whereas a datagram pair could `sendto` any socket path."""

BROWSER = (
    Rule("socket", arg=0, values=(AF_INET, AF_INET6), also=(1, _SOCK_TYPE_MASK, (SOCK_DGRAM, SOCK_RAW))),
    Rule("socket", arg=0, values=(AF_PACKET,)),
    *_COMMON_RULES,
)
"""Chromium: its UNIX-domain sockets (its IPC) and TCP (refused by Landlock) stay; no UDP, raw or packet sockets."""


def machine() -> str:
    """This machine's architecture as the tables name it ("" where it has none)."""
    name = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name) if sys.platform == "linux" else ""


def unavailable() -> str | None:
    """Why no filter can be installed here, or None when it can (asks the kernel; installs nothing)."""
    arch = machine()
    if arch not in _SYSCALLS:
        return f"seccomp filters are built for Linux on x86_64 and aarch64, not {sys.platform}/{platform.machine()}"
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_GET_SECCOMP, 0, 0, 0, 0) < 0:
        return f"the kernel has no seccomp (prctl(PR_GET_SECCOMP): {os.strerror(ctypes.get_errno())})"
    action = ctypes.c_uint32(_RET_ERRNO)
    found = libc.syscall(
        ctypes.c_long(_SECCOMP_SYSCALL[arch]), ctypes.c_uint(_SECCOMP_GET_ACTION_AVAIL), ctypes.c_uint(0),
        ctypes.byref(action),
    )  # fmt: skip
    if found != 0:
        return f"the kernel's seccomp has no filter mode with errno returns ({os.strerror(ctypes.get_errno())})"
    return None


def program(rules: tuple[Rule, ...], arch: str) -> bytes:
    """The classic-BPF program (struct sock_filter[]) for `rules` on `arch`.

    Layout: check the architecture (anything else is killed), kill x32 numbers on x86_64, then one block per rule
    that falls through to the next rule when it does not match, and allow at the end.
    """
    table = _SYSCALLS[arch]
    # Jump targets are 0 (the next instruction) or a label, resolved once the program is laid out.
    code: list[tuple[int, int | str, int | str, int]] = [
        (_BPF_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_BPF_JEQ_K, 1, 0, AUDIT_ARCH[arch]),
        (_BPF_RET_K, 0, 0, _RET_KILL_PROCESS),
        (_BPF_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if arch == "x86_64":
        code += [(_BPF_JGE_K, 0, 1, _X32_SYSCALL_BIT), (_BPF_RET_K, 0, 0, _RET_KILL_PROCESS)]
    labels: dict[str, int] = {}
    for n, rule in enumerate(rules):
        refuse, skip = f"refuse{n}", f"skip{n}"
        code.append((_BPF_JEQ_K, 0, skip, table[rule.name]))
        conditions = [] if rule.arg is None else [(rule.arg, rule.mask, rule.values, rule.any_bit, rule.negate)]
        if rule.also is not None:
            conditions.append((*rule.also, False, False))
        for arg, mask, values, any_bit, negate in conditions:
            code.append((_BPF_LD_W_ABS, 0, 0, _OFF_ARGS + 8 * arg))
            if any_bit:
                code.append((_BPF_JSET_K, 0, skip, mask))
                continue
            code.append((_BPF_ALU_AND_K, 0, 0, mask))
            if negate:  # any of the values: the rule does not apply; none: on to the next condition
                code += [(_BPF_JEQ_K, skip, 0, value) for value in values]
                continue
            for i, value in enumerate(values):  # any of the values: on to the next condition; none: skip the rule
                last = i == len(values) - 1
                code.append((_BPF_JEQ_K, len(values) - 1 - i, skip if last else 0, value))
        labels[refuse] = len(code)
        code.append((_BPF_RET_K, 0, 0, _RET_ERRNO | (rule.errno & 0xFFFF)))
        labels[skip] = len(code)
        if conditions:  # the accumulator holds an argument now: the next rule compares the number again
            code.append((_BPF_LD_W_ABS, 0, 0, _OFF_NR))
    code.append((_BPF_RET_K, 0, 0, _RET_ALLOW))
    out = []
    for i, (op, jt, jf, k) in enumerate(code):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        if not (0 <= jt < 256 and 0 <= jf < 256):
            raise ValueError("seccomp program: a jump out of range")
        out.append(struct.pack("<HBBI", op, jt, jf, k & 0xFFFFFFFF))
    return b"".join(out)


def install(rules: tuple[Rule, ...]) -> None:
    """Installs the filter on this process (and whatever it forks or executes from now on), or raises OSError.

    Sets `PR_SET_NO_NEW_PRIVS` first (the kernel requires it of a process without CAP_SYS_ADMIN, and it keeps a
    set-uid program from shedding the filter).
    """
    arch = machine()
    if arch not in _SYSCALLS:
        raise OSError(f"no seccomp filter for {sys.platform}/{platform.machine()}")
    install_program(program(rules, arch))


def install_program(code: bytes) -> None:
    """Installs a program made by `program` (see `install`)."""
    Prepared(code).install()


class Prepared:
    """A program with everything its installation needs made beforehand (in the worker), so that a forked child
    only makes the two `prctl` calls."""

    def __init__(self, code: bytes):
        import ctypes

        class _Prog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        self._ctypes = ctypes
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._buf = ctypes.create_string_buffer(code, len(code))
        self._prog = _Prog(len(code) // 8, ctypes.cast(self._buf, ctypes.c_void_p))
        self._ref = ctypes.byref(self._prog)

    def install(self) -> None:
        """Installs the filter on the calling process, or raises OSError."""
        libc = self._libc
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(self._ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, self._ref, 0, 0) != 0:
            raise OSError(self._ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
