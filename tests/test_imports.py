"""The import structure: `rewards <- sim <- mmrl`, no circle, and no function-local import of the project's own modules.

Every `.py` file of the three packages is read with `ast` (function bodies and `if TYPE_CHECKING:` blocks included),
relative imports are resolved, and the graph of the project's modules is checked:

* direction: `rewards` imports neither `sim` nor `mmrl`; `sim` does not import `mmrl`;
* no cycle: no two modules reach each other (a package's `__init__` counts as the package, so a submodule that imports
  a name from its own package's `__init__` while that `__init__` imports the submodule is a cycle too);
* no function-local import of a project module: those hide cycles and import-time costs (function-local imports are
  for optional heavy dependencies only), except in the modules of `DEFERRED_IMPORTS` (the command line), whose
  function-local imports still count for the direction and the cycles;
* no private name (`_x`) imported from another project module: what a module shares is public.

An edge `a -> b` is what `a` makes Python execute: `import x.y` and `from x import y` reach module `x.y` when it is
one, else the names of package or module `x`. Ancestor packages are not counted as targets of a submodule's import
(Python is already importing them when the submodule runs).
"""

from __future__ import annotations

import ast
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("rewards", "sim", "mmrl")  # lowest first: each may import only those before it
LAYER = {name: k for k, name in enumerate(PACKAGES)}
# The only modules allowed function-local imports of project modules, each with its reason. Keep it to entry points:
# anywhere else such an import hides an import cost or a cycle from the reader.
DEFERRED_IMPORTS = {
    "mmrl.cli": "the `mmrl` command imports what a command needs when it runs, so `mmrl --help` and the parsing of "
    "arguments take no torch, transformers or simulator import (tests/mmrl/test_cli.py checks it)",
}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module (of the project)
    where: str  # file:line
    local: bool  # inside a function body
    structural: bool = True  # False: an import of an ancestor package (reported only when function-local)


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """`{dotted module name: file}` of every module of `packages` under `root` (a package is its `__init__`)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _local_import_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes that sit inside a function or lambda."""
    local: set[int] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import | ast.ImportFrom) and in_function:
                local.add(id(child))
            visit(child, inside)

    visit(tree, False)
    return local


def import_edges(root: Path, packages: tuple[str, ...]) -> list[Edge]:
    """Every import of a project module by a project module, resolved to the module it executes."""
    modules = module_files(root, packages)
    edges = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        local = _local_import_nodes(tree)
        is_package = path.name == "__init__.py"
        ancestors = {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 1)}
        if is_package:
            ancestors.add(name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    where_from = ".".join(base + ([node.module] if node.module else []))
                else:
                    where_from = node.module or ""
                targets = [f"{where_from}.{a.name}" if f"{where_from}.{a.name}" in modules else where_from
                           for a in node.names]  # fmt: skip
            else:
                continue
            for target in dict.fromkeys(targets):
                while target and target not in modules and "." in target:  # `import a.b.c` of a non-module name
                    target = target.rsplit(".", 1)[0]
                if target not in modules or target == name:
                    continue
                structural = not (
                    target in ancestors
                    and (isinstance(node, ast.Import) or all(f"{target}.{a.name}" in modules for a in node.names))
                )
                where = f"{path.relative_to(root)}:{node.lineno}"
                edges.append(Edge(name, target, where, id(node) in local, structural))
    return edges


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a list of modules."""
    graph: dict[str, list[str]] = {}
    for e in edges:
        if not e.structural:
            continue
        graph.setdefault(e.source, []).append(e.target)
        graph.setdefault(e.target, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            strongconnect(v)
    return found


def describe(component: list[str], edges: list[Edge]) -> str:
    inside = set(component)
    return "\n".join(
        f"  {e.source} -> {e.target}  ({e.where})" for e in edges if e.source in inside and e.target in inside
    )


def check(root: Path, packages: tuple[str, ...], deferred: Collection[str] = ()) -> list[str]:
    """Every violation, one message each (empty: the structure is sound).

    `deferred` names the modules allowed function-local imports of project modules; those imports are still edges
    of the graph, so they may neither point against the direction nor close a cycle.
    """
    layer = {name: k for k, name in enumerate(packages)}
    edges = import_edges(root, packages)
    problems = []
    for e in edges:
        src, dst = e.source.split(".")[0], e.target.split(".")[0]
        if layer[dst] > layer[src]:
            problems.append(f"{e.where}: {e.source} imports {e.target}, against the direction {' <- '.join(packages)}")
        if e.local and e.source not in deferred:
            problems.append(f"{e.where}: function-local import of {e.target} (keep those for optional dependencies)")
    for component in cycles(edges):
        problems.append("import cycle:\n" + describe(component, edges))
    return problems


def private_imports(root: Path, packages: tuple[str, ...]) -> list[str]:
    """`file:line: module imports _name from other` for every private name taken from another project module."""
    problems = []
    for module, path in module_files(root, packages).items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join([*base, node.module] if node.module else base)
            if source.split(".")[0] not in packages or source == module:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    where = f"{path.relative_to(root)}:{node.lineno}"
                    problems.append(f"{where}: {module} imports the private name {alias.name} from {source}")
    return problems


# ---------------------------------------------------------------------------------------------- the project


def test_the_project_imports_in_one_direction_without_cycles_or_hidden_imports():
    problems = check(REPO, PACKAGES, deferred=DEFERRED_IMPORTS)
    assert not problems, "\n".join(problems)


def test_no_module_takes_another_modules_private_names():
    problems = private_imports(REPO, PACKAGES)
    assert not problems, "\n".join(problems)


UPDATE_PATH = ("mmrl.stages.shaping", "mmrl.stages.old_scores", "mmrl.stages.advantages", "mmrl.stages.update")


def test_the_update_path_imports_neither_build_nor_report():
    # The stages after collection take the pieces they step (`mmrl.stages.update.Learner`), not the whole run: the run is
    # built above them and reported above them.
    edges = import_edges(REPO, PACKAGES)
    assert {e.source for e in edges} >= set(UPDATE_PATH)
    wrong = [f"{e.source} -> {e.target} ({e.where})" for e in edges if e.source in UPDATE_PATH
             and e.target in ("mmrl.build", "mmrl.report", "mmrl.trainer")]  # fmt: skip
    assert not wrong, wrong


# mmrl's floors, top first: a module imports only from its own floor or below. The top is the run's assembly and output
# (the loop, the command line, build, report, export); the run's schema and machinery sit below the policy; the pure
# maths, the data that flows and the per-family facts at the bottom.
FLOORS = (
    (
        "mmrl",
        "mmrl.__main__",
        "mmrl.cli",
        "mmrl.trainer",
        "mmrl.build",
        "mmrl.report",
        "mmrl.plots",
        "mmrl.export",
        "mmrl.data_check",
    ),
    ("mmrl.stages",),
    ("mmrl.methods",),
    ("mmrl.policy",),
    ("mmrl.runtime",),
    ("mmrl.algos", "mmrl.types", "mmrl.families"),
)
# Inside the policy package: the shared pieces (interface, LoRA helpers, tokens, vision, sampling) import no kind; the
# engines import no kind; a kind imports no other kind. `mmrl.policy` itself (the registry of kinds) may import all.
POLICY_PARTS = ("mmrl.policy.vlm", "mmrl.policy.flow", "mmrl.policy.engines")
POLICY_MAY_IMPORT = {
    "mmrl.policy.vlm": ("mmrl.policy.engines",),
    "mmrl.policy.flow": (),
    "mmrl.policy.engines": (),
    "": (),  # the shared modules
}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def floor(module: str) -> int:
    """The floor of an mmrl module (0 the top), by its longest matching prefix."""
    best, level = -1, None
    for k, names in enumerate(FLOORS):
        for name in names:
            if (module == name or (name != "mmrl" and _within(module, name))) and len(name) > best:
                best, level = len(name), k
    assert level is not None, f"{module} is on no floor: add it to FLOORS"
    return level


def test_mmrl_folders_import_only_downwards():
    edges = [e for e in import_edges(REPO, ("mmrl",)) if e.structural]
    wrong = [f"{e.source} -> {e.target} ({e.where})" for e in edges if floor(e.target) < floor(e.source)]
    assert not wrong, "\n".join(wrong)


def test_policy_kinds_and_engines_import_no_other_kind():
    edges = [e for e in import_edges(REPO, ("mmrl",)) if e.structural]
    wrong = []
    for e in edges:
        if not _within(e.source, "mmrl.policy") or e.source == "mmrl.policy" or not _within(e.target, "mmrl.policy"):
            continue
        part = next((p for p in POLICY_PARTS if _within(e.source, p)), "")
        target = next((p for p in POLICY_PARTS if _within(e.target, p)), None)
        if target is not None and target != part and target not in POLICY_MAY_IMPORT[part]:
            wrong.append(f"{e.source} -> {e.target} ({e.where})")
        if target is None and e.target == "mmrl.policy":
            wrong.append(f"{e.source} -> {e.target} ({e.where}): the package registers the kinds; import its modules")
    assert not wrong, "\n".join(wrong)


def test_the_family_facts_are_a_leaf():
    # The configuration (mmrl.runtime.conventions) and the policy both read the family table: it imports nothing of
    # mmrl outside its own package, so reading it brings in neither of them.
    edges = [e for e in import_edges(REPO, ("mmrl",)) if _within(e.source, "mmrl.families")]
    assert edges, "the family modules import one another"
    wrong = [f"{e.source} -> {e.target} ({e.where})" for e in edges if not _within(e.target, "mmrl.families")]
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_the_whole_project():
    edges = import_edges(REPO, PACKAGES)
    assert {"mmrl.trainer", "sim.base", "rewards.box"} <= {e.source for e in edges} | {e.target for e in edges}
    assert any(e.source == "mmrl.policy.vlm.policy" and e.target == "mmrl.algos.papo" for e in edges)
    assert any(e.source == "mmrl.algos.objective" and e.target == "mmrl.algos.papo" for e in edges)


# ---------------------------------------------------------------------------------------------- the checker itself


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_checker_passes_a_clean_tree(tmp_path):
    root = _write(tmp_path, {
        "low/__init__.py": "from .a import f\n",
        "low/a.py": "import os\n\ndef f():\n    import json  # an outside module may be local\n",
        "high/__init__.py": "",
        "high/b.py": "from low import f\nfrom . import c\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from low.a import f\n",
        "high/c.py": "import low.a\nimport high\n",
    })  # fmt: skip
    assert check(root, ("low", "high")) == []


def test_checker_catches_a_cycle_through_a_function_and_type_checking(tmp_path):
    root = _write(tmp_path, {
        "low/__init__.py": "",
        "low/a.py": "from .b import g\n",
        "low/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\ndef g():\n    pass\n",
    })  # fmt: skip
    problems = check(root, ("low",))
    assert len(problems) == 1 and "import cycle" in problems[0]
    assert "low.a -> low.b" in problems[0] and "low.b -> low.a" in problems[0] and "low/b.py:3" in problems[0]


def test_checker_catches_a_package_and_its_submodule_importing_each_other(tmp_path):
    root = _write(tmp_path, {
        "low/__init__.py": "REGISTRY = {}\nfrom .a import f\n",
        "low/a.py": "from . import REGISTRY\n\ndef f():\n    pass\n",
    })  # fmt: skip
    problems = check(root, ("low",))
    assert any("import cycle" in p and "low.a -> low" in p for p in problems)


def test_checker_catches_a_function_local_import_and_the_wrong_direction(tmp_path):
    root = _write(tmp_path, {
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from high import b\n",
        "high/__init__.py": "",
        "high/b.py": "def g():\n    import low.a\n    import high\n",
    })  # fmt: skip
    problems = check(root, ("low", "high"))
    assert any("low/a.py:2" in p and "against the direction" in p for p in problems)
    assert any("low/a.py:2" in p and "function-local" in p for p in problems)
    assert any("high/b.py:2" in p and "function-local import of low.a" in p for p in problems)
    assert any("high/b.py:3" in p and "function-local import of high" in p for p in problems)  # its own package


def test_checker_allows_deferred_imports_only_where_named_and_still_sees_their_cycles(tmp_path):
    root = _write(tmp_path, {
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from .b import g\n",
        "low/b.py": "def g():\n    from .a import f\n",
        "low/c.py": "def h():\n    from .d import x\n",
        "low/d.py": "x = 1\n",
    })  # fmt: skip
    problems = check(root, ("low",), deferred={"low.a", "low.c"})
    assert not any("low/a.py" in p and "function-local" in p for p in problems)
    assert not any("low/c.py" in p for p in problems)  # named and acyclic: allowed
    assert any("low/b.py:2" in p and "function-local" in p for p in problems)  # not named: still refused
    assert any("import cycle" in p and "low.a -> low.b" in p for p in problems)  # deferred, but a cycle all the same


def test_checker_catches_a_private_name_taken_from_another_module(tmp_path):
    root = _write(tmp_path, {
        "low/__init__.py": "from .a import public\n",
        "low/a.py": "public = 1\n_secret = 2\n",
        "low/b.py": "from .a import _secret\nfrom low.a import public, _secret as s\nfrom os import _exit\n",
    })  # fmt: skip
    problems = private_imports(root, ("low",))
    assert problems == [
        "low/b.py:1: low.b imports the private name _secret from low.a",
        "low/b.py:2: low.b imports the private name _secret from low.a",
    ]
