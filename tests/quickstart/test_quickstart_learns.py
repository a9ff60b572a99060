"""The quickstart's promise: held-out reward rises by >= 0.5 from the start of RL, for 3 seeds, in < 5 min.

Each seed runs as a user runs it (``ludic quickstart``, its own process with both cores' threads: it is the
only thing computing while the test waits). Slow (about 2-3 minutes per seed on 2 CPU cores):
``pytest -m slow tests/quickstart``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.testing import alone_process_env

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quickstart_reward_rises_by_half(seed: int, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "ludic.cli", "quickstart", "--seed", str(seed), "--no-live",
            "--output-dir", str(tmp_path)]  # fmt: skip
    env = alone_process_env()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=880, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "summary.json").read_text())
    assert result["rl_gain"] >= 0.5, result
    assert result["train_seconds"] < 300, result
