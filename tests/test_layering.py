"""The library never imports the quickstart (only the ``ludic quickstart`` command does)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "ludic"
QUICKSTART_COMMAND = SRC / "cli" / "commands.py"  # the sub-command that runs it


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_library_module_imports_the_quickstart() -> None:
    offenders = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if "quickstart" not in path.relative_to(SRC).parts and path != QUICKSTART_COMMAND
        and any(m == "ludic.quickstart" or m.startswith("ludic.quickstart.") for m in _imported_modules(path))
    ]  # fmt: skip
    assert offenders == []


def test_the_registry_names_no_quickstart_module() -> None:
    text = (SRC / "registry" / "__init__.py").read_text(encoding="utf-8")
    assert "ludic.quickstart" not in text
