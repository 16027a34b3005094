"""The architecture as tests (docs/architecture.md): no import cycle among the project's
modules, counting every import; parts of a size one can read."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_CLASS_LINES = 350
MAX_FUNCTION_LINES = 80


def _scanner():
    spec = importlib.util.spec_from_file_location(
        "import_cycles", ROOT / "scripts/import_cycles.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_no_import_cycle_among_the_projects_modules():
    scan = _scanner()
    graph = scan.import_graph(ROOT)
    assert "sim.kv.manager" in graph and "sim.kv.cascade" in graph["sim.kv.manager"]
    assert scan.cycles(graph) == []


@pytest.mark.parametrize(
    "how",
    [
        "import pkg.a",  # top level
        "def f():\n    from pkg import a",  # lazy
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A",
        "from . import a",  # relative
    ],
)
def test_the_scan_finds_a_cycle_however_it_is_imported(tmp_path, how):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import B\nclass A: ...\n")
    (package / "b.py").write_text(f"{how}\nclass B: ...\n")
    (package / "c.py").write_text("from pkg.a import A\n")  # imports into the cycle, not in it
    scan = _scanner()
    assert scan.cycles(scan.import_graph(tmp_path, ["pkg"])) == [["pkg.a", "pkg.b"]]


def _sizes(kind: type) -> list[tuple[str, int]]:
    found = []
    for path in sorted((ROOT / "sim").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, kind):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]
                found.append((f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", lines))  # type: ignore[attr-defined]
    return found


def test_no_class_in_sim_is_over_350_lines():
    assert [(name, n) for name, n in _sizes(ast.ClassDef) if n > MAX_CLASS_LINES] == []


def test_no_function_in_sim_is_over_80_lines():
    functions = _sizes(ast.FunctionDef) + _sizes(ast.AsyncFunctionDef)
    assert [(name, n) for name, n in functions if n > MAX_FUNCTION_LINES] == []


def test_every_configurable_kv_mode_has_its_rules():
    from sim.config.kv import KV_MODES
    from sim.kv.modes import MODES

    assert sorted(MODES) == sorted(KV_MODES)
    assert all(MODES[name].name == name for name in MODES)
