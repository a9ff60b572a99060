"""Shared fixtures for the code-execution sandbox tests."""

from __future__ import annotations

import shutil
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def code_dir() -> Iterator[Callable[[str], Path]]:
    """Writes solution.py into a directory the sandbox's uid can read (pytest's tmp_path is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="ludic-code-"))
    root.chmod(0o755)

    def write(code: str) -> Path:
        path = root / "solution.py"
        path.write_text(textwrap.dedent(code))
        path.chmod(0o644)
        return root

    yield write
    shutil.rmtree(root)
