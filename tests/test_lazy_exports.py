"""Lazy package exports resolve to what they name, and no export shares a name with a submodule.

A lazy ``__init__`` (``ludic._lazy``) loads an export on first use; but importing a submodule sets the
package attribute of that name to the module, so an export called like one of its package's submodules
(``sft_items`` the function in ``sft_items.py``) would silently become the module.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from ludic._lazy import type_checking_imports

SRC = Path(__file__).resolve().parents[1] / "src"
LAZY_INITS = sorted(p for p in (SRC / "ludic").rglob("__init__.py") if "lazy_exports(__name__)" in p.read_text())


def _package(init: Path) -> str:
    return ".".join(init.parent.relative_to(SRC).parts)


def test_the_lazy_packages_are_found() -> None:
    assert {"ludic.training", "ludic.inference", "ludic.distributed"} <= {_package(p) for p in LAZY_INITS}


@pytest.mark.parametrize("init", LAZY_INITS, ids=_package)
def test_no_export_is_named_like_a_submodule(init: Path) -> None:
    submodules = {p.stem for p in init.parent.glob("*.py")} | {p.name for p in init.parent.iterdir() if p.is_dir()}
    clashes = sorted(set(type_checking_imports(init.read_text())) & submodules)
    assert clashes == [], f"{_package(init)} exports names of its own submodules: {clashes}"


@pytest.mark.parametrize("init", LAZY_INITS, ids=_package)
def test_every_export_loads_and_is_listed(init: Path) -> None:
    package = importlib.import_module(_package(init))
    exports = type_checking_imports(init.read_text())
    assert sorted(exports) == sorted(package.__all__)
    for name, (module, attribute) in exports.items():
        assert getattr(package, name) is getattr(importlib.import_module(module), attribute)
