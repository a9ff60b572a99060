"""examples/ecosystem/openai_program_train.py: an OpenAI-SDK two-call program trained with GRPO through
Ludic's server (a real subprocess on loopback, the real ``openai`` package), and it gains (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ecosystem" / "openai_program_train.py"


def _run(out: Path, *args: str, timeout: float) -> tuple[dict, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--output-dir", str(out), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "summary.json").read_text()), proc.stdout


@pytest.mark.slow
def test_openai_program_example_gains_held_out_reward(tmp_path: Path) -> None:
    report, stdout = _run(tmp_path, "--seed", "0", timeout=1200)
    assert report["served_version"] == 40  # the warm start went up at 0, then one publish per RL step
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 41))
    assert all("train/avg_total_reward" in r for r in rows)
    assert "[openai_program] step 40/40" in stdout
    assert "held-out reward, start of RL -> end:" in stdout
    # measured (64 held-out prompts, 40 GRPO steps): seed 0 0.124 -> 0.383, seed 1 0.553 -> 0.879
    assert report["end"] - report["start_of_rl"] >= 0.15
