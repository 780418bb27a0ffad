"""The package's layout is its architecture: no import cycles, private names stay in their
module, every subpackage ships, and modules stay small enough to read whole."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import networkx as nx
import pytest

#: The checkout's source tree, not the installed copy: CI installs the wheel, not editable.
REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "hipipe_compiler"
#: Modules allowed past MAX_LINES, each one idea that reads best whole (README "Layout").
LONG_MODULES: dict[str, str] = {}
MAX_LINES = 600
#: Which packages may import which: the pipeline's order, downstream may use upstream data
#: but never an upstream pass (design.md: nothing downstream reaches back upstream).
FORBIDDEN = {
    "msccl": ("schedule", "optimizer", "lower", "sim", "training"),
    "mscclpp": ("schedule", "optimizer", "lower", "sim", "training"),
    "schedule": ("optimizer", "lower", "sim", "training"),
    "lower": ("optimizer", "sim", "training"),
    "sim": ("schedule", "optimizer", "lower", "training"),
    "optimizer": ("training",),
}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, package: Path = PACKAGE) -> list[tuple[str, list[str], int]]:
    """(imported module, names, line) of every import of the package in a file, absolute."""
    here = module_name(path, package).split(".")
    base = here if path.name == "__init__.py" else here[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == package.name:
                out.append((target, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == package.name]
    return out


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


MODULES = modules()


def import_cycles(package: Path) -> list[list[str]]:
    """Loops in the graph of module -> module it imports (importing a name from a package
    that is a module of it counts as importing that module; package faces count too)."""
    found = modules(package)
    graph = nx.DiGraph()
    graph.add_nodes_from(found)
    for name, path in found.items():
        for target, names, _line in imports(path, package):
            for candidate in [target, *(f"{target}.{n}" for n in names)]:
                if candidate in found and candidate != name:
                    graph.add_edge(name, candidate)
    return list(nx.simple_cycles(graph))


def test_no_module_imports_itself_around_a_loop():
    cycles = import_cycles(PACKAGE)
    assert not cycles, f"import cycles: {cycles[:3]}"


def test_no_module_imports_its_own_package_face():
    """A module that imported its package's __init__ would load its siblings first."""
    for name, path in MODULES.items():
        package = name.rsplit(".", 1)[0] if path.name != "__init__.py" else None
        for target, _names, line in imports(path):
            assert target != package or package == "hipipe_compiler", f"{path}:{line} imports {target}"


def test_the_cycle_check_finds_a_cycle_through_a_subpackage(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .low import f\n")
    (pkg / "sub" / "low.py").write_text("from ..top import g\n")
    (pkg / "top.py").write_text("from .sub import low\n")
    (pkg / "other.py").write_text("from .top import g\n")
    cycles = import_cycles(pkg)
    assert cycles and all({"pkg.top", "pkg.sub.low"} <= set(c) and "pkg.other" not in c for c in cycles)


def test_private_names_stay_in_their_module():
    for path in PACKAGE.rglob("*.py"):
        for target, names, line in imports(path):
            private = [n for n in names if n.startswith("_") and n != "__version__"]
            assert not private, f"{path.relative_to(REPO)}:{line} imports {private} from {target}"


def within(name: str, package: str) -> bool:
    """Whether a module is the package or inside it (msccl is not mscclpp)."""
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("upstream,downstream", sorted((a, b) for a, bs in FORBIDDEN.items() for b in bs))
def test_arrows_only_point_down_the_pipeline(upstream, downstream):
    for name, path in MODULES.items():
        if within(name, f"hipipe_compiler.{upstream}"):
            for target, _names, line in imports(path):
                assert not within(target, f"hipipe_compiler.{downstream}"), (
                    f"{path.relative_to(REPO)}:{line}: {upstream} must not import {downstream} ({target})")


def test_every_subpackage_ships_in_the_wheel():
    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert on_disk <= declared, f"add to pyproject.toml [tool.setuptools] packages: {sorted(on_disk - declared)}"


def test_modules_are_small_enough_to_read_whole():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert set(long) <= set(LONG_MODULES), f"modules over {MAX_LINES} lines: {long}; split them or say why in LONG_MODULES"
    readme = (REPO / "README.md").read_text()
    for module in LONG_MODULES:
        assert module in readme, f"README's Layout section should say why {module} is long"


def test_only_the_torch_extra_imports_torch():
    """torch is an optional extra: the core must import without it."""
    for name, path in MODULES.items():
        if name.startswith("hipipe_compiler.torch"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            roots = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            assert not any(r.split(".")[0] == "torch" for r in roots), f"{path}:{node.lineno} imports torch"
