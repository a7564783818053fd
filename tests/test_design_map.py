"""docs/design.md is the one map of the code: every module it names exists, and every package folder is named in it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("mmrl", "sim", "rewards")


def _sections() -> dict[str, str]:
    """The map's text under each package's heading (`mmrl/`, `sim/`, `rewards/` at the start of a line)."""
    text = (REPO / "docs" / "design.md").read_text()
    block = text.split("## Where things live", 1)[1].split("```", 2)[1]
    sections: dict[str, list[str]] = {}
    current = None
    for line in block.splitlines():
        head = line.split()[0] if line and not line[0].isspace() else None
        if head is not None:
            current = head.rstrip("/") if head.rstrip("/") in PACKAGES else None
        if current is not None:
            sections.setdefault(current, []).append(line)
    return {name: "\n".join(lines) for name, lines in sections.items()}


def test_every_module_the_map_names_exists():
    sections = _sections()
    assert set(sections) == set(PACKAGES)
    missing = []
    for package, text in sections.items():
        files = {path.name for path in (REPO / package).rglob("*.py")}
        missing += [f"{package}: {name}" for name in re.findall(r"\b(\w+\.py)\b", text) if name not in files]
    assert not missing, f"docs/design.md names modules that do not exist: {missing}"


def test_every_package_folder_is_named_in_the_map():
    sections = _sections()
    unnamed = []
    for package in PACKAGES:
        for init in (REPO / package).rglob("__init__.py"):
            folder = init.parent
            if folder != REPO / package and f"{folder.name}/" not in sections[package]:
                unnamed.append(str(folder.relative_to(REPO)))
    assert not unnamed, f"package folders docs/design.md does not name: {unnamed}"
