"""examples/pipeline_rl/run_local.py with the trainer publishing over shared memory (``--publish shm``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline_rl"
pytestmark = pytest.mark.slow


def test_run_local_publishes_every_step_over_shared_memory(tmp_path):
    """A failed publish would stop the trainer (PublishError): four steps and a clean exit mean four
    updates went through the server's shared buffers."""
    out, scratch = tmp_path / "run", tmp_path / "tmp"
    scratch.mkdir()
    result = subprocess.run(
        [sys.executable, str(EXAMPLE / "run_local.py"), "--actors", "1", "--steps", "4", "--prompts", "1",
         "--group-size", "4", "--output-dir", str(out), "--publish", "shm"],
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TMPDIR": str(scratch)}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    steps = [line.split(":")[0] for line in result.stdout.splitlines() if line.startswith("step ")]
    assert steps == ["step 1", "step 2", "step 3", "step 4"]
    state = json.loads((out / "step_000004" / "trainer_state.json").read_text())
    assert state["metadata"]["batch_source"]["consumed"] >= 16
    assert sorted(p.name for p in scratch.glob("ludic-*")) == []  # its tiny model and Redis directories removed
