"""Lazy package exports (PEP 562): a package names its exports, each loaded on first use.

An ``__init__`` that imports every submodule makes ``import ludic.training.trainer`` load the rollout
engine, the pipeline and envs with it; a lazy one keeps each layer's import graph its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, exports: dict[str, tuple[str, str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps a name to (module, attribute);
    any other name is tried as a submodule."""
    namespace = vars(importlib.import_module(package))

    def __getattr__(name: str) -> Any:
        if name in exports:
            module, attribute = exports[name]
            value = getattr(importlib.import_module(module), attribute)
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
