"""CAD renders: build123d scripts come out as shaded parts where expected, deterministically; bad scripts and hostile
ones fail with a reason, and the pool keeps rendering.

One warm single-worker pool serves the whole module (the worker imports build123d once, a few seconds).
"""

from __future__ import annotations

import os
import re
import uuid

import pytest
import torch

pytest.importorskip("build123d")

from rewards.render import KINDS, RenderPool, render  # noqa: E402

BOX = "from build123d import *\nresult = Box(10, 10, 10)\n"
CYLINDER = "from build123d import *\nresult = Cylinder(5, 10)\n"
WHITE = [255, 255, 255]
TIMEOUT = 1.0  # seconds per hostile render: the CPU limit is the same, rounded up
SLACK = 3.0  # start-up of the render child, kill and reap, on a loaded two-core machine
PWNED = f"/tmp/mmrl-pwned-cad-{uuid.uuid4().hex}"  # unique, so a leftover file cannot fake a pass


@pytest.fixture(scope="module")
def pool():
    with RenderPool("cad", workers=1) as pool:
        first = pool.render_batch([BOX], 32, timeout=60)[0]  # the worker's start (build123d import) is paid here
        assert first.ok, first.reason
        yield pool
    assert not os.path.exists(PWNED), "a hostile render wrote outside its sandbox"


def draw(pool: RenderPool, script: str, size=64, **options):
    return pool.render_batch([script], size, timeout=30, **options)[0]


def part_mask(image: torch.Tensor) -> torch.Tensor:
    return (image != torch.tensor(WHITE, dtype=torch.uint8)).any(-1)  # [H, W] True where the part is drawn


def test_cad_is_a_render_kind():
    assert "cad" in KINDS


def test_box_is_drawn_centred_and_shaded(pool):
    result = draw(pool, BOX, size=(80, 64))
    assert result.ok, result.reason
    image = result.image
    assert image.dtype == torch.uint8 and image.shape == (64, 80, 3)  # [H, W, 3] for size (W, H)
    mask = part_mask(image)
    assert mask[32, 40] and not mask[0, 0] and not mask[63, 79]  # centred on its bounding box, background around
    rows, cols = mask.any(1).nonzero(), mask.any(0).nonzero()
    assert (
        abs((rows.min() + rows.max()).item() / 2 - 31.5) <= 1 and abs((cols.min() + cols.max()).item() / 2 - 39.5) <= 1
    )
    assert len(image[mask].unique(dim=0)) >= 3  # iso: three faces, three Lambert shades


def test_absolute_scale_puts_the_part_where_it_is(pool):
    script = "from build123d import *\nresult = Pos(25, 0, 0) * Box(10, 10, 10)\n"  # x in [20, 30], z in [-5, 5]
    mask = part_mask(draw(pool, script, size=100, views="front", normalize=False, extent=100.0, supersample=1).image)
    cols, rows = mask.any(0).nonzero().flatten(), mask.any(1).nonzero().flatten()
    assert (cols.min().item(), cols.max().item()) == (70, 79)  # 1 px per unit, origin at the centre
    assert (rows.min().item(), rows.max().item()) == (45, 54)
    # Normalised, the same part fills the view wherever it sits, and a scaled copy draws the same.
    moved = draw(pool, script, views="front").image
    assert torch.equal(moved, draw(pool, BOX, views="front").image)
    assert torch.equal(moved, draw(pool, "from build123d import *\nresult = Box(3, 3, 3)\n", views="front").image)


def test_box_and_cylinder_differ_and_renders_are_deterministic(pool):
    box, cylinder = draw(pool, BOX).image, draw(pool, CYLINDER).image
    assert (box.int() - cylinder.int()).abs().sum() > 1000
    again = pool.render_batch([CYLINDER, CYLINDER], 64, timeout=30)
    assert all(torch.equal(r.image, cylinder) for r in again)


def test_views_tile_the_requested_size(pool):
    result = draw(pool, CYLINDER, size=(128, 96), views=("front", "top", "right", "iso"), background="#000000")
    assert result.ok, result.reason
    image = result.image
    assert image.shape == (96, 128, 3)
    for y, x in ((24, 32), (24, 96), (72, 32), (72, 96)):  # 2 x 2 cells of 64 x 48, a part in each centre
        assert image[y, x].sum() > 0
    top = image[0:48, 64:128]  # a cylinder from above is a disc: its centre lit, its cell's corners background
    assert top[24, 32].sum() > 0 and top[1, 1].tolist() == [0, 0, 0]
    three = draw(pool, CYLINDER, size=64, views=["front", "top", "right"], supersample=1).image
    assert three[32:, 32:].eq(255).all()  # 2 x 2 grid, the last cell empty


def test_which_object_is_drawn(pool):
    cylinder = draw(pool, CYLINDER).image
    last = "from build123d import *\na = Box(10, 10, 10)\nb = Cylinder(5, 10)\nsketch = Circle(2)\n"
    assert torch.equal(draw(pool, last).image, cylinder)  # the last 3-D shape, not the sketch after it
    named = "from build123d import *\npart = Cylinder(5, 10)\nother = Box(10, 10, 10)\n"
    assert torch.equal(draw(pool, named).image, cylinder)  # `part` wins over later shapes
    context = "from build123d import *\nwith BuildPart() as bp:\n    Cylinder(5, 10)\n"
    assert torch.equal(draw(pool, context).image, cylinder)
    builder = "from build123d import *\nwith BuildPart() as bp:\n    Cylinder(5, 10)\nresult = bp\n"
    assert torch.equal(draw(pool, builder).image, cylinder)  # a builder as `result`: its part


def test_compounds_and_shapes_occt_calls_invalid_are_drawn(pool):
    # An assembly-style compound of two parts, and a solid whose shell is open (one face of a box missing):
    # `is_valid` is False for the second (and for a compound holding it), yet it tessellates and is drawn.
    compound = "from build123d import *\nresult = Compound([Box(10, 10, 10), Pos(12, 0, 0) * Cylinder(4, 10)])\n"
    assert draw(pool, compound).ok
    open_box = (
        "from build123d import *\nfaces = list(Box(10, 10, 10).faces())[:5]\n"
        "result = Compound([Solid(Shell(faces)), Pos(15, 0, 0) * Box(4, 4, 4)])\n"
    )
    drawn = draw(pool, open_box)
    assert drawn.ok, drawn.reason
    assert (drawn.image != drawn.image[0, 0]).any(dim=-1).float().mean() > 0.05  # a part covers the view


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("from build123d import *\nresult = Box(1, 1,\n", "SyntaxError"),
        ("x = 1\n", "built no solid"),
        ("from build123d import *\nwith BuildPart() as bp:\n    pass\n", "built no solid"),
        ("from build123d import *\nresult = Circle(3)\n", "has no solid"),
        ("from build123d import *\nresult = Box(1, 1, 1) - Box(2, 2, 2)\n", "has no solid"),
        ("result = 5\n", "`result` is a int"),
        ("from build123d import *\nresult = Box(1, 1, 1)\nraise ValueError('bad dims')\n", "ValueError: bad dims"),
        ("from build123d import *\nresult = fillet(Box(1, 1, 1).edges(), 5)\n", "Failed creating a fillet"),
    ],
)
def test_bad_scripts_give_reasons(pool, script, reason):
    result = draw(pool, script)
    assert result.image is None and re.search(reason, result.reason), result.reason


def test_bad_options_raise_in_the_caller(pool):
    with pytest.raises(TypeError, match="unknown cad render options.*valid"):
        pool.render_batch([BOX], 32, view="iso")
    with pytest.raises(ValueError, match="views must be one of"):
        pool.render_batch([BOX], 32, views=("front", "diagonal"))
    with pytest.raises(ValueError, match="background"):
        render("cad", BOX, 32, background="blue")  # checked before the default pool starts a worker


HOSTILE = {
    "read_passwd": ("print(open('/etc/passwd').read())\n", r"sandbox refused open\('/etc/passwd'\)"),
    "read_outside": (f"open({os.path.abspath(__file__)!r}).read()\n", "sandbox refused open"),
    "write_outside": (f"open('{PWNED}', 'w').write('x')\n", "sandbox refused open.*for writing"),
    "socket": ("import socket\nsocket.create_connection(('127.0.0.1', 1), timeout=1)\n", "sandbox refused socket"),
    "subprocess": ("import subprocess\nsubprocess.run(['touch', '" + PWNED + "'])\n", "sandbox refused subprocess"),
    "os_system": ("import os\nos.system('touch " + PWNED + "')\n", "sandbox refused os.system"),
    "infinite_loop": ("from build123d import *\nwhile True:\n    pass\n", r"timeout|cpu time"),
    "memory_bomb": ("x = bytearray(10 * 1024**3)\n", "memory"),
    "boolean_storm": (  # OCCT busy in C++ until the CPU limit ends it
        "from build123d import *\nresult = Box(1, 1, 1)\nfor i in range(10**6):\n"
        "    result = result - Pos(i * 1e-3, 0, 0) * Sphere(0.01)\n",
        r"timeout|cpu time",
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_scripts_fail_and_the_pool_survives(pool, name):
    script, reason = HOSTILE[name]
    result = pool.render_batch([script], 32, timeout=TIMEOUT)[0]
    assert result.image is None and re.search(reason, result.reason), result.reason
    assert result.seconds < TIMEOUT + SLACK
    assert not os.path.exists(PWNED)
    after = draw(pool, BOX, size=32)
    assert after.ok, after.reason


def test_files_written_by_occt_itself_stay_in_scratch(pool):
    # OCCT writes from C++, which raises no audit event: only Landlock stands between it and the file system.
    if not pool.isolation.get("landlock_abi"):
        pytest.skip("no Landlock on this kernel: file confinement rests on the audit hook alone")
    script = (
        "from build123d import *\n"
        f"written = export_stl(Box(1, 1, 1), {PWNED!r})\n"
        "inside = export_stl(Box(1, 1, 1), 'inside.stl')\n"
        "result = Box(1, 1, 1) if inside and not written else None\n"
    )
    result = draw(pool, script, size=16)
    assert result.ok, result.reason  # the write into scratch worked, the one outside did not
    assert not os.path.exists(PWNED)
