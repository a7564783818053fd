"""The kernel layers under the audit hook (issue 53): each escape of the review fails with the hook switched off.

The review switched the audit hook off from inside a render (its verdict was reachable through `gc`, its exit was
the module-global `os._exit`) and then, from chart and CAD code: connected to a UNIX-domain socket on the host and
sent data, left 64 MB System V shared-memory segments behind, and (without the network namespace) sent a UDP packet.
Here the pools run with `audit_hook=False` (the test-only switch: the hook is simply not installed, as good as
switched off) and with both namespaces forced off, so the seccomp filter stands alone; the same attacks on a pool
with the filter off too (`seccomp=False`) show that each attack is real and that each check here would see it get
through. The IPC namespace is checked on its own (filter off). Targets are loopback addresses and socket files this
test makes; every wait is bounded.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap

import pytest

pytest.importorskip("matplotlib")

from rewards.render import RenderPool  # noqa: E402
from rewards.render import seccomp_filter as sf  # noqa: E402
from rewards.render.confine import VIOLATION_EXIT  # noqa: E402
from rewards.render.isolation import ipc_namespace_available  # noqa: E402

pytestmark = pytest.mark.skipif(sf.unavailable() is not None, reason=str(sf.unavailable()))

GOOD_CHART = "import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0])\n"
BOX = "from build123d import *\nresult = Box(10, 10, 10)\n"
TIMEOUT = 10.0
IPC_CREAT, IPC_RMID = 0o1000, 0


# ------------------------------------------------------------------------------------------------ the listeners


@pytest.fixture
def unix_listeners():
    """A stream and a datagram UNIX socket in a folder `nobody` may reach (mode 777), and what arrived on them."""
    folder = tempfile.mkdtemp(prefix="mmrl-kernel-", dir="/tmp")
    os.chmod(folder, 0o755)
    stream_path, dgram_path = os.path.join(folder, "stream.sock"), os.path.join(folder, "dgram.sock")
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stream.bind(stream_path)
    stream.listen(4)
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dgram.bind(dgram_path)
    for path in (stream_path, dgram_path):
        os.chmod(path, 0o777)
    stream.settimeout(0.0)
    dgram.settimeout(0.0)

    def arrived() -> list[bytes]:
        got = []
        for _ in range(8):  # bounded: a few connections at most
            try:
                conn, _ = stream.accept()
            except (BlockingIOError, TimeoutError):
                break
            conn.settimeout(1.0)
            try:
                got.append(conn.recv(64))
            except OSError:
                pass
            conn.close()
        for _ in range(8):
            try:
                got.append(dgram.recv(64))
            except (BlockingIOError, TimeoutError):
                break
        return got

    yield stream_path, dgram_path, arrived
    stream.close()
    dgram.close()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def udp_listener():
    """A UDP socket on 127.0.0.1 and what arrived on it."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.0)

    def arrived() -> list[bytes]:
        got = []
        for _ in range(8):
            try:
                got.append(udp.recv(64))
            except (BlockingIOError, TimeoutError):
                break
        return got

    yield udp.getsockname()[1], arrived
    udp.close()


# -------------------------------------------------------------------------------------------------- the attacks


def unix_attack(stream_path: str, dgram_path: str) -> str:
    """Connects to the stream socket and sends; sends a datagram by path from a socketpair. Says what happened."""
    return textwrap.dedent(f"""
        import socket
        said = []
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            s.connect({stream_path!r})
            s.sendall(b"escaped")
            s.close()
            said.append("stream sent")
        except OSError as e:
            said.append(f"stream errno {{e.errno}}")
        try:
            a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            a.sendto(b"escaped", {dgram_path!r})
            said.append("dgram sent")
        except OSError as e:
            said.append(f"dgram errno {{e.errno}}")
        raise SystemExit(", ".join(said))
    """)


def udp_attack(port: int) -> str:
    return textwrap.dedent(f"""
        import socket
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.sendto(b"escaped", ("127.0.0.1", {port}))
            said = "udp sent"
        except OSError as e:
            said = f"udp errno {{e.errno}}"
        raise SystemExit(said)
    """)


def ipc_attack(key: int) -> str:
    """A 64 MB shared-memory segment (and a semaphore set and a message queue), left behind on purpose."""
    return textwrap.dedent(f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        said = []
        for name, call in (
            ("shm", lambda: libc.shmget({key}, 64 << 20, {IPC_CREAT | 0o666})),
            ("sem", lambda: libc.semget({key}, 1, {IPC_CREAT | 0o666})),
            ("msg", lambda: libc.msgget({key}, {IPC_CREAT | 0o666})),
        ):
            got = call()
            said.append(f"{{name}} {{got}} errno {{ctypes.get_errno() if got < 0 else 0}}")
        raise SystemExit(", ".join(said))
    """)


def host_ipc_keys() -> set[int]:
    """The keys of every System V IPC object in this (the host's) IPC namespace."""
    keys = set()
    for kind in ("shm", "sem", "msg"):
        with open(f"/proc/sysvipc/{kind}") as f:
            next(f)
            keys.update(int(line.split()[0]) for line in f if line.strip())
    return keys


def remove_host_ipc(key: int) -> None:
    """Removes what an attack left behind under `key` (the control case), by id, through libc."""
    libc = ctypes.CDLL(None, use_errno=True)
    for kind, get, ctl in (("shm", "shmget", "shmctl"), ("sem", "semget", "semctl"), ("msg", "msgget", "msgctl")):
        ident = getattr(libc, get)(key, *((0, 0) if kind != "msg" else (0,)))
        if ident >= 0:
            getattr(libc, ctl)(ident, *((0, IPC_RMID) if kind == "sem" else (IPC_RMID, None)))


def fresh_key() -> int:
    return int.from_bytes(os.urandom(3), "big") + 0x4D4D0000  # unlikely to collide with anything on the host


# ------------------------------------------------------------------------------------------------------- pools


def bare_pool(kind: str, *, seccomp: bool = True, ipc_namespace: bool = False) -> RenderPool:
    return RenderPool(kind, 1, audit_hook=False, network_namespace=False, ipc_namespace=ipc_namespace, seccomp=seccomp)


@pytest.fixture(scope="module")
def chart_filtered():
    """Chart workers with the seccomp filter alone: no audit hook, no namespaces."""
    with bare_pool("chart") as pool:
        yield pool


@pytest.fixture(scope="module")
def chart_open():
    """The control: chart workers with neither the filter nor the namespaces nor the hook."""
    with bare_pool("chart", seccomp=False) as pool:
        yield pool


@pytest.fixture(scope="module")
def cad_filtered():
    pytest.importorskip("build123d")
    with bare_pool("cad") as pool:
        yield pool


def render(pool: RenderPool, source: str):
    return pool.render_batch([source], 16, timeout=TIMEOUT)[0]


def good(pool: RenderPool):
    return render(pool, BOX if pool.kind == "cad" else GOOD_CHART)


# ------------------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("kind", ["chart", "cad"])
def test_unix_socket_connection_refused_by_the_filter(kind, unix_listeners, chart_filtered, request):
    pool = chart_filtered if kind == "chart" else request.getfixturevalue("cad_filtered")
    stream_path, dgram_path, arrived = unix_listeners
    result = render(pool, unix_attack(stream_path, dgram_path))
    assert result.reason == "SystemExit: stream errno 1, dgram errno 1", result.reason  # EPERM, both ways
    assert arrived() == []
    assert pool.isolation["seccomp"] is True and not pool.isolation["network_namespace"]
    assert good(pool).ok


@pytest.mark.parametrize("kind", ["chart", "cad"])
def test_sysv_ipc_refused_by_the_filter_and_nothing_outlives_the_render(kind, chart_filtered, request):
    pool = chart_filtered if kind == "chart" else request.getfixturevalue("cad_filtered")
    key = fresh_key()
    result = render(pool, ipc_attack(key))
    assert result.reason == "SystemExit: shm -1 errno 1, sem -1 errno 1, msg -1 errno 1", result.reason
    assert key not in host_ipc_keys()
    assert good(pool).ok


def test_udp_refused_by_the_filter_without_the_network_namespace(chart_filtered, udp_listener):
    port, arrived = udp_listener
    result = render(chart_filtered, udp_attack(port))
    assert result.reason == "SystemExit: udp errno 1", result.reason
    assert arrived() == []


def test_the_attacks_are_real_without_the_filter(chart_open, unix_listeners, udp_listener):
    # The control: the same code on a pool without filter, namespaces or hook gets through, and the checks above
    # would have seen it (this is what the review found before the filter existed).
    stream_path, dgram_path, unix_arrived = unix_listeners
    port, udp_arrived = udp_listener
    assert render(chart_open, unix_attack(stream_path, dgram_path)).reason == "SystemExit: stream sent, dgram sent"
    assert render(chart_open, udp_attack(port)).reason == "SystemExit: udp sent"
    assert sorted(unix_arrived()) == [b"escaped", b"escaped"]
    assert udp_arrived() == [b"escaped"]
    key = fresh_key()
    try:
        result = render(chart_open, ipc_attack(key))
        assert re.fullmatch(r"SystemExit: shm \d+ errno 0, sem \d+ errno 0, msg \d+ errno 0", result.reason)
        assert key in host_ipc_keys()  # it outlived the render
    finally:
        remove_host_ipc(key)
    assert key not in host_ipc_keys()


@pytest.mark.skipif(not ipc_namespace_available(), reason="no IPC namespace here (needs root and unshare)")
def test_the_ipc_namespace_keeps_segments_off_the_host():
    # The namespace on its own (filter off): the segment is made, but in the worker's namespace, and it is gone
    # with the worker; the host's never sees it.
    key = fresh_key()
    with bare_pool("chart", seccomp=False, ipc_namespace=True) as pool:
        result = render(pool, ipc_attack(key))
        assert re.fullmatch(r"SystemExit: shm \d+ errno 0, sem \d+ errno 0, msg \d+ errno 0", result.reason)
        assert key not in host_ipc_keys()
    assert key not in host_ipc_keys()


# ------------------------------------------------------------------------------- the audit hook, harder to unhook

UNHOOK_BY_GC = textwrap.dedent("""
    import gc
    for obj in gc.get_objects():  # the review's way in: the hook's closure, reachable through the collector
        if type(obj).__name__ == "function" and obj.__name__ == "hook" and obj.__closure__:
            for cell in obj.__closure__:
                if callable(cell.cell_contents):
                    cell.cell_contents = lambda *a: ""
    import ctypes  # refused by the hook, allowed by the kernel: only a working hook stops it
    raise SystemExit("unhooked")
""")
UNHOOK_BY_BUILTINS = "import builtins\nbuiltins.any = lambda it: True\nopen('/etc/passwd')\n"


@pytest.fixture(scope="module")
def chart_hooked():
    with RenderPool("chart", 1) as pool:
        yield pool


def test_default_pool_has_every_layer_and_renders_as_without_the_filter(chart_hooked, chart_open):
    with_all, without = good(chart_hooked), good(chart_open)
    isolation = chart_hooked.isolation
    assert isolation["seccomp"] is True and isolation["seccomp_missing"] == ""
    assert isolation["ipc_namespace"] is ipc_namespace_available()
    assert [m for m in isolation["missing"] if "seccomp" in m] == []
    assert with_all.ok and without.ok
    assert with_all.image.equal(without.image)


@pytest.mark.parametrize(
    ("source", "reason"),
    [(UNHOOK_BY_GC, r"sandbox refused gc\.get_objects"), (UNHOOK_BY_BUILTINS, r"sandbox refused open\('/etc/passwd'")],
    ids=["gc", "builtins"],
)
def test_the_audit_hook_cannot_be_switched_off_from_inside(chart_hooked, source, reason):
    result = render(chart_hooked, source)
    assert result.image is None and re.search(reason, result.reason), result.reason
    assert good(chart_hooked).ok


def test_the_hook_exits_through_what_it_captured():
    # Replacing os._exit (and breaking the reporter) does not let the refused operation go on.
    program = textwrap.dedent("""
        import importlib, os, sys, tempfile, types
        # Imported as the worker imports it (rewards/render as a package of its own, no rewards package: no torch).
        package = sys.modules["_mmrl_render"] = types.ModuleType("_mmrl_render")
        package.__path__ = [sys.argv[1]]
        confine = importlib.import_module("_mmrl_render.confine")
        scratch = tempfile.mkdtemp()
        def report(reason):
            raise OSError("result pipe closed")
        confine._install_audit_hook(scratch, [], report)
        os._exit = lambda code: None
        try:
            open("/etc/hostname")
        except OSError:
            pass
        print("went on")
    """)
    render_dir = os.path.dirname(os.path.abspath(sf.__file__))
    done = subprocess.run([sys.executable, "-c", program, render_dir], capture_output=True, text=True, timeout=60)
    assert done.returncode == VIOLATION_EXIT and "went on" not in done.stdout, (done.returncode, done.stderr[-500:])


# ------------------------------------------------------------------------------------------------ the filter itself


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_programs_build_for_both_architectures(arch):
    for rules in (sf.RENDER_CHILD, sf.BROWSER):
        code = sf.program(rules, arch)
        assert len(code) % 8 == 0 and 0 < len(code) // 8 < 4096
        first = [int.from_bytes(code[i : i + 8][4:], "little") for i in range(0, 16, 8)]
        assert first == [4, sf.AUDIT_ARCH[arch]]  # load the architecture, compare it before anything else


def test_filter_in_a_child_refuses_what_it_names_and_allows_the_rest():
    # Directly, in a forked child: the render profile refuses every socket, the browser profile only UDP/raw/packet.
    def probe(rules) -> dict[str, int]:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read)
                sf.install(rules)
                out = {}
                for name, family, kind in (
                    ("unix", socket.AF_UNIX, socket.SOCK_STREAM),
                    ("tcp", socket.AF_INET, socket.SOCK_STREAM),
                    ("udp", socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC),
                    ("udp6", socket.AF_INET6, socket.SOCK_DGRAM),
                    ("packet", 17, socket.SOCK_RAW),
                ):
                    try:
                        socket.socket(family, kind).close()
                        out[name] = 0
                    except OSError as e:
                        out[name] = e.errno
                for name, kind in (("pair_stream", socket.SOCK_STREAM), ("pair_dgram", socket.SOCK_DGRAM)):
                    try:
                        out[name] = 0 if socket.socketpair(socket.AF_UNIX, kind) else 1
                    except OSError as e:
                        out[name] = e.errno
                libc = ctypes.CDLL(None, use_errno=True)
                out["shmget"] = 0 if libc.shmget(0, 4096, 0o600) >= 0 else ctypes.get_errno()
                out["unshare"] = 0 if libc.unshare(0x08000000) == 0 else ctypes.get_errno()
                out["getpid"] = 0 if os.getpid() > 0 else 1
                os.write(write, repr(out).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            text = f.read()
        assert os.waitpid(pid, 0)[1] == 0
        return eval(text)  # noqa: S307 (our own child's dict of ints)

    assert probe(sf.RENDER_CHILD) == {
        "unix": 1, "tcp": 1, "udp": 1, "udp6": 1, "packet": 1, "pair_stream": 0, "pair_dgram": 1, "shmget": 1,
        "unshare": 1, "getpid": 0,
    }  # fmt: skip
    browser = probe(sf.BROWSER)
    assert browser["unix"] == 0 and browser["udp"] == browser["udp6"] == browser["packet"] == 1
    assert browser["shmget"] == browser["unshare"] == 1 and browser["getpid"] == 0


def test_missing_layers_say_what_their_absence_leaves_open():
    from rewards.render.pool import missing_layers

    everything = {"network_namespace": True, "ipc_namespace": True, "seccomp": True, "landlock_abi": 7}
    assert missing_layers("chart", everything) == []
    no_filter = {**everything, "seccomp": False, "seccomp_missing": "the kernel has no seccomp"}
    (said,) = missing_layers("html", no_filter)
    assert "the kernel has no seccomp" in said and "UDP (WebRTC)" in said and "System V IPC" in said
    bare = {"network_namespace": False, "ipc_namespace": False, "seccomp": False, "landlock_abi": 0}
    said = missing_layers("chart", bare)
    assert len(said) == 4 and "Landlock's TCP rule alone" in said[0] and "could outlive a render" in said[1]
