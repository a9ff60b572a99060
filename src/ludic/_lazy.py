"""Lazy package exports (PEP 562): a package's names, each loaded on first use.

An ``__init__`` that imports every submodule makes ``import ludic.training.trainer`` load the rollout
engine, the pipeline and envs with it; a lazy one keeps each layer's import graph its own. A package
lists its exports once, as imports under ``if TYPE_CHECKING:`` (which type checkers and readers follow);
``lazy_exports`` reads that block from the package's source and loads each name when first asked for.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def type_checking_imports(source: str) -> dict[str, tuple[str, str]]:
    """``{exported name: (module, attribute)}`` from the ``if TYPE_CHECKING:`` block(s) of ``source``."""
    exports: dict[str, tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module:
                    exports.update({a.asname or a.name: (stmt.module, a.name) for a in stmt.names})
    return exports


def lazy_exports(package: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``; any other name is tried as a submodule."""
    module = sys.modules[package]
    exports = type_checking_imports(Path(module.__file__ or "").read_text(encoding="utf-8"))
    namespace = vars(module)

    def __getattr__(name: str) -> Any:
        if name in exports:
            source, attribute = exports[name]
            value = getattr(importlib.import_module(source), attribute)
            namespace[name] = value
            return value
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{package}.{name}":
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
