"""examples/ecosystem/textarena_games.py: TextArena games through the textarena env kind learn (slow:
FrozenLake-v0's default run, seed 0, 256 held-out games) and both games' runs work end to end (tiny runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.testing import alone_process_env

pytest.importorskip("textarena")
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "ecosystem" / "textarena_games.py"


def _run(out: Path, *flags: str, timeout: float) -> tuple[dict, str]:
    # The example is one process (no server, no thread) and the only thing computing while the test waits: both
    # cores' threads, as a user runs it (1.45x faster here than one; every held-out move the same, seed 0).
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--output-dir", str(out), *flags],
        capture_output=True, text=True, timeout=timeout, env=alone_process_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "summary.json").read_text()), done.stdout


@pytest.mark.parametrize("game", ["FrozenLake-v0", "TicTacToe-v0"])
@pytest.mark.slow  # the example's process per game: ~13 s each
def test_a_tiny_run_reports_three_evaluations_with_intervals(tmp_path: Path, game: str) -> None:
    report, stdout = _run(
        tmp_path / "run", "--game", game, "--eval-games", "8", "--sft-moves", "16", "--sft-steps", "1",
        "--steps", "1", "--group-size", "2", "--prompts-per-step", "1", timeout=600,
    )  # fmt: skip
    assert report["game"] == game
    for phase in ("before", "start_of_rl", "after_rl"):
        stats = report[phase]
        assert (
            stats["games"] == 8
            and 0.0 <= stats["win_rate_ci95"][0] <= stats["win_rate"] <= stats["win_rate_ci95"][1]
        )
    assert f"{game}, seed 0: win rate on 8 held-out games" in stdout and "after_rl" in stdout


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_frozenlake_default_run_clears_the_start_of_rl_interval(tmp_path: Path) -> None:
    report, stdout = _run(tmp_path / "run", timeout=1790)
    print(json.dumps(report))
    # measured (seed 0, 256 held-out games; docs/ecosystem.md, TextArena): 0.01 [0.00, 0.03] at the start
    # of RL, 0.15 [0.11, 0.20] after 60 GRPO steps: RL alone clears the interval
    start, after = report["start_of_rl"], report["after_rl"]
    assert after["win_rate_ci95"][0] > start["win_rate_ci95"][1], report
    assert "RL alone raised the win rate" in stdout
