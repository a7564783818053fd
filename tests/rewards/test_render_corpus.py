"""A sample of the real-world render corpus (`rewards.render.corpus`; the whole set: bench/render_corpus.py): no
false refusals, and sandboxed renders pixel-equal to the same rasteriser outside the sandbox."""

from __future__ import annotations

import pytest

pytest.importorskip("cairosvg")
pytest.importorskip("matplotlib")

from rewards.render.corpus import CHART_SCRIPTS, check, matplotlib_svgs, package_svgs  # noqa: E402

SAMPLE_SCRIPTS = ("line_stdlib", "dates", "image_heatmap", "stdlib_network_modules_imported_only")


def assert_clean(results, *, refusals_allowed: bool = False) -> None:
    """No false refusal (a refused input the rasteriser renders outside the sandbox) and every render pixel-equal.
    Installed packages may ship inputs that are not SVG at all (trimesh's `{placeholder}` template): refused inside
    and unrenderable outside, they are true refusals."""
    false = {r.name: r.refused for r in results if r.false_refusal}
    assert not false, false
    if not refusals_allowed:
        assert not [r for r in results if r.refused], {r.name: r.refused for r in results if r.refused}
    assert all(r.equal for r in results if not r.refused), [r.name for r in results if r.equal is False]


def test_svg_files_shipped_in_installed_packages_render_as_outside_the_sandbox():
    files = package_svgs()
    assert len(files) >= 10  # matplotlib's icons at least
    names = sorted(files)[:: max(1, len(files) // 8)]  # about 8, spread over the packages
    assert_clean(check("svg", {n: files[n] for n in names}, size=64), refusals_allowed=True)


def test_a_true_refusal_is_told_from_a_false_one():
    template = '<svg\nwidth="100%"\nviewBox="{min_x} {min_y} {width} {height}"\n{attribs}\n>\n{elements}\n</svg>'
    (result,) = check("svg", {"template.svg": template}, size=32)
    assert result.refused and not result.false_refusal and "not well-formed" in result.refused
    assert result.outside  # cairosvg cannot render it either


def test_svgs_written_by_matplotlib_render_as_outside_the_sandbox():
    svgs = matplotlib_svgs({n: CHART_SCRIPTS[n] for n in SAMPLE_SCRIPTS})
    assert all("<!DOCTYPE svg PUBLIC" in s for s in svgs.values())  # what used to be refused
    assert_clean(check("svg", svgs, size=64))


def test_chart_scripts_render_as_outside_the_sandbox():
    assert_clean(check("chart", {n: CHART_SCRIPTS[n] for n in SAMPLE_SCRIPTS}, size=64))
