"""Every name the README and the docs show is importable from where they show it.

A reader copies `from ludic.training import make_distill` from a page and expects it to work; a name that
moved or was never exported sends them into the source. Three kinds of reference are checked:
- the README's table of pieces: each row's module and the names in backticks beside it;
- dotted paths in backticks (`ludic.training.trainer`, `ludic.inference.vllm.launcher`, `ludic.x.Name`);
- `from ludic... import a, b` lines in the pages' code blocks;
- every preset named in backticks (`make_grpo`, `make_distill`, ...) is importable from `ludic.training`.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOTTED = re.compile(r"`(ludic(?:\.[A-Za-z_]\w*)+)`")
FROM_IMPORT = re.compile(r"^\s*from (ludic[\w.]*) import ([\w, ()]+)$", re.MULTILINE)
TABLE_ROW = re.compile(r"^\| [\w ]+ \| `(ludic[\w.]*)` \| (.+) \|$", re.MULTILINE)
NAME = re.compile(r"`([A-Za-z_]\w*)`")
PRESET = re.compile(r"`(make_[a-z_]+)`")


def _resolves(dotted: str) -> bool:
    """A module path, or a module path followed by attributes of it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _references() -> list[tuple[str, str]]:
    refs: list[tuple[str, str]] = []
    for page in PAGES:
        text = page.read_text()
        where = str(page.relative_to(ROOT))
        refs += [(where, m.group(1)) for m in DOTTED.finditer(text)]
        for module, names in FROM_IMPORT.findall(text):
            refs += [(where, f"{module}.{n.strip()}") for n in names.strip("()").split(",") if n.strip()]
        for module, cells in TABLE_ROW.findall(text):
            refs += [(where, f"{module}.{n}") for n in NAME.findall(cells)]
        refs += [(where, f"ludic.training.{n}") for n in PRESET.findall(text)]
    return sorted(set(refs))


def test_the_pages_name_enough_to_check() -> None:
    # The patterns still find what they are meant to: the README's table alone names over 40 pieces.
    assert len(_references()) > 60


@pytest.mark.parametrize(("page", "dotted"), _references())
def test_name_shown_in_docs_is_importable(page: str, dotted: str) -> None:
    assert _resolves(dotted), f"{page} shows `{dotted}`, which does not import"
