"""The package's imports point down its layers and form no cycle.

Read from the source (ast), so every import counts: at module level, under TYPE_CHECKING and
inside functions. From the bottom up:

    errors, version       what every layer may raise or report
    ir                    graphs, ops, kernel Programs
    cpu                   the numpy reference semantics of the IR (the oracle; folding uses it)
    onnx, opt             import/export; the optimizer (independent of each other)
    cuda, testing         the GPU backend; rule checking and fuzzing (independent of each other)
    cache                 optimized programs on disk, shared between processes
    session, ...          what users call: sessions, calibration, the ONNX backend adapter,
                          the package's functions, serving, the mutation fuzzer's
                          trials (which run whole models), the commands, the CLI and
                          `python -m knopt`

A module may import modules of its own package and of lower layers only. A function-local
import is allowed only for an optional part that needs extra packages (`knopt.cuda`: the CUDA
packages; `knopt.testing`: hypothesis; `knopt.serve`: Ray Serve), never to hide a cycle.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).parents[1] / "knopt"
LAYERS: list[set[str]] = [
    {"knopt.errors", "knopt.version"},
    {"knopt.ir"},
    {"knopt.cpu"},
    {"knopt.onnx", "knopt.opt"},
    {"knopt.cuda", "knopt.testing"},
    {"knopt.cache"},
    {"knopt.session"},
    {"knopt.calibrate", "knopt.onnx_backend"},
    {"knopt"},
    {"knopt.serve", "knopt.testing.trial"},
    {"knopt.commands"},
    {"knopt.cli"},
    {"knopt.__main__"},
]
OPTIONAL = ("knopt.cuda", "knopt.testing", "knopt.serve")  # may be imported inside functions


@dataclass(frozen=True)
class Import:
    """One import of a knopt module by a knopt module."""

    source: str
    target: str
    line: int
    local: bool  # inside a function


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _targets(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert node.level == 0, "imports are absolute"
    module = node.module or ""
    # `from knopt.onnx import ops` imports the submodule knopt.onnx.ops.
    found = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in MODULES]
    return found or [module]


def _imports(name: str) -> list[Import]:
    found: list[Import] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                for target in _targets(child):
                    if target == "knopt" or target.startswith("knopt."):
                        found.append(Import(name, target, child.lineno, local))
            inner = local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            visit(child, inner)

    visit(ast.parse(MODULES[name].read_text()), False)
    return found


IMPORTS = [imp for name in MODULES for imp in _imports(name)]


def _unit(module: str) -> str:
    """The layer entry a module belongs to: the longest one that is it or a package above it."""
    entries = [e for layer in LAYERS for e in layer if module == e or module.startswith(e + ".")]
    assert entries, f"{module} is in no layer; add it to LAYERS in {__name__}"
    return max(entries, key=len)


def _layer(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def _where(imp: Import) -> str:
    return f"{MODULES[imp.source].relative_to(ROOT.parent)}:{imp.line} imports {imp.target}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_sits_in_a_layer(name: str) -> None:
    _unit(name)


def test_imports_point_down_the_layers() -> None:
    upward = []
    for imp in IMPORTS:
        source, target = _unit(imp.source), _unit(imp.target)
        if source != target and _layer(target) >= _layer(source):
            upward.append(_where(imp))
    assert not upward, "imports that do not point down a layer:\n" + "\n".join(upward)


def test_only_optional_parts_are_imported_inside_functions() -> None:
    hidden = [_where(imp) for imp in IMPORTS if imp.local and not imp.target.startswith(OPTIONAL)]
    assert not hidden, "function-local imports of required modules:\n" + "\n".join(hidden)


def test_modules_import_no_cycle() -> None:
    graph = nx.DiGraph((imp.source, imp.target) for imp in IMPORTS if imp.target in MODULES)
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        pytest.fail("an import cycle: " + " -> ".join([a for a, _ in cycle] + [cycle[0][0]]))
