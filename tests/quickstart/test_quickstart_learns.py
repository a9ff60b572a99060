"""The quickstart's promise: held-out reward rises by >= 0.5 from the start of RL, for 3 seeds, in < 5 min.

Slow (about 2-4 minutes per seed on 2 CPU cores): ``pytest -m slow tests/quickstart``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.quickstart.config import QuickstartConfig
from ludic.quickstart.run import run_quickstart

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quickstart_reward_rises_by_half(seed: int, tmp_path: Path) -> None:
    result = run_quickstart(QuickstartConfig(seed=seed, output_dir=str(tmp_path), live=False))
    assert result.rl_gain >= 0.5, result
    assert result.train_seconds < 300, result
