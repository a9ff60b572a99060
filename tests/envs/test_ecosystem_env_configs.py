"""The verifiers and TextArena example configs pass ``ludic train --dry-run`` (registry, kwargs, held-out env)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "ecosystem"


@pytest.mark.parametrize(
    ("config", "package"),
    [
        ("textarena_tictactoe.toml", "textarena"),
        ("verifiers_echo.toml", "verifiers.v1"),
        ("verifiers_episode.toml", "verifiers.v1"),
    ],
)
@pytest.mark.slow  # a `ludic train --dry-run` process each, importing verifiers or TextArena: 8-19 s
def test_example_config_passes_the_dry_run(config: str, package: str) -> None:
    pytest.importorskip(package)
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES)}
    done = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "train", str(EXAMPLES / config), "--dry-run"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
