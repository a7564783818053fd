"""Hostile inputs: each one fails with a reason, within its time limit, and the pool keeps rendering afterwards.

Chart code and SVG written to hang, exhaust memory, fork, read or write outside the sandbox, reach the network, or
abuse XML and SVG references. Every case checks three things: `image is None` with the expected reason, the answer
came within the limit, and a good render on the same pool succeeds right after (the worker survived or came back).
The last tests turn the audit hook off and check that the kernel layers (Landlock, RLIMIT_NPROC, the network
namespace) refuse the same operations on their own.
"""

from __future__ import annotations

import os
import re
import uuid

import pytest

pytest.importorskip("cairosvg")
pytest.importorskip("matplotlib")

from rewards.render import RenderPool, render  # noqa: E402
from rewards.render.confine import audit_verdict  # noqa: E402

TIMEOUT = 1.0  # seconds per hostile render: the CPU limit is the same, rounded up
SLACK = 3.0  # start-up of the render child, kill and reap, on a loaded two-core machine
NS = 'xmlns="http://www.w3.org/2000/svg"'
GOOD_SVG = f'<svg {NS} width="8" height="8"><rect width="4" height="8" fill="red"/></svg>'
GOOD_CHART = "import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0])\n"
PWNED = f"/tmp/mmrl-pwned-{uuid.uuid4().hex}"  # unique, so a leftover file cannot fake a pass

CHART_CASES = {
    "infinite_loop": ("while True:\n    pass\n", r"timeout|cpu time"),
    "bytearray_bomb": ("x = bytearray(10**10)\n", "memory"),
    "string_bomb": ("x = 'a' * 10**10\n", "memory"),
    "fork": ("import os\nos.fork()\n", "sandbox refused os.fork"),
    # Modules any script may import (issue 20) whose harmful use is refused by its audit event.
    "multiprocessing": (
        "import multiprocessing\nmultiprocessing.Process(target=print).start()\n",
        r"sandbox refused (os\.fork|os\.posix_spawn|subprocess)",
    ),
    "ssl_socket": (
        "import socket, ssl\nssl.create_default_context().wrap_socket(socket.socket())\n",
        "sandbox refused",
    ),
    "smtplib": ("import smtplib\nsmtplib.SMTP('127.0.0.1', 1, timeout=1)\n", "sandbox refused (smtplib|socket)"),
    "webbrowser": (  # a browser that runs a command (with none registered, open() does nothing at all)
        "import webbrowser\nwebbrowser.GenericBrowser('ls').open('http://127.0.0.1:1/')\n",
        "sandbox refused webbrowser.open",
    ),
    "pty": ("import pty\npty.spawn('ls')\n", "sandbox refused (pty|os)"),
    "asyncio_subprocess": (
        "import asyncio\nasyncio.run(asyncio.create_subprocess_exec('ls'))\n",
        "sandbox refused",
    ),
    "subprocess": ("import subprocess\nsubprocess.run(['ls'])\n", "sandbox refused subprocess.Popen"),
    "os_system": ("import os\nos.system('touch " + PWNED + "')\n", "sandbox refused os.system"),
    "read_passwd": ("print(open('/etc/passwd').read())\n", r"sandbox refused open\('/etc/passwd'\)"),
    "write_outside": (f"open('{PWNED}', 'w').write('x')\n", "sandbox refused open.*for writing"),
    "write_escape": ("open('../../" + PWNED.lstrip("/") + "', 'w')\n", "sandbox refused open.*for writing"),
    "list_root": ("import os\nos.listdir('/')\n", "sandbox refused os.listdir"),
    "network": ("import socket\nsocket.create_connection(('127.0.0.1', 1), timeout=1)\n", "sandbox refused socket"),
    "raw_socket": ("import socket\nsocket.socket()\n", r"sandbox refused socket\.__new__"),
    "ctypes": ("import ctypes\nctypes.CDLL('libc.so.6')\n", "sandbox refused ctypes"),
    "kill_parent": ("import os\nos.kill(os.getppid(), 9)\n", "sandbox refused os.kill"),
    "swallowed_refusal": (  # catching the refusal does not help: the render ends at the refused call
        "import matplotlib.pyplot as plt\ntry:\n    open('/etc/passwd')\nexcept Exception:\n    pass\nplt.plot([1])\n",
        "sandbox refused open",
    ),
    "sleep": ("import time\ntime.sleep(1000)\n", "timeout"),  # burns no CPU: the wall clock ends it
    "close_pipe_and_sleep": ("import os, time\nos.close(3)\ntime.sleep(1000)\n", "timeout"),
    "recursion": ("def f():\n    return f()\nf()\n", "RecursionError"),
    "forged_result": (  # a result frame nested too deep for json: the worker must shrug it off
        "import os, struct\nbody = b'{\"a\": ' + b'[' * 30000 + b']' * 30000 + b'}'\n"
        "os.write(3, struct.pack('>I', len(body)) + body)\nos._exit(0)\n",
        "malformed result",
    ),
    "exit": ("import os\nos._exit(0)\n", "without a result"),
}

_USE_BOMB_DEFS = '<g id="a0"><rect width="1" height="1"/></g>' + "".join(
    f'<g id="a{i}">' + f'<use href="#a{i - 1}"/>' * 10 + "</g>" for i in range(1, 9)
)
SVG_CASES = {
    "billion_laughs": (
        '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">'
        '<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;">]><svg xmlns="http://www.w3.org/2000/svg">&lol3;</svg>',
        "DOCTYPE",
    ),
    "external_entity": (
        '<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'
        '<svg xmlns="http://www.w3.org/2000/svg"><text y="9">&xxe;</text></svg>',
        "DOCTYPE",
    ),
    "undeclared_entity": (f'<svg {NS}><text y="9">&xxe;</text></svg>', "not well-formed"),
    "image_file": (f'<svg {NS}><image href="file:///etc/passwd" width="9" height="9"/></svg>', "external reference"),
    "image_http": (f'<svg {NS}><image href="http://127.0.0.1:1/x.png" width="9" height="9"/></svg>', "external"),
    "image_xlink": (
        f'<svg {NS} xmlns:xlink="http://www.w3.org/1999/xlink"><image xlink:href="/etc/passwd"/></svg>',
        "external reference",
    ),
    "css_import": (f"<svg {NS}><style>@import url(http://127.0.0.1:1/a.css);</style></svg>", "@import"),
    "huge_dimensions": (f'<svg {NS} width="100000000" height="100000000"><rect width="9" height="9"/></svg>', "width"),
    "deep_nesting": (f"<svg {NS}>" + "<g>" * 10_000 + "</g>" * 10_000 + "</svg>", "nested deeper"),
    "oversize": (f"<svg {NS}>" + " " * (2 << 20) + "</svg>", "larger than"),
    "use_bomb": (
        f'<svg {NS} width="9" height="9"><defs>{_USE_BOMB_DEFS}</defs><use href="#a8"/></svg>',
        "timeout|cpu",
    ),
    "self_use": (f'<svg {NS} width="9" height="9"><g id="a"><use href="#a"/></g></svg>', "RecursionError"),
    "pattern_bomb": (
        f'<svg {NS} width="9" height="9"><defs><pattern id="p" width="100000" height="100000" '
        'patternUnits="userSpaceOnUse"><rect width="5" height="5"/></pattern></defs>'
        '<rect width="9" height="9" fill="url(#p)"/></svg>',
        "memory|killed|crashed",
    ),
}


@pytest.fixture(autouse=True, scope="module")
def no_pwned_file():
    yield
    assert not os.path.exists(PWNED), "a hostile render wrote outside its sandbox"


@pytest.mark.parametrize("name", sorted(CHART_CASES))
def test_hostile_chart_code(name):
    source, reason = CHART_CASES[name]
    result = render("chart", source, size=32, timeout=TIMEOUT)
    assert result.image is None
    assert re.search(reason, result.reason), result.reason
    assert result.seconds < TIMEOUT + SLACK
    assert not os.path.exists(PWNED)
    after = render("chart", GOOD_CHART, size=32, timeout=30)
    assert after.ok, after.reason


@pytest.mark.parametrize("name", sorted(SVG_CASES))
def test_hostile_svg(name):
    source, reason = SVG_CASES[name]
    result = render("svg", source, size=32, timeout=TIMEOUT)
    assert result.image is None
    assert re.search(reason, result.reason), result.reason
    assert result.seconds < TIMEOUT + SLACK
    after = render("svg", GOOD_SVG, size=8)
    assert after.ok and after.image[4, 1].tolist() == [255, 0, 0], after.reason


def test_network_refusal_is_the_sandbox_not_the_closed_port():
    result = render("chart", CHART_CASES["network"][0], size=16, timeout=TIMEOUT)
    assert "sandbox refused socket" in result.reason and "Connection refused" not in result.reason


def test_the_audit_hook_follows_links_to_where_they_lead(tmp_path):
    # Paths are resolved before they are compared with the (resolved) roots: a link inside the scratch directory to
    # a file outside is outside, and a read root reached through a link is inside.
    scratch, outside, root = tmp_path / "scratch", tmp_path / "outside", tmp_path / "root"
    for folder in (scratch, outside, root):
        folder.mkdir()
    (outside / "secret").write_text("x")
    (root / "module.py").write_text("x")
    (scratch / "escape").symlink_to(outside, target_is_directory=True)
    (tmp_path / "root-link").symlink_to(root, target_is_directory=True)
    verdict = audit_verdict(str(scratch), [str(root)])
    assert verdict("open", ("escape/secret", "r", os.O_RDONLY)) != ""
    assert verdict("open", (str(scratch / "escape" / "secret"), "r", os.O_RDONLY)) != ""
    assert verdict("open", ("escape/new", "w", os.O_WRONLY | os.O_CREAT)) != ""
    assert verdict("os.listdir", ("escape",)) != ""
    assert verdict("os.mkdir", ("escape/d", 0o777, -1)) != ""
    assert verdict("open", (str(tmp_path / "root-link" / "module.py"), "r", os.O_RDONLY)) == ""
    assert verdict("open", ("plot.png", "wb", os.O_WRONLY | os.O_CREAT)) == ""  # scratch itself stays writable
    assert verdict("open", (str(tmp_path / "root-link" / "new.py"), "w", os.O_WRONLY | os.O_CREAT)) != ""


@pytest.fixture(scope="module")
def bare_pool():
    """A chart pool without the audit hook: only the kernel-enforced layers stand."""
    with RenderPool("chart", workers=1, audit_hook=False) as pool:
        first = pool.render_batch([GOOD_CHART], 16, timeout=30)[0]
        assert first.ok, first.reason
        if not pool.isolation.get("landlock_abi"):
            pytest.skip("no Landlock on this kernel: file confinement rests on the audit hook alone")
        yield pool


KERNEL_CASES = {
    "read_passwd": ("open('/etc/passwd').read()", "PermissionError"),
    "read_repository": (f"open({os.path.abspath(__file__)!r}).read()", "PermissionError"),
    "write_outside": (f"open('{PWNED}', 'w')", "PermissionError"),
    "fork": ("import os\nos.fork()", "BlockingIOError|PermissionError"),
    "subprocess": ("import subprocess\nsubprocess.run(['ls'])", "BlockingIOError|PermissionError"),
    "thread": ("import threading\nthreading.Thread(target=print).start()", "can't start new thread"),
    "network": ("import socket\nsocket.create_connection(('127.0.0.1', 1), timeout=1)", "PermissionError|OSError"),
    "kill_parent": ("import os\nos.kill(os.getppid(), 9)", "PermissionError"),
}


@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_kernel_layers_hold_without_the_audit_hook(bare_pool, name):
    source, reason = KERNEL_CASES[name]
    result = bare_pool.render_batch([source], 16, timeout=TIMEOUT)[0]
    assert result.image is None and re.search(reason, result.reason), result.reason
    assert not os.path.exists(PWNED)
    assert bare_pool.render_batch([GOOD_CHART], 16, timeout=30)[0].ok
