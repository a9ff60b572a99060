"""``ludic train`` with ``[pipeline] enabled = true``: actor tasks, a private append-only Redis, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.cli import main

from .run_configs import write_run_config

pytestmark = pytest.mark.integration


def _config(tmp_path: Path, model: Path, steps: int) -> Path:
    return write_run_config(tmp_path, model, steps=steps, eval_episodes=2, tables=f"""
[pipeline]
enabled = true
actors = 2
max_staleness = 1
[checkpoint]
output_dir = "{tmp_path / "out" / "checkpoints"}"
every_n_steps = 2
""")


@pytest.mark.slow
def test_train_pipeline_mode_trains_from_the_stream_and_resumes_at_its_cursor(tmp_path: Path) -> None:
    from ludic.testing import tiny_model_path

    model = tiny_model_path()
    assert main(["train", str(_config(tmp_path, model, steps=2))]) == 0
    out = tmp_path / "out"
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if "train/loss" in x]
    assert [r["train/pipeline/trainer_version"] for r in rows] == [0.0, 1.0]
    assert all(r["train/num_samples"] == 4.0 and r["train/pipeline/mean_staleness"] <= 1 for r in rows)
    first = json.loads((out / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    cursor = first["metadata"]["batch_source"]
    assert (out / "redis" / "appendonly.aof").exists() or any((out / "redis").glob("appendonly*"))

    assert main(["train", str(_config(tmp_path, model, steps=4))]) == 0  # resumes: same stream, same cursor
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if "train/loss" in x]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    last = json.loads((out / "checkpoints" / "step_000004" / "trainer_state.json").read_text())
    state = last["metadata"]["batch_source"]
    assert state["consumed"] >= cursor["consumed"] + 8 and state["last_id"] > cursor["last_id"]
    assert state["counters"].get("pipeline/skipped_duplicate", 0) == 0


def test_pipeline_table_is_checked() -> None:
    from ludic.config.schema import PipelineSection

    with pytest.raises(ValueError, match="actors = 0 needs redis_url"):
        PipelineSection(enabled=True, actors=0)
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        PipelineSection(max_staleness=-1)
