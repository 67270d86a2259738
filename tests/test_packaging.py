"""pyproject.toml declares what knopt imports: a plain `pip install knopt` runs every command
but those of the `cuda` and `serve` extras."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).parents[1]
# What needs an extra: its package, and the command that imports it lazily.
EXTRAS = [ROOT / "knopt" / "cuda", ROOT / "knopt" / "serve", ROOT / "knopt/commands/serve.py"]


def _imported(files: list[Path]) -> set[str]:
    """The top-level names of the modules these files import, at any depth, but knopt's own."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    # google.protobuf comes with onnx (the `google` namespace has several distributions).
    return names - {"knopt", "google"} - set(sys.stdlib_module_names)


def _distributions(modules: set[str]) -> set[str]:
    owners = metadata.packages_distributions()
    return {owners[name][0].lower().replace("_", "-") for name in modules}


def _declared(requirements: list[str]) -> set[str]:
    return {Requirement(text).name.lower().replace("_", "-") for text in requirements}


def test_the_plain_install_has_everything_knopt_imports_outside_its_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    files = [
        path
        for path in (ROOT / "knopt").rglob("*.py")
        if not any(path.is_relative_to(extra) for extra in EXTRAS)
    ]
    needed = _distributions(_imported(files))
    declared = _declared(project["dependencies"])
    assert needed <= declared, sorted(needed - declared)
    assert declared <= needed, f"declared but never imported: {sorted(declared - needed)}"
    assert "hypothesis" in declared  # knopt check-rules and knopt.testing draw with it
