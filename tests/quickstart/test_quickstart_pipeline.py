"""``ludic quickstart --pipeline``: an actor task and the trainer meet in a private Redis stream."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from ludic.cli import main

pytestmark = pytest.mark.integration


def _redis_servers_on(data_dir: Path) -> list[int]:
    """Pids of live processes working in ``data_dir`` (redis-server chdirs to its ``--dir``)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            alive = proc.name.isdigit() and " Z " not in (proc / "stat").read_text()  # not a zombie
            if alive and os.readlink(proc / "cwd") == str(data_dir.resolve()):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_quickstart_pipeline_mode_trains_from_the_stream_within_max_staleness(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "qs"
    argv = ["quickstart", "--pipeline", "--max-staleness", "1", "--steps", "4", "--sft-steps", "2",
            "--eval-episodes", "4", "--eval-every", "0", "--group-size", "4", "--prompts-per-step", "2",
            "--output-dir", str(out), "--no-live"]  # fmt: skip
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    assert [r["train/pipeline/trainer_version"] for r in train_rows] == [0.0, 1.0, 2.0, 3.0]
    assert all(r["train/num_samples"] == 8.0 for r in train_rows)
    assert all(0.0 <= r["train/pipeline/mean_staleness"] <= 1.0 for r in train_rows)
    state = json.loads((out / "checkpoints" / "step_000004" / "trainer_state.json").read_text())
    assert state["metadata"]["batch_source"]["consumed"] >= 32  # the cursor went into the checkpoint
    # ludic train's pipeline mode ran it: its [pipeline] table, its private append-only Redis folder
    table = yaml.safe_load((out / "run_config.yaml").read_text())["pipeline"]
    assert table == {"enabled": True, "actors": 1, "max_staleness": 1, "run_id": "quickstart"}
    assert any((out / "redis").glob("appendonly*"))
    assert _redis_servers_on(out / "redis") == []  # stopped at the end

    # ludic train on it in place resumes from a checkpoint with no optimizer state: a clear refusal,
    # and the private Redis it had started for the run is stopped again
    capsys.readouterr()
    assert main(["train", str(out / "run_config.yaml")]) == 2
    assert "has no optimizer.pt" in capsys.readouterr().err
    assert _redis_servers_on(out / "redis") == []
