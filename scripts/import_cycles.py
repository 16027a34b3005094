"""Every import between the project's modules, and the cycles among them.

    python scripts/import_cycles.py [ROOT]

Reads each ``.py`` file under the project's packages with :mod:`ast` and counts *every*
import statement: top-level, lazy ones inside functions, and those under ``if
TYPE_CHECKING:``. import-linter's contracts (``lint-imports``, pyproject.toml) check the
layers; this scan checks that no module reaches itself through any chain of imports. Exits
1 and prints each cycle if one exists.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

PACKAGES = ("sim", "policies", "experiments", "validation")


def module_name(root: Path, path: Path) -> str:
    """``sim/kv/manager.py`` -> ``sim.kv.manager``; a package's ``__init__`` is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(
    tree: ast.AST, module: str, is_package: bool, modules: Iterable[str]
) -> Iterable[str]:
    """The ``modules`` each import statement in ``tree`` names: ``from a import b`` is
    ``a.b`` where that is a module (a submodule), else ``a`` (a name ``a`` defines)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = module.split(".")
                package = package if is_package else package[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                name = f"{base}.{alias.name}"
                yield name if name in modules else base


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in its file)."""
    files = {
        module_name(root, path): path
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
    }
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        names = imported_names(tree, module, path.name == "__init__.py", files)
        graph[module] = {name for name in names if name in files and name != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
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

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    graph = import_graph(root)
    found = cycles(graph)
    edges = sum(len(v) for v in graph.values())
    for component in found:
        print("cycle:", " <-> ".join(component))
    print(f"{len(graph)} modules, {edges} imports, {len(found)} cycles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
